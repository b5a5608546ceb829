// A minimal PNG encoder for summary images (TensorBoard's image plugin): 8-bit RGB, no
// interlace, filter 0 on every scanline, and the zlib stream made of stored (uncompressed)
// deflate blocks. Summary images are small, so compression would buy little; writing
// the container by hand keeps the engine free of an image or compression library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace switchyard::png {

// CRC-32 as PNG chunks (and zlib, gzip, Ethernet) use it: reflected polynomial
// 0xEDB88320, init and final xor 0xFFFFFFFF. crc32_extend continues an unfinished
// computation: crc32(a + b) == crc32_extend(crc32(a), b).
uint32_t crc32(const void* data, size_t size);
uint32_t crc32_extend(uint32_t crc, const void* data, size_t size);
inline uint32_t crc32(absl::string_view s) { return crc32(s.data(), s.size()); }

// Adler-32 (RFC 1950), the checksum that ends a zlib stream.
uint32_t adler32(const void* data, size_t size);
inline uint32_t adler32(absl::string_view s) { return adler32(s.data(), s.size()); }

// A zlib stream (RFC 1950) holding `data` in stored deflate blocks (RFC 1951 3.2.4) of at
// most 65535 bytes each; any inflater decodes it.
std::string zlib_stored(absl::string_view data);

// A PNG of height x width pixels; rgb holds height * width * 3 bytes, row-major.
absl::StatusOr<std::string> encode_rgb(int height, int width, const std::vector<uint8_t>& rgb);

}  // namespace switchyard::png
