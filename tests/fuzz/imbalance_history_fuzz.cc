// metrics.jsonl as `bench balance --run-dir` reads each layer's imbalance over training.
#include <cstdint>

#include "engine/train/balance_history.h"
#include "tests/fuzz/fuzz_util.h"

namespace sy = switchyard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string name = "metrics.jsonl";
  const auto history = sy::read_imbalance_history(sy::fuzz::as_text(data, size), name);
  sy::fuzz::require_clean_refusal(history.status(), name);
  return 0;
}
