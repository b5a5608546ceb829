// Shard checksums, verified once per version of a file. Hashing a large dataset at every
// open costs seconds per gigabyte (docs/data.md), so a match is remembered as a verdict
// file in a cache directory outside the dataset, named by a digest of the file's
// identity and version (device, inode, size, mtime and ctime in nanoseconds) and of the
// expected sha256. Any write to the file changes its ctime, which no user-space call can
// set back, so a remembered verdict never covers changed bytes written through the
// filesystem.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace switchyard {

// The default verdict directory: <default_dataset_cache_dir()>/verified-shards.
std::string default_verdict_cache_dir();

// Refuses `path` unless its sha256 is `expected_sha256` (the digest its dataset index
// records). With a `cache_dir`, a verdict found there skips the hash and a match
// is recorded; the cache is best effort (an unwritable one only costs the next hash).
absl::Status verify_file_sha256(const std::string& path, const std::string& expected_sha256,
                                const std::string& cache_dir);

}  // namespace switchyard
