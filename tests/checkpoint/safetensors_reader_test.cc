// safetensors: what is written reads back, and every damaged or hostile header is one
// error naming the file and the field, found before any tensor is allocated.
#include "checkpoint/safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace switchyard {
namespace {

namespace fs = std::filesystem;

// An 8-byte little-endian length, the header and the data.
std::string file_bytes(uint64_t header_length, const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(header_length >> (8 * i));
  return out + header + data;
}

std::string file_bytes(const std::string& header, const std::string& data) {
  return file_bytes(header.size(), header, data);
}

// The error of parsing a file with this header over `data_bytes` zero bytes.
std::string error_of(const std::string& header, size_t data_bytes = 16) {
  const auto result = parse_safetensors(file_bytes(header, std::string(data_bytes, '\0')), "t.st");
  EXPECT_FALSE(result.ok()) << header;
  return result.ok() ? "" : std::string(result.status().message());
}

std::string scratch_dir() {
  const fs::path dir = fs::temp_directory_path() /
                       ("safetensors_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir.string();
}

TEST(SafetensorsReader, WrittenTensorsReadBack) {
  const std::string path = scratch_dir() + "/w.safetensors";
  Tensor a = Tensor::empty({2, 3}, DType::kF32);
  for (int i = 0; i < 6; ++i) a.data<float>()[i] = 0.5f * i;
  Tensor b = Tensor::empty({4}, DType::kI32);
  for (int i = 0; i < 4; ++i) b.data<int32_t>()[i] = -i;
  ASSERT_TRUE(write_safetensors(path, {{"a", a}, {"b", b}}).ok());
  EXPECT_FALSE(fs::exists(path + ".partial"));
  const auto read = read_safetensors(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), 2u);
  EXPECT_EQ(read->at("a").shape(), (Shape{2, 3}));
  EXPECT_EQ(read->at("a").data<float>()[5], 2.5f);
  EXPECT_EQ(read->at("b").data<int32_t>()[3], -3);
}

TEST(SafetensorsReader, EmptyTensorAndMetadataAccepted) {
  const auto result = parse_safetensors(
      file_bytes(R"({"__metadata__":{"format":"pt"},"e":{"dtype":"F32","shape":[0,4],)"
                 R"("data_offsets":[0,0]},"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
                 "ab"),
      "t.st");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->at("e").numel(), 0);
  EXPECT_EQ(result->at("x").data<uint8_t>()[1], 'b');
}

TEST(SafetensorsReader, TruncatedFiles) {
  EXPECT_EQ(parse_safetensors("abc", "t.st").status().message(),
            "t.st: is 3 bytes, shorter than the 8-byte header length (truncated?)");
  const std::string header = R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  const std::string whole = file_bytes(header, std::string(16, '\0'));
  EXPECT_NE(std::string(parse_safetensors(whole.substr(0, 20), "t.st").status().message())
                .find("runs past the end of the file"),
            std::string::npos);
  EXPECT_EQ(std::string(parse_safetensors(whole.substr(0, whole.size() - 1), "t.st")
                            .status()
                            .message()),
            "t.st: field x.data_offsets [0, 16] lies outside the data's 15 bytes (file "
            "truncated?)");
}

TEST(SafetensorsReader, HeaderLengthCapped) {
  const std::string huge = file_bytes(uint64_t{1} << 63, "{}", "");
  EXPECT_EQ(parse_safetensors(huge, "t.st").status().message(),
            "t.st: header length 9223372036854775808 is over the cap of 104857600 bytes");
  const std::string over = file_bytes((uint64_t{100} << 20) + 1, "{}", "");
  EXPECT_NE(std::string(parse_safetensors(over, "t.st").status().message()).find("over the cap"),
            std::string::npos);
}

TEST(SafetensorsReader, HeaderNotJson) {
  EXPECT_EQ(error_of("{not json"), "t.st header: not a JSON object");
  EXPECT_EQ(error_of("[1, 2]"), "t.st header: not a JSON object");
}

TEST(SafetensorsReader, FieldsOfTheWrongType) {
  EXPECT_EQ(error_of(R"({"x":7})"), "t.st: field x must be an object");
  EXPECT_EQ(error_of(R"({"x":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})"),
            "t.st: field x.dtype \"F64\" is not one of F32, BF16, F16, I32, I64, U8");
  EXPECT_EQ(error_of(R"({"x":{"dtype":null,"shape":[2],"data_offsets":[0,8]}})"),
            "t.st: field x.dtype must be a string");
  EXPECT_EQ(error_of(R"({"x":{"dtype":"F32","shape":"[2]","data_offsets":[0,8]}})"),
            "t.st: field x.shape must be an array of non-negative integers");
  EXPECT_EQ(error_of(R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})"),
            "t.st: field x.shape must be an array of non-negative integers");
  EXPECT_EQ(error_of(R"({"x":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})"),
            "t.st: field x.shape must be an array of non-negative integers");
  EXPECT_EQ(error_of(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0]}})"),
            "t.st: field x.data_offsets must be two non-negative integers [begin, end]");
  EXPECT_EQ(error_of(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})"),
            "t.st: field x.data_offsets must be two non-negative integers [begin, end]");
  EXPECT_EQ(error_of(R"({"__metadata__":{"format":1}})"),
            "t.st: field __metadata__.format must be a string");
  EXPECT_EQ(error_of(R"({"__metadata__":[]})"), "t.st: field __metadata__ must be an object");
}

TEST(SafetensorsReader, ByteSizeOverflowRefused) {
  EXPECT_EQ(error_of(R"({"x":{"dtype":"F32","shape":[4294967296,4294967296],)"
                     R"("data_offsets":[0,8]}})"),
            "t.st: tensor x has shape [4294967296, 4294967296] whose byte size overflows");
  EXPECT_EQ(error_of(R"({"x":{"dtype":"F32","shape":[9223372036854775807],"data_offsets":[0,8]}})"),
            "t.st: tensor x has shape [9223372036854775807] whose byte size overflows");
  EXPECT_EQ(error_of(R"({"x":{"dtype":"F32","shape":[18446744073709551615],)"
                     R"("data_offsets":[0,8]}})"),
            "t.st: field x.shape must be an array of non-negative integers");
}

TEST(SafetensorsReader, RangesChecked) {
  EXPECT_EQ(error_of(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[8,4]}})"),
            "t.st: field x.data_offsets [8, 4] lies outside the data's 16 bytes (file truncated?)");
  EXPECT_EQ(error_of(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,1099511627776]}})"),
            "t.st: field x.data_offsets [0, 1099511627776] lies outside the data's 16 bytes "
            "(file truncated?)");
  EXPECT_EQ(error_of(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})"),
            "t.st: field x.data_offsets spans 8 bytes, but F32[3] needs 12");
  EXPECT_EQ(error_of(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                     R"("y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})"),
            "t.st: tensors x and y overlap in the data (bytes 4 to 8)");
}

TEST(SafetensorsReader, NonRegularFilesRefused) {
  const std::string dir = scratch_dir();
  EXPECT_NE(std::string(read_safetensors(dir).status().message()).find("is a directory"),
            std::string::npos);
  const std::string fifo = dir + "/fifo.safetensors";
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(read_safetensors(fifo).status().message(), fifo + ": is not a regular file");
}

}  // namespace
}  // namespace switchyard
