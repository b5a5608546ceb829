// The PNG encoder: CRC-32 and Adler-32 against published values, the stored-block zlib
// stream parsed back block by block, and a PNG's chunks (test_png.py decodes the same
// encoder's output with Pillow).
#include "engine/train/png.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace switchyard {
namespace {

uint32_t be32(const std::string& s, size_t at) {
  return (uint32_t(uint8_t(s[at])) << 24) | (uint32_t(uint8_t(s[at + 1])) << 16) |
         (uint32_t(uint8_t(s[at + 2])) << 8) | uint32_t(uint8_t(s[at + 3]));
}

uint32_t le16(const std::string& s, size_t at) {
  return uint32_t(uint8_t(s[at])) | (uint32_t(uint8_t(s[at + 1])) << 8);
}

// Adler-32 straight from RFC 1950: both sums reduced after every byte.
uint32_t adler32_by_definition(const std::string& s) {
  uint32_t a = 1, b = 0;
  for (char c : s) {
    a = (a + uint8_t(c)) % 65521;
    b = (b + a) % 65521;
  }
  return (b << 16) | a;
}

// Inflates a zlib stream that holds only stored blocks; fails the test on anything else.
std::string inflate_stored(const std::string& z) {
  EXPECT_GE(z.size(), 2u + 5u + 4u);
  EXPECT_EQ(uint8_t(z[0]), 0x78);
  EXPECT_EQ((uint8_t(z[0]) * 256 + uint8_t(z[1])) % 31, 0);
  EXPECT_EQ(uint8_t(z[1]) & 0x20, 0) << "no preset dictionary";
  std::string out;
  size_t at = 2;
  for (bool final = false; !final;) {
    if (at + 5 > z.size()) {
      ADD_FAILURE() << "truncated block header at " << at;
      return out;
    }
    const uint8_t header = uint8_t(z[at]);
    EXPECT_EQ(header & 0x06, 0) << "BTYPE must be 00 (stored)";
    final = header & 1;
    const uint32_t len = le16(z, at + 1);
    EXPECT_EQ(le16(z, at + 3), ~len & 0xFFFF) << "NLEN";
    if (at + 5 + len > z.size()) {
      ADD_FAILURE() << "truncated block at " << at;
      return out;
    }
    out.append(z, at + 5, len);
    at += 5 + len;
  }
  EXPECT_EQ(at + 4, z.size()) << "the Adler-32 ends the stream";
  EXPECT_EQ(be32(z, at), adler32_by_definition(out));
  return out;
}

TEST(Crc32, KnownVectors) {
  EXPECT_EQ(png::crc32(""), 0u);
  EXPECT_EQ(png::crc32("123456789"), 0xCBF43926u);  // the CRC-32/ISO-HDLC check value
  EXPECT_EQ(png::crc32("The quick brown fox jumps over the lazy dog"), 0x414FA339u);
  EXPECT_EQ(png::crc32("a"), 0xE8B7BE43u);
  // Every PNG ends with this chunk: length 0, "IEND", CRC AE 42 60 82.
  EXPECT_EQ(png::crc32("IEND"), 0xAE426082u);
  EXPECT_EQ(png::crc32(std::string(32, '\0')), 0x190A55ADu);
}

TEST(Crc32, ExtendMatchesWhole) {
  const std::string s = "chunk type and chunk data";
  for (size_t cut = 0; cut <= s.size(); ++cut)
    EXPECT_EQ(png::crc32_extend(png::crc32(s.data(), cut), s.data() + cut, s.size() - cut),
              png::crc32(s));
}

TEST(Adler32, KnownVectors) {
  EXPECT_EQ(png::adler32(""), 1u);
  EXPECT_EQ(png::adler32("Wikipedia"), 0x11E60398u);
  EXPECT_EQ(png::adler32("123456789"), 0x091E01DEu);
}

TEST(Adler32, LongInputsMatchTheDefinition) {
  // Long runs of 0xFF are the worst case for the deferred modulo.
  for (size_t n : {size_t(5551), size_t(5552), size_t(5553), size_t(100000)}) {
    const std::string ones(n, '\xff');
    EXPECT_EQ(png::adler32(ones), adler32_by_definition(ones)) << n;
  }
  EXPECT_EQ(png::adler32(std::string(100000, '\xff')), 0x149A302Cu);
  std::string mixed;
  for (int i = 0; i < 70000; ++i) mixed.push_back(char(i * 131 + (i >> 7)));
  EXPECT_EQ(png::adler32(mixed), adler32_by_definition(mixed));
}

TEST(ZlibStored, RoundTripsAcrossBlockBoundaries) {
  for (size_t n : {size_t(0), size_t(1), size_t(65535), size_t(65536), size_t(200000)}) {
    std::string data;
    for (size_t i = 0; i < n; ++i) data.push_back(char((i * 7 + i / 300) & 0xFF));
    const std::string z = png::zlib_stored(data);
    const size_t blocks = n == 0 ? 1 : (n + 65534) / 65535;
    EXPECT_EQ(z.size(), 2 + 5 * blocks + n + 4) << n;
    EXPECT_EQ(inflate_stored(z), data) << n;
  }
}

TEST(Png, HeaderChunksAndPixels) {
  const int h = 3, w = 5;
  std::vector<uint8_t> rgb(h * w * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = uint8_t(i * 7 + 1);
  auto encoded = png::encode_rgb(h, w, rgb);
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  const std::string& s = *encoded;
  ASSERT_EQ(s.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  std::vector<std::string> types;
  std::string idat;
  size_t at = 8;
  while (at < s.size()) {
    ASSERT_LE(at + 12, s.size());
    const uint32_t len = be32(s, at);
    ASSERT_LE(at + 12 + len, s.size());
    const std::string type = s.substr(at + 4, 4);
    types.push_back(type);
    EXPECT_EQ(be32(s, at + 8 + len), png::crc32(s.data() + at + 4, 4 + len)) << type;
    if (type == "IHDR") {
      ASSERT_EQ(len, 13u);
      EXPECT_EQ(be32(s, at + 8), uint32_t(w));
      EXPECT_EQ(be32(s, at + 12), uint32_t(h));
      EXPECT_EQ(s.substr(at + 16, 5), std::string("\x08\x02\x00\x00\x00", 5));
    }
    if (type == "IDAT") idat += s.substr(at + 8, len);
    at += 12 + len;
  }
  EXPECT_EQ(types, (std::vector<std::string>{"IHDR", "IDAT", "IEND"}));
  EXPECT_EQ(s.substr(s.size() - 12), std::string("\0\0\0\0IEND\xae\x42\x60\x82", 12));
  // IDAT inflates to filter-0 scanlines holding the pixels.
  const std::string raw = inflate_stored(idat);
  ASSERT_EQ(raw.size(), size_t(h * (1 + w * 3)));
  for (int y = 0; y < h; ++y) {
    EXPECT_EQ(raw[y * (1 + w * 3)], '\0');
    EXPECT_EQ(raw.substr(y * (1 + w * 3) + 1, w * 3),
              std::string(rgb.begin() + y * w * 3, rgb.begin() + (y + 1) * w * 3));
  }
}

TEST(Png, RejectsBadSizes) {
  EXPECT_EQ(png::encode_rgb(0, 4, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(png::encode_rgb(4, -1, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(png::encode_rgb(2, 2, std::vector<uint8_t>(11)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(png::encode_rgb(100000, 100000, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace switchyard
