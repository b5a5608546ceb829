// The engine's own HDF5 reader against files libhdf5 writes: what the engine's writers
// produce (data/hdf5_writer.h) reads back exactly; every other layout, every HDF5
// feature that sends a reader to other files, and every damaged byte is one line naming
// the file, never a crash.
#include "data/hdf5_reader.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <functional>

#include "core/runtime/file_util.h"
#include "data/hdf5_writer.h"
#include "tests/data/data_test_util.h"

// libhdf5's own metadata checksum, exported by the library though not declared in its
// public headers: the reference for hdf5_checksum.
extern "C" uint32_t H5_checksum_metadata(const void* data, size_t len, uint32_t initval);

namespace switchyard {
namespace {

using ::switchyard::testing::IsOneLineWith;
using ::switchyard::testing::message_of;
using ::switchyard::testing::ScratchDir;

constexpr hsize_t kCount = 5;
const int32_t kValues[kCount] = {1, -2, 3, -4, 5};

void write_ints(hid_t where, const char* name, hid_t dcpl = H5P_DEFAULT, bool write = true) {
  H5Handle space(H5Screate_simple(1, &kCount, nullptr), H5Sclose);
  H5Handle dataset(
      H5Dcreate2(where, name, H5T_STD_I32LE, space.get(), H5P_DEFAULT, dcpl, H5P_DEFAULT),
      H5Dclose);
  ASSERT_TRUE(dataset.valid()) << name;
  if (!write) return;
  ASSERT_GE(H5Dwrite(dataset.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, kValues), 0);
}

void write_int_attribute(hid_t where, const char* name, int64_t value, hid_t type) {
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle attr(H5Acreate2(where, name, type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  ASSERT_GE(H5Awrite(attr.get(), H5T_NATIVE_INT64, &value), 0);
}

// A file in the engine's layout: "/d" (kValues), root attribute "answer" = 42, plus what
// `add` puts there.
std::string make_file(const ScratchDir& dir, const std::string& name,
                      const std::function<void(hid_t)>& add = [](hid_t) {}) {
  const std::string path = dir / name;
  auto file = create_hdf5_file(path);
  EXPECT_TRUE(file.ok()) << file.status();
  write_ints(file->get(), "d");
  write_int_attribute(file->get(), "answer", 42, H5T_STD_I64LE);
  add(file->get());
  return path;
}

std::string refusal(const std::string& path, const std::string& dataset) {
  auto file = Hdf5File::open(path);
  if (!file.ok()) return message_of(file.status());
  return message_of(file->dataset(dataset).status());
}

std::vector<int32_t> read_ints(const Hdf5File& file, const std::string& name) {
  auto d = file.dataset(name);
  EXPECT_TRUE(d.ok()) << d.status();
  if (!d.ok()) return {};
  EXPECT_EQ(d->type.type_class, Hdf5Type::kInteger);
  EXPECT_EQ(d->type.size, 4);
  std::vector<int32_t> values(static_cast<size_t>(d->num_bytes / 4));
  EXPECT_TRUE(file.read(*d, 0, d->num_bytes, values.data()).ok());
  return values;
}

TEST(Hdf5ReaderTest, ChecksumIsLibhdf5s) {
  std::string bytes;
  for (int n = 0; n < 64; ++n) {
    EXPECT_EQ(hdf5_checksum(bytes), H5_checksum_metadata(bytes.data(), bytes.size(), 0)) << n;
    bytes.push_back(static_cast<char>(n * 37 + 11));
  }
}

TEST(Hdf5ReaderTest, ReadsWhatTheWritersWrite) {
  ScratchDir dir;
  const std::string path = make_file(dir, "ok.h5", [](hid_t file) {
    const Hdf5WriteSettings settings = hdf5_write_settings();
    H5Handle group(H5Gcreate2(file, "g", H5P_DEFAULT, settings.group_creation.get(), H5P_DEFAULT),
                   H5Gclose);
    // More members than libhdf5's default compact limit (8).
    for (int i = 0; i < 40; ++i) write_ints(group.get(), ("m" + std::to_string(i)).c_str());
    const float f[2] = {1.5f, -0.25f};
    const hsize_t two = 2;
    H5Handle space(H5Screate_simple(1, &two, nullptr), H5Sclose);
    H5Handle floats(H5Dcreate2(file, "f", H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT,
                               H5P_DEFAULT),
                    H5Dclose);
    ASSERT_GE(H5Dwrite(floats.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, f), 0);
    const hsize_t zero = 0;
    H5Handle empty_space(H5Screate_simple(1, &zero, nullptr), H5Sclose);
    H5Handle empty(H5Dcreate2(file, "empty", H5T_STD_I64LE, empty_space.get(), H5P_DEFAULT,
                              H5P_DEFAULT, H5P_DEFAULT),
                   H5Dclose);
  });
  auto file = Hdf5File::open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(read_ints(*file, "d"), std::vector<int32_t>(kValues, kValues + kCount));
  EXPECT_EQ(read_ints(*file, "g/m39"), std::vector<int32_t>(kValues, kValues + kCount));
  EXPECT_EQ(read_ints(*file, "/g/m0"), std::vector<int32_t>(kValues, kValues + kCount));
  auto floats = file->dataset("f");
  ASSERT_TRUE(floats.ok()) << floats.status();
  EXPECT_EQ(floats->type.type_class, Hdf5Type::kFloat);
  float f[2];
  ASSERT_TRUE(file->read(*floats, 0, 8, f).ok());
  EXPECT_EQ(f[0], 1.5f);
  EXPECT_EQ(f[1], -0.25f);
  auto empty = file->dataset("empty");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->num_bytes, 0);
  auto answer = file->root_attribute("answer");
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_TRUE(answer->has_value());
  int64_t value = 0;
  std::memcpy(&value, (*answer)->bytes.data(), 8);
  EXPECT_EQ(value, 42);
  EXPECT_FALSE(file->root_attribute("missing")->has_value());
  EXPECT_TRUE(IsOneLineWith(message_of(file->dataset("g/nothing").status()), "/g/nothing: no such"));
  EXPECT_TRUE(IsOneLineWith(message_of(file->dataset("g").status()), "/g: is not a dataset"));
  EXPECT_TRUE(IsOneLineWith(message_of(file->read(*floats, 4, 8, f)), "outside its data"));
}

TEST(Hdf5ReaderTest, RefusesOtherLayoutsAndFeatures) {
  ScratchDir dir;
  silence_hdf5_errors();
  {
    const std::string old = dir / "old.h5";
    H5Handle file(H5Fcreate(old.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    write_ints(file.get(), "d");
    file.reset();
    EXPECT_TRUE(IsOneLineWith(refusal(old, "d"), "HDF5 superblock version 0"));
  }
  const std::string path = make_file(dir, "features.h5", [&](hid_t file) {
    H5Handle chunked(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_chunk(chunked.get(), 1, &kCount);
    write_ints(file, "chunked", chunked.get());
    H5Handle deflated(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_chunk(deflated.get(), 1, &kCount);
    H5Pset_deflate(deflated.get(), 6);
    write_ints(file, "deflated", deflated.get());
    H5Handle external(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_external(external.get(), "/etc/passwd", 0, kCount * 4);
    write_ints(file, "external", external.get(), false);
    write_ints(file, "unwritten", H5P_DEFAULT, false);
    H5Lcreate_soft("/d", file, "soft", H5P_DEFAULT, H5P_DEFAULT);
    H5Lcreate_external("other.h5", "/d", file, "elink", H5P_DEFAULT, H5P_DEFAULT);
    const Hdf5WriteSettings settings = hdf5_write_settings();
    H5Handle dense(H5Gcreate2(file, "dense", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    for (int i = 0; i < 10; ++i) write_ints(dense.get(), ("m" + std::to_string(i)).c_str());
    H5Handle space(H5Screate_simple(1, &kCount, nullptr), H5Sclose);
    H5Handle big_endian(H5Dcreate2(file, "big_endian", H5T_STD_I32BE, space.get(), H5P_DEFAULT,
                                   H5P_DEFAULT, H5P_DEFAULT),
                        H5Dclose);
    H5Handle vlen_type(H5Tvlen_create(H5T_NATIVE_INT), H5Tclose);
    H5Handle vlen(H5Dcreate2(file, "vlen", vlen_type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT,
                             H5P_DEFAULT),
                  H5Dclose);
  });
  EXPECT_TRUE(IsOneLineWith(refusal(path, "chunked"), "/chunked: is stored in chunks"));
  EXPECT_TRUE(IsOneLineWith(refusal(path, "deflated"), "/deflated: uses HDF5 filters"));
  EXPECT_TRUE(IsOneLineWith(refusal(path, "external"), "/external: keeps its data in external"));
  EXPECT_TRUE(IsOneLineWith(refusal(path, "unwritten"), "/unwritten: its 20 bytes of data"));
  EXPECT_TRUE(IsOneLineWith(refusal(path, "soft"), "/soft: is a soft link"));
  EXPECT_TRUE(IsOneLineWith(refusal(path, "elink"), "/elink: is an external link"));
  EXPECT_TRUE(IsOneLineWith(refusal(path, "dense/m0"), "/dense: keeps its links in dense storage"));
  EXPECT_TRUE(IsOneLineWith(refusal(path, "big_endian"), "/big_endian: is a big-endian integer"));
  EXPECT_TRUE(IsOneLineWith(refusal(path, "vlen"), "/vlen: is a variable-length type"));
}

std::string file_bytes(const std::string& path) {
  auto bytes = read_file(path);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.ok() ? *bytes : std::string();
}

// Reads everything make_file wrote; any failure must be one line.
void read_all(std::string_view image) {
  auto file = Hdf5File::open_image(image, "image.h5");
  if (!file.ok()) {
    EXPECT_TRUE(IsOneLineWith(message_of(file.status()), "image.h5"));
    return;
  }
  auto d = file->dataset("d");
  if (d.ok()) {
    std::vector<char> out(static_cast<size_t>(std::min<int64_t>(d->num_bytes, 1 << 20)));
    (void)file->read(*d, 0, static_cast<int64_t>(out.size()), out.data());
  } else {
    EXPECT_TRUE(IsOneLineWith(message_of(d.status()), "image.h5"));
  }
  auto a = file->root_attribute("answer");
  if (!a.ok()) {
    EXPECT_TRUE(IsOneLineWith(message_of(a.status()), "image.h5"));
  }
}

TEST(Hdf5ReaderTest, EveryDamagedByteIsACleanRefusal) {
  ScratchDir dir;
  const std::string good = file_bytes(make_file(dir, "good.h5"));
  ASSERT_GT(good.size(), 100u);
  for (size_t i = 0; i < good.size(); ++i)
    for (const uint8_t mask : {0x01, 0x80, 0xff}) {
      std::string damaged = good;
      damaged[i] = static_cast<char>(damaged[i] ^ mask);
      read_all(damaged);
    }
  for (size_t cut = 0; cut < good.size(); cut += 7) read_all(std::string_view(good).substr(0, cut));
}

TEST(Hdf5ReaderTest, TruncatedFileNamesItsSize) {
  ScratchDir dir;
  const std::string good = file_bytes(make_file(dir, "good.h5"));
  const std::string cut = good.substr(0, good.size() - 10);
  EXPECT_TRUE(IsOneLineWith(message_of(Hdf5File::open_image(cut, "cut.h5").status()), "cut.h5: truncated: its superblock records"));
}

}  // namespace
}  // namespace switchyard
