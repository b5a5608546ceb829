// HDF5 metadata carries checksums (the superblock, every object header chunk), so almost
// every mutation libFuzzer makes is refused at the first checksum and the parser behind
// it is never reached. A hostile file carries correct checksums: the HDF5 targets hand
// the reader each input twice, as it is and resealed, with every checksum recomputed
// where the structure can be found: the superblock, each chunk that starts with "OHDR",
// and each "OCHK" chunk that a continuation message of a resealed chunk points to.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "data/hdf5_reader.h"

namespace switchyard::fuzz {
namespace reseal_detail {

constexpr size_t kSuperblockBytes = 48;
constexpr uint8_t kContinuation = 0x10;
constexpr size_t kMaxChunks = 4096;

// A chunk to seal: its address, its length, the byte size of its messages' envelopes.
using Chunk = std::tuple<size_t, size_t, size_t>;

inline uint64_t little_endian(std::string_view bytes, size_t at, size_t width) {
  uint64_t value = 0;
  for (size_t i = 0; i < width; ++i)
    value |= uint64_t{static_cast<uint8_t>(bytes[at + i])} << (8 * i);
  return value;
}

// Writes the checksum of [at, at + length - 4) into its last 4 bytes.
inline void seal(std::string& image, size_t at, size_t length) {
  const uint32_t sum = hdf5_checksum(std::string_view(image).substr(at, length - 4));
  for (size_t i = 0; i < 4; ++i) image[at + length - 4 + i] = static_cast<char>(sum >> (8 * i));
}

// Queues the chunks that the continuation messages in [at, at + length) point to.
inline void queue_continuations(std::string_view image, size_t at, size_t length,
                                size_t envelope, std::vector<Chunk>& queue) {
  const size_t end = at + length;
  while (end - at >= envelope) {
    const uint64_t type = little_endian(image, at, 1);
    const uint64_t size = little_endian(image, at + 1, 2);
    at += envelope;
    if (size > end - at) return;
    if (type == kContinuation && size >= 16) {
      const uint64_t address = little_endian(image, at, 8);
      const uint64_t chunk_length = little_endian(image, at + 8, 8);
      if (address <= image.size() && chunk_length >= 8 && chunk_length <= image.size() - address)
        queue.emplace_back(address, chunk_length, envelope);
    }
    at += size;
  }
}

// Seals the "OHDR" chunk at `at` when its prefix and length fit in the image.
inline void seal_header(std::string& image, size_t at, std::vector<Chunk>& queue) {
  if (image.size() - at < 6) return;
  const uint8_t flags = static_cast<uint8_t>(image[at + 5]);
  const size_t width = size_t{1} << (flags & 3);
  const size_t prefix = 6 + ((flags & 0x20) != 0 ? 16 : 0) + ((flags & 0x10) != 0 ? 4 : 0);
  if (image.size() - at < prefix + width + 4) return;
  const uint64_t body = little_endian(image, at + prefix, width);
  if (body > image.size() - at - prefix - width - 4) return;
  seal(image, at, prefix + width + body + 4);
  queue_continuations(image, at + prefix + width, body, (flags & 0x04) != 0 ? 6 : 4, queue);
}

}  // namespace reseal_detail

inline std::string reseal_hdf5(std::string image) {
  using namespace reseal_detail;
  if (image.size() >= kSuperblockBytes) seal(image, 0, kSuperblockBytes);
  std::vector<Chunk> queue;
  for (size_t at = image.find("OHDR"); at != std::string::npos; at = image.find("OHDR", at + 1))
    seal_header(image, at, queue);
  std::set<size_t> sealed;
  while (!queue.empty() && sealed.size() < kMaxChunks) {
    const auto [at, length, envelope] = queue.back();
    queue.pop_back();
    if (image.compare(at, 4, "OCHK") != 0 || !sealed.insert(at).second) continue;
    seal(image, at, length);
    queue_continuations(image, at + 4, length - 8, envelope, queue);
  }
  return image;
}

// The HDF5 targets' whole body: `read_everything` on the input as given, then on it
// resealed when that changes it.
template <typename Read>
void read_as_given_and_resealed(std::string_view input, Read read_everything) {
  const std::string image(input);
  read_everything(image);
  const std::string resealed = reseal_hdf5(image);
  if (resealed != image) read_everything(resealed);
}

}  // namespace switchyard::fuzz
