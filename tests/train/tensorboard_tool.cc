// Writes a fixed set of TensorBoard summaries into the log dir named on the command line
// and prints the event file's path; tests/train/test_tensorboard_events.py reads them back
// with the tensorboard package.
//   scalars: train/loss = 4 / (step + 1) and train/lr = 1e-3 * step for steps 0..4
//   histogram: moe/expert_load at step 4, values i * 0.5 - 3 for i in 0..99 plus 1e6
//   image: samples/gradient at step 4, 6 high x 10 wide, pixel (y, x) = (25x, 40y, 128)
#include <cstdio>
#include <string>
#include <vector>

#include "engine/train/tensorboard_writer.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: tensorboard_tool LOG_DIR\n");
    return 2;
  }
  auto fail = [](const absl::Status& status) {
    std::fprintf(stderr, "error: %s\n", std::string(status.message()).c_str());
    return 1;
  };
  auto writer = switchyard::TensorBoardWriter::create(argv[1]);
  if (!writer.ok()) return fail(writer.status());
  auto& w = **writer;
  for (int step = 0; step < 5; ++step) {
    if (auto s = w.add_scalar("train/loss", 4.0 / (step + 1), step); !s.ok()) return fail(s);
    if (auto s = w.add_scalar("train/lr", 1e-3 * step, step); !s.ok()) return fail(s);
  }
  std::vector<double> values;
  for (int i = 0; i < 100; ++i) values.push_back(i * 0.5 - 3);
  values.push_back(1e6);
  if (auto s = w.add_histogram("moe/expert_load", values, 4); !s.ok()) return fail(s);
  const int height = 6, width = 10;
  std::vector<uint8_t> rgb;
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      rgb.push_back(uint8_t(25 * x));
      rgb.push_back(uint8_t(40 * y));
      rgb.push_back(128);
    }
  }
  if (auto s = w.add_image("samples/gradient", height, width, rgb, 4); !s.ok()) return fail(s);
  if (auto s = w.flush(); !s.ok()) return fail(s);
  std::printf("%s\n", w.path().c_str());
  return 0;
}
