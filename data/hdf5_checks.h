// The HDF5 features the engine refuses in files it reads, shared by every HDF5 reader
// (token shards, checkpoints). A file is read only from itself: external storage,
// external links, soft links and virtual datasets, which send HDF5 to other files or
// other objects, are refused; so are filters other than deflate, shuffle and fletcher32,
// and HDF5's loading of filter plugins is switched off.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "data/hdf5_handle.h"

namespace switchyard {

// The most a deflated dataset can expand (deflate's own limit is about 1032 to 1).
inline constexpr int64_t kMaxDeflateRatio = 1032;

// Opens an HDF5 file read-only, or an in-memory image of one (copied; `name` names it
// in errors). The caller checks first that `path` is a regular file.
absl::StatusOr<H5Handle> open_hdf5_file(const std::string& path);
absl::StatusOr<H5Handle> open_hdf5_image(std::string_view bytes, const std::string& name);

// A dataset (or group) access list on which HDF5 refuses to traverse external links;
// H5Dopen2 and H5Gopen2 take it.
H5Handle no_external_links_access(hid_t access_class = H5P_DATASET_ACCESS);

// An error unless every component of `name` ("/a/b" or "b"), a path inside `file`, is
// a hard link. `where` starts the error ("shard.h5").
absl::Status check_hard_link(hid_t file, const std::string& name, const std::string& where);

// An error naming `where` when the open `dataset` was reached through anything but hard
// links, stores its data in other files (external storage, virtual layout) or uses a
// filter other than deflate, shuffle and fletcher32.
absl::Status check_plain_hdf5_dataset(hid_t file, hid_t dataset, const std::string& where);

// check_hard_link, then H5Dopen2 with external links refused (on `access`, a dataset
// access list, when given), then check_plain_hdf5_dataset.
absl::StatusOr<H5Handle> open_plain_hdf5_dataset(hid_t file, const std::string& name,
                                                 const std::string& where,
                                                 hid_t access = H5P_DEFAULT);

// The most bytes of data `dataset` can hold in a file of `file_bytes` bytes: the file
// size, times kMaxDeflateRatio when the data are deflated.
int64_t max_hdf5_dataset_bytes(hid_t dataset, int64_t file_bytes);

}  // namespace switchyard
