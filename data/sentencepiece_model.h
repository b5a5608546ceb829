// The one doorway to SentencePiece. Its 0.1.97 header declares its own absl::string_view,
// which clashes with real Abseil, so only sentencepiece_model.cc includes it and this
// interface speaks plain std types: errors come back as a message ("" means success).
// Use data/tokenizer.h instead; it wraps this in absl::Status.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace switchyard::spm {

struct TrainSpec {
  std::string model_type;  // "bpe" or "unigram"
  int64_t vocab_size = 0;
  int num_threads = 1;
  int64_t max_sentences = 0;  // sampled from the input when it has more
  uint32_t seed = 0;
};

// Trains on the sentences `next_sentence` yields (it returns false at the end) and
// serializes the model into `model`. Returns an error message or "".
std::string train(const TrainSpec& spec, const std::function<bool(std::string*)>& next_sentence,
                  std::string* model);

class Model {
 public:
  Model();
  ~Model();
  // Returns an error message or "".
  std::string load(std::string_view serialized);

  int piece_size() const;
  int unk_id() const;
  int bos_id() const;
  int eos_id() const;
  int pad_id() const;
  // Appends the ids of `text`. Bytes that are not valid UTF-8 become byte pieces, so
  // decode(encode(x)) == x for any bytes when the model has byte fallback.
  void encode(std::string_view text, std::vector<int32_t>* ids) const;
  // Returns an error message or "".
  std::string decode(const int32_t* ids, size_t count, std::string* text) const;

 private:
  // Encodes valid UTF-8.
  void encode_valid(std::string_view text, std::vector<int32_t>* ids) const;

  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  int byte_ids_[256];  // id of piece <0xNN>, or -1 without byte fallback
  bool dummy_prefix_ = false;
  // Whether text may be encoded word by word (see load()), which lets a per-thread cache
  // skip SentencePiece for words seen before.
  bool word_by_word_ = false;
  uint64_t serial_ = 0;  // tells the per-thread caches of different models apart
};

}  // namespace switchyard::spm
