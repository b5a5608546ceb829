#include "data/hdf5_writer.h"

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "core/runtime/file_util.h"

namespace switchyard {

Hdf5WriteSettings hdf5_write_settings() {
  silence_hdf5_errors();
  Hdf5WriteSettings s{H5Handle(H5Pcreate(H5P_FILE_ACCESS), H5Pclose),
                      H5Handle(H5Pcreate(H5P_FILE_CREATE), H5Pclose),
                      H5Handle(H5Pcreate(H5P_GROUP_CREATE), H5Pclose)};
  H5Pset_libver_bounds(s.file_access.get(), H5F_LIBVER_V18, H5F_LIBVER_V18);
  for (const hid_t list : {s.file_creation.get(), s.group_creation.get()}) {
    H5Pset_link_phase_change(list, kMaxHdf5GroupLinks, kMaxHdf5GroupLinks);
    H5Pset_attr_phase_change(list, kMaxHdf5GroupLinks, kMaxHdf5GroupLinks);
    H5Pset_obj_track_times(list, false);  // the same data makes the same bytes
  }
  return s;
}

absl::StatusOr<H5Handle> create_hdf5_file(const std::string& path) {
  const Hdf5WriteSettings settings = hdf5_write_settings();
  errno = 0;  // libhdf5's file driver leaves the OS's reason in errno
  H5Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, settings.file_creation.get(),
                          settings.file_access.get()),
                H5Fclose);
  if (!file.valid())
    return absl::PermissionDeniedError(absl::StrCat(path, ": cannot create: ", errno_reason()));
  return file;
}

}  // namespace switchyard
