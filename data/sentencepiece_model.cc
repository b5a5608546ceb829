// No Abseil header may be included here (see the header).
#include "data/sentencepiece_model.h"
#include "core/runtime/text.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <atomic>
#include <cstdio>
#include <exception>
#include <unordered_map>

namespace sentencepiece::logging {
// Defined in libsentencepiece but not declared in its 0.1.97 headers.
void SetMinLogLevel(int level);
}  // namespace sentencepiece::logging

namespace switchyard::spm {
namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";         // U+2581, SentencePiece's space
constexpr std::string_view kUnknownSurface = " \xE2\x81\x87 ";  // SentencePiece's default

// SentencePiece prefixes messages with its source location and the failed condition,
// "./src/x.cc(12) [cond] text"; users need only the text.
std::string user_message(const sentencepiece::util::Status& status, const std::string& fallback) {
  std::string message = status.error_message();
  if (message.rfind("./src/", 0) == 0) {
    const size_t end = message.find("] ");
    message = end == std::string::npos ? "" : message.substr(end + 2);
  }
  while (!message.empty() && (message.back() == ' ' || message.back() == '\n')) message.pop_back();
  // The message may quote bytes of the model (a bad piece).
  return message.empty() ? fallback : escape_control_bytes(message);
}

// Silences SentencePiece's own logging: the CLI reports errors as one line.
void quiet() { sentencepiece::logging::SetMinLogLevel(3); }

class CallbackIterator : public sentencepiece::SentenceIterator {
 public:
  explicit CallbackIterator(const std::function<bool(std::string*)>& next) : next_(next) { Next(); }
  bool done() const override { return done_; }
  void Next() override { done_ = !next_(&value_); }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::function<bool(std::string*)>& next_;
  std::string value_;
  bool done_ = false;
};

// Words longer than this are not cached; the cache is emptied when it holds more words.
constexpr size_t kMaxCachedWordBytes = 64;
constexpr size_t kMaxCachedWords = 1 << 18;

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};

struct WordCache {
  uint64_t serial = 0;
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> words;
};

std::atomic<uint64_t> model_serials{0};

// Length of the valid UTF-8 sequence starting at s[0], or 0 when it is malformed
// (overlong forms, surrogates and values above U+10FFFF included).
size_t utf8_length(const unsigned char* s, size_t n) {
  const unsigned c = s[0];
  if (c < 0x80) return 1;
  size_t len;
  unsigned min_second = 0x80, max_second = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) min_second = 0xA0;
    if (c == 0xED) max_second = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) min_second = 0x90;
    if (c == 0xF4) max_second = 0x8F;
  } else {
    return 0;
  }
  if (n < len || s[1] < min_second || s[1] > max_second) return 0;
  for (size_t i = 2; i < len; ++i)
    if (s[i] < 0x80 || s[i] > 0xBF) return 0;
  return len;
}

// The byte of a byte piece "<0xNN>", or -1 when the piece has another form.
int byte_of_piece(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return -1;
  int byte = 0;
  for (const char c : piece.substr(3, 2)) {
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (digit < 0) return -1;
    byte = byte * 16 + digit;
  }
  return byte;
}

}  // namespace

std::string train(const TrainSpec& spec, const std::function<bool(std::string*)>& next_sentence,
                  std::string* model) {
  quiet();
  sentencepiece::SetRandomGeneratorSeed(spec.seed);
  // Llama-like ids, byte fallback and no normalization, so that every byte string
  // survives encode/decode and Hugging Face's converter can describe the model.
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", spec.model_type},
      {"vocab_size", std::to_string(spec.vocab_size)},
      {"num_threads", std::to_string(spec.num_threads)},
      {"input_sentence_size", std::to_string(spec.max_sentences)},
      {"shuffle_input_sentence", "true"},
      {"max_sentence_length", "16384"},
      {"byte_fallback", "true"},
      {"split_digits", "true"},
      {"allow_whitespace_only_pieces", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "3"},
      {"unk_piece", "<unk>"},
      {"bos_piece", "<s>"},
      {"eos_piece", "</s>"},
      {"pad_piece", "<pad>"},
  };
  CallbackIterator it(next_sentence);
  const sentencepiece::util::Status status =
      sentencepiece::SentencePieceTrainer::Train(args, &it, model);
  return status.ok() ? "" : user_message(status, "SentencePiece training failed");
}

Model::Model() : processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}
Model::~Model() = default;

std::string Model::load(std::string_view serialized) {
  quiet();
  sentencepiece::util::Status status;
  // libsentencepiece's trie builder (Darts) throws on some malformed piece lists instead
  // of returning a status: the exception stops at this boundary.
  try {
    status = processor_->LoadFromSerializedProto(serialized);
  } catch (const std::exception&) {
    return "cannot parse the model (its pieces do not form a trie)";
  }
  if (!status.ok()) return user_message(status, "cannot parse the model");
  if (processor_->GetPieceSize() <= 0) return "the model has no pieces";
  char piece[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(piece, sizeof(piece), "<0x%02X>", b);
    const int id = processor_->PieceToId(piece);
    byte_ids_[b] = processor_->IsByte(id) ? id : -1;
  }
  // add_dummy_prefix lives in the model proto, whose header Debian does not ship; the
  // prefix shows up as a space mark on the first piece of any encoding.
  std::vector<std::string> pieces;
  dummy_prefix_ = processor_->Encode("a", &pieces).ok() && !pieces.empty() &&
                  std::string_view(pieces[0]).substr(0, kSpaceMark.size()) == kSpaceMark;

  // A word here is a run of spaces and the non-space text after it, and a newline is a
  // word of its own. Encoding word by word gives the same ids as encoding the whole text
  // when no piece can span a word boundary (no piece has a space mark after another
  // character, or a newline) and encoding neither adds a prefix nor normalizes (the
  // probe comes back unchanged), as for the models train() makes.
  bool no_spanning_piece = !dummy_prefix_;
  for (int id = 0; no_spanning_piece && id < processor_->GetPieceSize(); ++id) {
    if (processor_->IsByte(id) || processor_->IsControl(id) || processor_->IsUnknown(id)) continue;
    std::string_view piece = processor_->IdToPiece(id);
    while (piece.substr(0, kSpaceMark.size()) == kSpaceMark) piece.remove_prefix(kSpaceMark.size());
    no_spanning_piece = piece.find(kSpaceMark) == std::string_view::npos &&
                        piece.find('\n') == std::string_view::npos;
  }
  const std::string probe = "a  b\tc\n d ";
  std::vector<int> probe_ids;
  std::string probe_back;
  processor_->Encode(probe, &probe_ids).IgnoreError();
  std::vector<int32_t> probe_ids32(probe_ids.begin(), probe_ids.end());
  word_by_word_ = no_spanning_piece &&
                  decode(probe_ids32.data(), probe_ids32.size(), &probe_back).empty() &&
                  probe_back == probe;
  serial_ = ++model_serials;
  return "";
}

int Model::piece_size() const { return processor_->GetPieceSize(); }
int Model::unk_id() const { return processor_->unk_id(); }
int Model::bos_id() const { return processor_->bos_id(); }
int Model::eos_id() const { return processor_->eos_id(); }
int Model::pad_id() const { return processor_->pad_id(); }

void Model::encode(std::string_view text, std::vector<int32_t>* ids) const {
  // SentencePiece turns malformed UTF-8 into U+FFFD, so such bytes are encoded here as
  // byte pieces and only the valid runs between them go to SentencePiece.
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t run_start = 0, i = 0;
  auto flush_run = [&](size_t end) {
    if (end > run_start) encode_valid(text.substr(run_start, end - run_start), ids);
  };
  while (i < n) {
    const size_t len = utf8_length(s + i, n - i);
    if (len > 0) {
      i += len;
      continue;
    }
    flush_run(i);
    ids->push_back(byte_ids_[s[i]] >= 0 ? byte_ids_[s[i]] : processor_->unk_id());
    run_start = ++i;
  }
  flush_run(n);
}

void Model::encode_valid(std::string_view text, std::vector<int32_t>* ids) const {
  std::vector<int> piece_ids;
  auto encode_directly = [&](std::string_view part) {
    processor_->Encode(part, &piece_ids).IgnoreError();
    ids->insert(ids->end(), piece_ids.begin(), piece_ids.end());
  };
  if (!word_by_word_) return encode_directly(text);
  thread_local WordCache cache;
  if (cache.serial != serial_ || cache.words.size() > kMaxCachedWords) {
    cache.words.clear();
    cache.serial = serial_;
  }
  size_t start = 0;
  for (size_t i = 1; i <= text.size(); ++i) {
    const bool boundary = i == text.size() || text[i] == '\n' || text[i - 1] == '\n' ||
                          (text[i] == ' ' && text[i - 1] != ' ');
    if (!boundary) continue;
    const std::string_view word = text.substr(start, i - start);
    start = i;
    if (word.size() > kMaxCachedWordBytes) {
      encode_directly(word);
      continue;
    }
    auto it = cache.words.find(word);
    if (it == cache.words.end()) {
      processor_->Encode(word, &piece_ids).IgnoreError();
      it =
          cache.words.emplace(word, std::vector<int32_t>(piece_ids.begin(), piece_ids.end())).first;
    }
    ids->insert(ids->end(), it->second.begin(), it->second.end());
  }
}

std::string Model::decode(const int32_t* ids, size_t count, std::string* text) const {
  // Piece by piece rather than SentencePiece's Decode, which would turn byte pieces that
  // form malformed UTF-8 into U+FFFD.
  const int size = processor_->GetPieceSize();
  text->clear();
  bool first_piece = true;
  for (size_t i = 0; i < count; ++i) {
    const int id = ids[i];
    if (id < 0 || id >= size)
      return "token id " + std::to_string(id) + " is outside the vocabulary (size " +
             std::to_string(size) + ")";
    if (processor_->IsControl(id)) continue;
    if (processor_->IsUnknown(id)) {
      text->append(kUnknownSurface);
    } else if (processor_->IsByte(id)) {
      const int byte = byte_of_piece(processor_->IdToPiece(id));
      if (byte < 0) return "byte piece " + std::to_string(id) + " is not of the form <0xNN>";
      text->push_back(static_cast<char>(byte));
    } else {
      std::string_view piece = processor_->IdToPiece(id);
      if (first_piece && dummy_prefix_ && piece.substr(0, kSpaceMark.size()) == kSpaceMark)
        piece.remove_prefix(kSpaceMark.size());
      for (size_t p = 0; p < piece.size();) {
        if (piece.substr(p, kSpaceMark.size()) == kSpaceMark) {
          text->push_back(' ');
          p += kSpaceMark.size();
        } else {
          text->push_back(piece[p++]);
        }
      }
    }
    first_piece = false;
  }
  return "";
}

}  // namespace switchyard::spm
