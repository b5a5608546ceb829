#include "data/hdf5_checks.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/runtime/status_macros.h"

namespace switchyard {
namespace {

// Longer object paths than this are refused rather than fetched.
constexpr ssize_t kMaxObjectPathBytes = 4096;

void prepare_hdf5() {
  silence_hdf5_errors();
  H5PLset_loading_state(0);
}

herr_t refuse_external_link(const char*, const char*, const char*, const char*, unsigned*, hid_t,
                            void*) {
  return -1;
}

const char* link_type_name(H5L_type_t type) {
  switch (type) {
    case H5L_TYPE_SOFT:
      return "a soft link";
    case H5L_TYPE_EXTERNAL:
      return "an external link (to another file)";
    default:
      return "a user-defined link";
  }
}

bool allowed_filter(H5Z_filter_t filter) {
  return filter == H5Z_FILTER_DEFLATE || filter == H5Z_FILTER_SHUFFLE ||
         filter == H5Z_FILTER_FLETCHER32;
}

bool is_deflated(hid_t dcpl) {
  const int filters = H5Pget_nfilters(dcpl);
  for (int i = 0; i < filters; ++i) {
    unsigned flags = 0;
    size_t values = 0;
    if (H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &values, nullptr, 0, nullptr,
                       nullptr) == H5Z_FILTER_DEFLATE)
      return true;
  }
  return false;
}

absl::Status check_filters(hid_t dcpl, const std::string& where) {
  const int filters = H5Pget_nfilters(dcpl);
  if (filters < 0) return absl::DataLossError(absl::StrCat(where, ": unreadable filter pipeline"));
  for (int i = 0; i < filters; ++i) {
    unsigned flags = 0;
    size_t values = 0;
    const H5Z_filter_t filter = H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &values,
                                               nullptr, 0, nullptr, nullptr);
    if (!allowed_filter(filter))
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": uses HDF5 filter ", filter, "; only deflate, shuffle and fletcher32 are read"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> object_path(hid_t object, const std::string& where) {
  const ssize_t length = H5Iget_name(object, nullptr, 0);
  if (length <= 0 || length > kMaxObjectPathBytes)
    return absl::InvalidArgumentError(absl::StrCat(where, ": has no usable object path"));
  std::string name(static_cast<size_t>(length) + 1, '\0');
  if (H5Iget_name(object, name.data(), name.size()) != length)
    return absl::InvalidArgumentError(absl::StrCat(where, ": has no usable object path"));
  name.resize(static_cast<size_t>(length));
  return name;
}

}  // namespace

absl::StatusOr<H5Handle> open_hdf5_file(const std::string& path) {
  prepare_hdf5();
  H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid())
    return absl::DataLossError(
        absl::StrCat(path, ": not a readable HDF5 file (truncated or corrupted?)"));
  return file;
}

absl::StatusOr<H5Handle> open_hdf5_image(std::string_view bytes, const std::string& name) {
  prepare_hdf5();
  const std::string error =
      absl::StrCat(name, ": not a readable HDF5 file (truncated or corrupted?)");
  // An empty image would make the core driver read `name` from disk instead.
  if (bytes.empty()) return absl::DataLossError(error);
  H5Handle access(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (!access.valid() || H5Pset_fapl_core(access.get(), 1 << 16, false) < 0 ||
      H5Pset_file_image(access.get(), const_cast<char*>(bytes.data()), bytes.size()) < 0)
    return absl::ResourceExhaustedError(absl::StrCat(name, ": cannot hold the image in memory"));
  H5Handle file(H5Fopen(name.c_str(), H5F_ACC_RDONLY, access.get()), H5Fclose);
  if (!file.valid()) return absl::DataLossError(error);
  return file;
}

H5Handle no_external_links_access(hid_t access_class) {
  H5Handle access(H5Pcreate(access_class), H5Pclose);
  H5Pset_elink_cb(access.get(), refuse_external_link, nullptr);
  return access;
}

absl::Status check_hard_link(hid_t file, const std::string& name, const std::string& where) {
  const H5Handle access = no_external_links_access(H5P_LINK_ACCESS);
  std::string prefix = name.starts_with('/') ? "/" : "";
  size_t start = prefix.size();
  while (start < name.size()) {
    const size_t end = std::min(name.find('/', start), name.size());
    if (end > start) {
      if (!prefix.empty() && !prefix.ends_with('/')) prefix += '/';
      prefix += name.substr(start, end - start);
      H5L_info_t info;
      if (H5Lget_info(file, prefix.c_str(), &info, access.get()) < 0)
        return absl::InvalidArgumentError(absl::StrCat(where, ": has no object ", prefix));
      if (info.type != H5L_TYPE_HARD)
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": ", prefix, " is ", link_type_name(info.type), ", which the engine refuses"));
    }
    start = end + 1;
  }
  return absl::OkStatus();
}

absl::Status check_plain_hdf5_dataset(hid_t file, hid_t dataset, const std::string& where) {
  SY_ASSIGN_OR_RETURN(const std::string name, object_path(dataset, where));
  SY_RETURN_IF_ERROR(check_hard_link(file, name, where));
  H5Handle dcpl(H5Dget_create_plist(dataset), H5Pclose);
  if (!dcpl.valid())
    return absl::DataLossError(absl::StrCat(where, ": unreadable dataset properties"));
  if (H5Pget_layout(dcpl.get()) == H5D_VIRTUAL)
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": is a virtual dataset (data in other files), which the engine refuses"));
  if (H5Pget_external_count(dcpl.get()) != 0)
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": keeps its data in external files, which the engine refuses"));
  return check_filters(dcpl.get(), where);
}

absl::StatusOr<H5Handle> open_plain_hdf5_dataset(hid_t file, const std::string& name,
                                                 const std::string& where, hid_t access) {
  SY_RETURN_IF_ERROR(check_hard_link(file, name, where));
  H5Handle own_access;
  if (access == H5P_DEFAULT) {
    own_access = no_external_links_access();
    access = own_access.get();
  } else {
    H5Pset_elink_cb(access, refuse_external_link, nullptr);
  }
  H5Handle dataset(H5Dopen2(file, name.c_str(), access), H5Dclose);
  if (!dataset.valid())
    return absl::InvalidArgumentError(absl::StrCat(where, ": is not a readable dataset"));
  SY_RETURN_IF_ERROR(check_plain_hdf5_dataset(file, dataset.get(), where));
  return dataset;
}

int64_t max_hdf5_dataset_bytes(hid_t dataset, int64_t file_bytes) {
  H5Handle dcpl(H5Dget_create_plist(dataset), H5Pclose);
  if (!dcpl.valid() || !is_deflated(dcpl.get())) return file_bytes;
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  return file_bytes > kMax / kMaxDeflateRatio ? kMax : file_bytes * kMaxDeflateRatio;
}

}  // namespace switchyard
