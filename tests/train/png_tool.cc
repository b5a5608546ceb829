// Writes a PNG made by png::encode_rgb, for tests/train/test_png.py to decode with Pillow.
//   png_tool OUT.png HEIGHT WIDTH
// Pixel (y, x) is (x * 7 + y, y * 5 + x / 3, (x ^ y) * 11), each modulo 256.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "engine/train/png.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: png_tool OUT.png HEIGHT WIDTH\n");
    return 2;
  }
  const int height = std::atoi(argv[2]), width = std::atoi(argv[3]);
  std::vector<uint8_t> rgb;
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      rgb.push_back(static_cast<uint8_t>(x * 7 + y));
      rgb.push_back(static_cast<uint8_t>(y * 5 + x / 3));
      rgb.push_back(static_cast<uint8_t>((x ^ y) * 11));
    }
  }
  auto encoded = switchyard::png::encode_rgb(height, width, rgb);
  if (!encoded.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(encoded.status().message()).c_str());
    return 1;
  }
  std::ofstream out(argv[1], std::ios::binary | std::ios::trunc);
  out << *encoded;
  out.close();
  if (!out) {
    std::fprintf(stderr, "error: cannot write %s\n", argv[1]);
    return 1;
  }
  return 0;
}
