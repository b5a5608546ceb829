#include "engine/train/png.h"

#include <algorithm>
#include <array>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "engine/train/crc_table.h"

namespace switchyard::png {

namespace {

constexpr std::array<uint32_t, 256> kCrc32Table = reflected_crc32_table(0xEDB88320u);

constexpr size_t kMaxStoredBlock = 65535;
// Largest image accepted: summary images are thumbnails, and this keeps every size
// below 32 bits.
constexpr uint64_t kMaxPixelBytes = uint64_t{1} << 30;

void put_u16_le(std::string& out, uint32_t v) {
  out.push_back(static_cast<char>(v & 0xFF));
  out.push_back(static_cast<char>((v >> 8) & 0xFF));
}

void put_u32_be(std::string& out, uint32_t v) {
  for (int i = 3; i >= 0; --i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

// length (big-endian), type, data, CRC-32 of type and data (big-endian).
void put_chunk(std::string& out, const char type[4], absl::string_view data) {
  put_u32_be(out, static_cast<uint32_t>(data.size()));
  const size_t type_at = out.size();
  out.append(type, 4);
  out.append(data.data(), data.size());
  put_u32_be(out, crc32(out.data() + type_at, 4 + data.size()));
}

}  // namespace

uint32_t crc32_extend(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  for (size_t i = 0; i < size; ++i) c = kCrc32Table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return ~c;
}

uint32_t crc32(const void* data, size_t size) { return crc32_extend(0, data, size); }

uint32_t adler32(const void* data, size_t size) {
  constexpr uint32_t kMod = 65521;
  // 5552 bytes is the longest run whose sums cannot overflow 32 bits before the modulo.
  constexpr size_t kRun = 5552;
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t a = 1, b = 0;
  while (size > 0) {
    const size_t run = std::min(size, kRun);
    for (size_t i = 0; i < run; ++i) {
      a += p[i];
      b += a;
    }
    a %= kMod;
    b %= kMod;
    p += run;
    size -= run;
  }
  return (b << 16) | a;
}

std::string zlib_stored(absl::string_view data) {
  const size_t blocks = std::max<size_t>(1, (data.size() + kMaxStoredBlock - 1) / kMaxStoredBlock);
  std::string out;
  out.reserve(2 + blocks * 5 + data.size() + 4);
  // CMF: deflate with a 32K window; FLG: no dictionary, level 0, and check bits making
  // CMF * 256 + FLG a multiple of 31.
  out.push_back(0x78);
  out.push_back(0x01);
  size_t at = 0;
  for (size_t b = 0; b < blocks; ++b) {
    const size_t len = std::min(kMaxStoredBlock, data.size() - at);
    // Byte-aligned block header: BFINAL in bit 0, BTYPE 00 (stored) in bits 1-2.
    out.push_back(b + 1 == blocks ? 1 : 0);
    put_u16_le(out, static_cast<uint32_t>(len));
    put_u16_le(out, static_cast<uint32_t>(~len & 0xFFFF));
    out.append(data.data() + at, len);
    at += len;
  }
  put_u32_be(out, adler32(data));
  return out;
}

absl::StatusOr<std::string> encode_rgb(int height, int width, const std::vector<uint8_t>& rgb) {
  if (height <= 0 || width <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("image size must be positive, got %dx%d (height x width)", height, width));
  }
  const uint64_t row_bytes = 3 * static_cast<uint64_t>(width);
  const uint64_t expected = row_bytes * static_cast<uint64_t>(height);
  if (expected > kMaxPixelBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("image of %dx%d RGB is too large (%d bytes, at most %d)", height, width,
                        expected, kMaxPixelBytes));
  }
  if (rgb.size() != expected) {
    return absl::InvalidArgumentError(absl::StrFormat("image of %dx%d RGB needs %d bytes, got %d",
                                                      height, width, expected, rgb.size()));
  }
  // Scanlines, each led by filter type 0 (None).
  std::string raw;
  raw.reserve(static_cast<size_t>(expected + height));
  for (int y = 0; y < height; ++y) {
    raw.push_back('\0');
    raw.append(reinterpret_cast<const char*>(rgb.data()) + y * row_bytes, row_bytes);
  }

  std::string out("\x89PNG\r\n\x1a\n", 8);
  std::string ihdr;
  put_u32_be(ihdr, static_cast<uint32_t>(width));
  put_u32_be(ihdr, static_cast<uint32_t>(height));
  ihdr.push_back(8);  // bit depth
  ihdr.push_back(2);  // colour type: truecolour RGB
  ihdr.push_back(0);  // compression method: deflate
  ihdr.push_back(0);  // filter method 0
  ihdr.push_back(0);  // no interlace
  put_chunk(out, "IHDR", ihdr);
  put_chunk(out, "IDAT", zlib_stored(raw));
  put_chunk(out, "IEND", "");
  return out;
}

}  // namespace switchyard::png
