// Byte tables for reflected (LSB-first) CRC-32 variants: CRC-32 for PNG chunks
// (polynomial 0xEDB88320) and CRC-32C for TensorBoard record framing (0x82F63B78).
#pragma once

#include <array>
#include <cstdint>

namespace switchyard {

constexpr std::array<uint32_t, 256> reflected_crc32_table(uint32_t polynomial) {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ polynomial : c >> 1;
    table[i] = c;
  }
  return table;
}

}  // namespace switchyard
