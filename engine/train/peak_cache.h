// The CPU peak calibration's cache, ~/.cache/switchyard/peak.json (engine/train/peak.h):
// untrusted like every file the engine reads, so a damaged one is one warning line and a
// new measurement, never an error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace switchyard {

// The cache: key -> GFLOP/s. At most kMaxPeakCacheEntries entries in a file of at most
// kMaxPeakCacheBytes.
inline constexpr int64_t kMaxPeakCacheBytes = int64_t{1} << 20;
inline constexpr size_t kMaxPeakCacheEntries = 64;
using PeakCache = std::map<std::string, double>;

// The cache at `path`: empty when there is none (parse_peak_cache on its text). A file that is not a JSON object of
// {"gflops": positive finite number} entries under at most kMaxPeakCacheEntries keys
// reads as empty, with one warning line naming the file and the field in *warning
// (else "").
PeakCache read_peak_cache(const std::string& path, std::string* warning);
// Writes `cache` to `path` (atomically, making its directory).
absl::Status write_peak_cache(const std::string& path, const PeakCache& cache);

// The cache in `text`, read from `path`: the same rules and warning as read_peak_cache.
PeakCache parse_peak_cache(std::string_view text, const std::string& path, std::string* warning);

}  // namespace switchyard
