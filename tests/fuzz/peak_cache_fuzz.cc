// The CPU peak calibration's cache (~/.cache/switchyard/peak.json): any text reads as a
// cache of positive finite GFLOP/s figures, or as an empty one with one warning line
// naming the file.
#include <cmath>
#include <cstdint>

#include "engine/train/peak_cache.h"
#include "tests/fuzz/fuzz_util.h"

namespace sy = switchyard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string name = "peak.json";
  std::string warning;
  const sy::PeakCache cache = sy::parse_peak_cache(sy::fuzz::as_text(data, size), name, &warning);
  if (!warning.empty())
    sy::fuzz::require_clean_refusal(absl::InvalidArgumentError(warning), name);
  if (cache.size() > sy::kMaxPeakCacheEntries) __builtin_trap();
  for (const auto& [key, gflops] : cache)
    if (!std::isfinite(gflops) || gflops <= 0) __builtin_trap();
  return 0;
}
