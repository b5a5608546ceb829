// Progress of long data jobs (tokenizer training, prepare). The data library never
// prints: it reports here and the caller (the CLI, the trainer) decides what to show.
#pragma once

#include <cstdint>
#include <string>

namespace switchyard {

struct DataProgress {
  const char* stage = "";   // "tokenizer" or "prepare"
  int64_t bytes_done = 0;   // input bytes read so far (on disk, so compressed for .gz)
  int64_t bytes_total = 0;  // size of all inputs on disk
  int64_t documents = 0;
  int64_t tokens = 0;
  double elapsed_s = 0;
  bool finished = false;  // the last report of the stage
};

// The default methods ignore everything, so this class is also the silent sink.
class DataProgressSink {
 public:
  virtual ~DataProgressSink() = default;
  virtual void on_progress(const DataProgress& progress) {}
  virtual void on_message(const std::string& text) {}
};

}  // namespace switchyard
