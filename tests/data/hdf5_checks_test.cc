// The HDF5 features every reader refuses: data in other files (external storage,
// external links, virtual datasets), soft links, and filters outside deflate, shuffle
// and fletcher32. Each refusal is one line naming the file.
#include "data/hdf5_checks.h"

#include <gtest/gtest.h>

#include "tests/data/data_test_util.h"

namespace switchyard {
namespace {

using ::switchyard::testing::IsOneLineWith;
using ::switchyard::testing::message_of;
using ::switchyard::testing::ScratchDir;

constexpr hsize_t kCount = 4;

// Creates `name` in `file`: kCount int32 values with the given creation properties,
// written unless the data live elsewhere.
void make_dataset(hid_t file, const char* name, hid_t dcpl = H5P_DEFAULT, bool write = true) {
  H5Handle space(H5Screate_simple(1, &kCount, nullptr), H5Sclose);
  H5Handle dataset(
      H5Dcreate2(file, name, H5T_STD_I32LE, space.get(), H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose);
  ASSERT_TRUE(dataset.valid()) << name;
  const int32_t values[kCount] = {1, 2, 3, 4};
  if (!write) return;
  ASSERT_GE(H5Dwrite(dataset.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, values), 0);
}

// A file holding the plain dataset "/d" plus whatever `add` puts there.
template <typename Add>
std::string make_file(const ScratchDir& dir, const std::string& name, Add add) {
  silence_hdf5_errors();
  const std::string path = dir / name;
  H5Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  make_dataset(file.get(), "d");
  add(file.get());
  return path;
}

std::string refusal(const std::string& path, const std::string& dataset) {
  auto file = open_hdf5_file(path);
  if (!file.ok()) return message_of(file.status());
  return message_of(open_plain_hdf5_dataset(file->get(), dataset, path + ": " + dataset).status());
}

TEST(Hdf5ChecksTest, PlainDatasetsOpen) {
  ScratchDir dir;
  const std::string path = make_file(dir, "plain.h5", [](hid_t file) {
    H5Handle group(H5Gcreate2(file, "g", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    make_dataset(group.get(), "d");
    H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_chunk(dcpl.get(), 1, &kCount);
    H5Pset_shuffle(dcpl.get());
    H5Pset_deflate(dcpl.get(), 6);
    make_dataset(file, "z", dcpl.get());
  });
  auto file = open_hdf5_file(path);
  ASSERT_TRUE(file.ok()) << file.status();
  for (const char* name : {"d", "/d", "/g/d", "g/d", "z"}) {
    auto dataset = open_plain_hdf5_dataset(file->get(), name, name);
    ASSERT_TRUE(dataset.ok()) << dataset.status();
  }
  const int64_t bytes = static_cast<int64_t>(std::filesystem::file_size(path));
  EXPECT_EQ(max_hdf5_dataset_bytes(open_plain_hdf5_dataset(file->get(), "d", "d")->get(), bytes),
            bytes);
  EXPECT_EQ(max_hdf5_dataset_bytes(open_plain_hdf5_dataset(file->get(), "z", "z")->get(), bytes),
            bytes * kMaxDeflateRatio);
}

TEST(Hdf5ChecksTest, ExternalStorageIsRefused) {
  ScratchDir dir;
  testing::write_text(dir / "outside.bin", std::string(16, 'x'));
  const std::string path = make_file(dir, "f.h5", [&](hid_t file) {
    H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_external(dcpl.get(), (dir / "outside.bin").c_str(), 0, 16);
    make_dataset(file, "x", dcpl.get(), false);
  });
  EXPECT_TRUE(IsOneLineWith(refusal(path, "x"), path + ": x: keeps its data in external files"));
}

TEST(Hdf5ChecksTest, ExternalAndSoftLinksAreRefused) {
  ScratchDir dir;
  const std::string other = make_file(dir, "other.h5", [](hid_t) {});
  const std::string path = make_file(dir, "f.h5", [&](hid_t file) {
    H5Lcreate_external(other.c_str(), "/d", file, "e", H5P_DEFAULT, H5P_DEFAULT);
    H5Lcreate_external(other.c_str(), "/", file, "eg", H5P_DEFAULT, H5P_DEFAULT);
    H5Lcreate_soft("/d", file, "s", H5P_DEFAULT, H5P_DEFAULT);
  });
  EXPECT_TRUE(IsOneLineWith(refusal(path, "e"), "e is an external link"));
  EXPECT_TRUE(IsOneLineWith(refusal(path, "/eg/d"), "/eg is an external link"));
  EXPECT_TRUE(IsOneLineWith(refusal(path, "s"), "s is a soft link"));
  EXPECT_TRUE(IsOneLineWith(refusal(path, "missing"), "has no object missing"));
  // A dataset opened by other means through a soft link is caught too.
  auto file = open_hdf5_file(path);
  H5Handle dataset(H5Dopen2(file->get(), "s", H5P_DEFAULT), H5Dclose);
  ASSERT_TRUE(dataset.valid());
  EXPECT_TRUE(IsOneLineWith(message_of(check_plain_hdf5_dataset(file->get(), dataset.get(), path)),
                            "/s is a soft link"));
}

TEST(Hdf5ChecksTest, VirtualDatasetsAreRefused) {
  ScratchDir dir;
  const std::string source = make_file(dir, "source.h5", [](hid_t) {});
  const std::string path = make_file(dir, "f.h5", [&](hid_t file) {
    H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Handle space(H5Screate_simple(1, &kCount, nullptr), H5Sclose);
    H5Pset_virtual(dcpl.get(), space.get(), source.c_str(), "/d", space.get());
    make_dataset(file, "v", dcpl.get(), false);
  });
  EXPECT_TRUE(IsOneLineWith(refusal(path, "v"), "v: is a virtual dataset"));
}

TEST(Hdf5ChecksTest, UnknownFiltersAreRefused) {
  ScratchDir dir;
  const std::string path = make_file(dir, "f.h5", [](hid_t file) {
    H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_chunk(dcpl.get(), 1, &kCount);
    H5Pset_filter(dcpl.get(), 32000, H5Z_FLAG_OPTIONAL, 0, nullptr);
    make_dataset(file, "p", dcpl.get());
  });
  EXPECT_TRUE(IsOneLineWith(refusal(path, "p"), "uses HDF5 filter 32000"));
}

TEST(Hdf5ChecksTest, ImagesOpenFromMemory) {
  ScratchDir dir;
  const std::string bytes = testing::read_text(make_file(dir, "f.h5", [](hid_t) {}));
  auto file = open_hdf5_image(bytes, "image.h5");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(open_plain_hdf5_dataset(file->get(), "d", "d").ok());
  EXPECT_TRUE(IsOneLineWith(message_of(open_hdf5_image("", "empty.h5").status()),
                            "empty.h5: not a readable HDF5 file"));
  EXPECT_TRUE(IsOneLineWith(message_of(open_hdf5_image(bytes.substr(0, 100), "cut.h5").status()),
                            "cut.h5: not a readable HDF5 file"));
}

}  // namespace
}  // namespace switchyard
