// main() of gpu_op_table_test: the op table's checks where a GPU is, exit 77 (skipped)
// where none is.
#include "tests/gpu/gpu_test_util.h"

int main(int argc, char** argv) { return switchyard::testing::run_gpu_tests(argc, argv); }
