// TensorBoard event files: CRC32C and its mask against known vectors, record framing
// read back from a written file, and the Event protos in it (the PNG encoder has its own
// tests in png_test.cc).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/train/png.h"
#include "engine/train/tensorboard_event.pb.h"
#include "engine/train/tensorboard_writer.h"

namespace switchyard {
namespace {

namespace fs = std::filesystem;
using tensorboard::crc32c;
using tensorboard::crc32c_extend;
using tensorboard::mask_crc;
using tensorboard::unmask_crc;

fs::path fresh_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() /
                 ("sy_tb_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(dir);
  return dir;
}

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(""), 0u);
  // RFC 3720 (iSCSI) B.4 test vectors.
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(char(i));
    descending.push_back(char(31 - i));
  }
  EXPECT_EQ(crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(crc32c(descending), 0x113FDB5Cu);
  // LevelDB's crc32c test: "a" and "foo".
  EXPECT_EQ(crc32c("a"), 0xC1D04330u);
}

TEST(Crc32c, ExtendMatchesWhole) {
  const std::string s = "hello, tensorboard event files";
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    EXPECT_EQ(crc32c_extend(crc32c(s.data(), cut), s.data() + cut, s.size() - cut), crc32c(s));
  }
}

TEST(Crc32c, Mask) {
  EXPECT_EQ(mask_crc(0), 0xA282EAD8u);
  // 0x12345678 rotated right by 15 is 0xACF02468; plus the delta, mod 2^32.
  EXPECT_EQ(mask_crc(0x12345678u), 0xACF02468u + 0xA282EAD8u);
  for (uint32_t c : {0u, 1u, 0x80000000u, 0xFFFFFFFFu, 0xE3069283u, 0xDEADBEEFu}) {
    EXPECT_EQ(unmask_crc(mask_crc(c)), c);
    EXPECT_NE(mask_crc(c), c);
  }
}

TEST(Record, Framing) {
  const std::string data = "some event bytes";
  const std::string rec = tensorboard::frame_record(data);
  ASSERT_EQ(rec.size(), 8 + 4 + data.size() + 4);
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | uint8_t(rec[i]);
  EXPECT_EQ(length, data.size());
  auto le32 = [&](size_t at) {
    return uint32_t(uint8_t(rec[at])) | (uint32_t(uint8_t(rec[at + 1])) << 8) |
           (uint32_t(uint8_t(rec[at + 2])) << 16) | (uint32_t(uint8_t(rec[at + 3])) << 24);
  };
  EXPECT_EQ(le32(8), mask_crc(crc32c(rec.data(), 8)));
  EXPECT_EQ(rec.substr(12, data.size()), data);
  EXPECT_EQ(le32(12 + data.size()), mask_crc(crc32c(data)));
}

TEST(Writer, WritesReadableEvents) {
  const fs::path dir = fresh_dir("events") / "nested";
  auto writer = TensorBoardWriter::create(dir.string());
  ASSERT_TRUE(writer.ok()) << writer.status();
  const std::string name = fs::path((*writer)->path()).filename().string();
  EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  EXPECT_EQ(name.substr(name.size() - 11), ".switchyard") << name;
  EXPECT_EQ(name.substr(20, 10).find_first_not_of("0123456789"), std::string::npos) << name;
  EXPECT_EQ(name[30], '.') << name;

  ASSERT_TRUE((*writer)->add_scalar("train/loss", 2.5, 10).ok());
  ASSERT_TRUE((*writer)->add_scalar("train/lr", 3e-4, 11).ok());
  const std::vector<double> values = {-2.0, 0.0, 0.0, 1.0, 1.0, 1.0, 7.5};
  ASSERT_TRUE((*writer)->add_histogram("moe/load", values, 12).ok());
  std::vector<uint8_t> rgb(2 * 3 * 3, 200);
  ASSERT_TRUE((*writer)->add_image("img", 2, 3, rgb, 13).ok());
  ASSERT_TRUE((*writer)->flush().ok());

  auto records = tensorboard::read_records((*writer)->path());
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 5u);
  std::vector<tbproto::Event> events(records->size());
  for (size_t i = 0; i < records->size(); ++i) {
    ASSERT_TRUE(events[i].ParseFromString((*records)[i]));
  }
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_GT(events[0].wall_time(), 1.6e9);
  EXPECT_EQ(events[1].step(), 10);
  ASSERT_EQ(events[1].summary().value_size(), 1);
  EXPECT_EQ(events[1].summary().value(0).tag(), "train/loss");
  EXPECT_EQ(events[1].summary().value(0).simple_value(), 2.5f);
  EXPECT_EQ(events[2].summary().value(0).simple_value(), 3e-4f);

  const auto& h = events[3].summary().value(0).histo();
  EXPECT_EQ(events[3].step(), 12);
  EXPECT_EQ(h.min(), -2.0);
  EXPECT_EQ(h.max(), 7.5);
  EXPECT_EQ(h.num(), 7.0);
  EXPECT_EQ(h.sum(), 8.5);
  EXPECT_EQ(h.sum_squares(), 4 + 3 + 56.25);
  ASSERT_EQ(h.bucket_size(), h.bucket_limit_size());
  double total = 0;
  for (int i = 0; i < h.bucket_size(); ++i) {
    total += h.bucket(i);
    if (i > 0) {
      EXPECT_LT(h.bucket_limit(i - 1), h.bucket_limit(i));
    }
  }
  EXPECT_EQ(total, 7.0);
  // Every value lies below its bucket's limit and at or above the previous one.
  for (double x : values) {
    int b = 0;
    while (h.bucket_limit(b) <= x) ++b;
    EXPECT_GT(h.bucket(b), 0) << x;
  }

  const auto& image = events[4].summary().value(0).image();
  EXPECT_EQ(image.height(), 2);
  EXPECT_EQ(image.width(), 3);
  EXPECT_EQ(image.colorspace(), 3);
  EXPECT_EQ(image.encoded_image_string(), *png::encode_rgb(2, 3, rgb));
  writer->reset();
  fs::remove_all(dir.parent_path());
}

TEST(Writer, DetectsCorruption) {
  const fs::path dir = fresh_dir("corrupt");
  std::string path;
  {
    auto writer = TensorBoardWriter::create(dir.string());
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->add_scalar("x", 1.0, 1).ok());
    path = (*writer)->path();
  }  // destruction flushes
  auto ok = tensorboard::read_records(path);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->size(), 2u);

  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  for (size_t flip : {size_t(3), size_t(9), bytes.size() - 6, bytes.size() - 1}) {
    std::string bad = bytes;
    bad[flip] ^= 0x10;
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bad;
    EXPECT_EQ(tensorboard::read_records(path).status().code(), absl::StatusCode::kDataLoss)
        << "byte " << flip;
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() - 2);
  EXPECT_EQ(tensorboard::read_records(path).status().code(), absl::StatusCode::kDataLoss);
  fs::remove_all(dir);
}

TEST(Writer, UserErrorsAreStatuses) {
  const fs::path dir = fresh_dir("errors");
  auto writer = TensorBoardWriter::create(dir.string());
  ASSERT_TRUE(writer.ok()) << writer.status();
  EXPECT_EQ((*writer)->add_scalar("", 1.0, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*writer)->add_histogram("h", {}, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*writer)->add_histogram("h", {1.0, std::nan("")}, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*writer)->add_image("i", 2, 2, std::vector<uint8_t>(5), 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*writer)->add_image("i", -1, 2, {}, 0).code(), absl::StatusCode::kInvalidArgument);
  // Nothing bad was written: the file still holds only the file_version record.
  ASSERT_TRUE((*writer)->flush().ok());
  auto records = tensorboard::read_records((*writer)->path());
  ASSERT_TRUE(records.ok());
  EXPECT_EQ(records->size(), 1u);
  // A second writer in the same second gets its own file.
  auto second = TensorBoardWriter::create(dir.string());
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE((*second)->path(), (*writer)->path());

  // A log dir that is a regular file.
  const fs::path file = dir / "plain_file";
  std::ofstream(file) << "x";
  EXPECT_FALSE(TensorBoardWriter::create(file.string()).ok());
  EXPECT_FALSE(TensorBoardWriter::create("").ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace switchyard
