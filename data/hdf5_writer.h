// How the engine has libhdf5 write its HDF5 files (token shards, checkpoint rank files):
// the layout data/hdf5_reader.h reads back without libhdf5. The 1.8 file format
// (superblock 2, version 2 object headers with checksums), compact link and attribute
// storage for groups of up to kMaxHdf5GroupLinks members, and (the writers' part)
// contiguous datasets without filters.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "data/hdf5_handle.h"

namespace switchyard {

inline constexpr int kMaxHdf5GroupLinks = 65535;

struct Hdf5WriteSettings {
  H5Handle file_access;
  H5Handle file_creation;
  H5Handle group_creation;  // for H5Gcreate2 of groups below the root
};
Hdf5WriteSettings hdf5_write_settings();

// H5Fcreate (truncating) with hdf5_write_settings(); an error names `path` and the OS's
// reason.
absl::StatusOr<H5Handle> create_hdf5_file(const std::string& path);

}  // namespace switchyard
