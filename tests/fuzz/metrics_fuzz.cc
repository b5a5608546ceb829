// metrics.jsonl as a resumed run reads it back, and as a fresh run checks that the engine
// wrote it before replacing it. The first byte of the input chooses the step the run
// resumes after; the rest is the file.
#include <cstdint>

#include "engine/train/metrics_log.h"
#include "tests/fuzz/fuzz_util.h"

namespace sy = switchyard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string name = "metrics.jsonl";
  const int64_t last_step = data[0];
  const auto text = sy::fuzz::as_text(data + 1, size - 1);
  const auto lines = sy::metrics_lines_up_to(text, last_step, name);
  sy::fuzz::require_clean_refusal(lines.status(), name);
  sy::fuzz::require_clean_refusal(sy::check_written_by_engine(text, name), name);
  return 0;
}
