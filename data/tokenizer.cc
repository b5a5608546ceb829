#include "data/tokenizer.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/runtime/file_util.h"
#include "core/runtime/status_macros.h"
#include "data/document_reader.h"
#include "data/sentencepiece_model.h"
#include "data/sha256.h"

namespace switchyard {

absl::Status train_tokenizer(const TokenizerTrainOptions& options, const std::string& out_path,
                             DataProgressSink& sink) {
  if (options.inputs.empty()) return absl::InvalidArgumentError("no input files given");
  if (options.model_type != "bpe" && options.model_type != "unigram")
    return absl::InvalidArgumentError(
        absl::StrCat("unknown tokenizer model type \"", options.model_type, "\" (bpe or unigram)"));
  if (options.vocab_size < kMinTokenizerVocabSize)
    return absl::InvalidArgumentError(
        absl::StrCat("vocab size ", options.vocab_size,
                     " is too small: the special and byte pieces alone take 260; use at least ",
                     kMinTokenizerVocabSize));
  SY_ASSIGN_OR_RETURN(const int64_t bytes_total, total_file_bytes(options.inputs));

  // Sentences stream from the inputs one document at a time; an error stops the
  // stream and is reported after SentencePiece returns.
  const auto start = std::chrono::steady_clock::now();
  absl::Status read_status;
  DataProgress progress;
  progress.stage = "tokenizer";
  progress.bytes_total = bytes_total;
  int64_t bytes_before = 0, sentences = 0;
  size_t input = 0;
  std::unique_ptr<DocumentReader> reader;
  int64_t reader_documents = 0;
  std::string document;
  size_t line_start = 0;
  auto report = [&](bool finished) {
    progress.bytes_done = bytes_before + (reader ? reader->disk_bytes_read() : 0);
    progress.elapsed_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    progress.finished = finished;
    sink.on_progress(progress);
  };
  auto next_sentence = [&](std::string* sentence) -> bool {
    while (true) {
      while (line_start < document.size()) {
        size_t end = document.find('\n', line_start);
        if (end == std::string::npos) end = document.size();
        sentence->assign(document, line_start, end - line_start);
        line_start = end + 1;
        if (!sentence->empty()) {
          ++sentences;
          return true;
        }
      }
      if (!reader) {
        if (input == options.inputs.size()) return false;
        absl::StatusOr<std::unique_ptr<DocumentReader>> opened =
            DocumentReader::open(options.inputs[input], options.text_field);
        if (!opened.ok()) {
          read_status = opened.status();
          return false;
        }
        reader = std::move(*opened);
        reader_documents = 0;
      }
      absl::StatusOr<bool> more = reader->next(&document);
      line_start = 0;
      if (!more.ok()) {
        read_status = more.status();
        return false;
      }
      if (*more) {
        ++reader_documents;
        if (++progress.documents % 1024 == 0) report(false);
        continue;
      }
      if (reader_documents == 0) {
        read_status = absl::InvalidArgumentError(absl::StrCat(reader->path(), ": holds no text"));
        return false;
      }
      bytes_before += reader->disk_bytes_read();
      reader.reset();
      document.clear();
      ++input;
    }
  };

  spm::TrainSpec spec;
  spec.model_type = options.model_type;
  spec.vocab_size = options.vocab_size;
  spec.num_threads =
      options.threads > 0 ? options.threads : static_cast<int>(std::thread::hardware_concurrency());
  spec.max_sentences = options.max_sentences;
  spec.seed = options.seed;
  std::string model;
  const std::string error = spm::train(spec, next_sentence, &model);
  SY_RETURN_IF_ERROR(read_status);
  if (!error.empty())
    return absl::InvalidArgumentError(absl::StrCat("training the tokenizer failed: ", error));
  report(true);
  // Loading checks the result and gives the sink the numbers it reports.
  SY_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::from_bytes(model, out_path));
  SY_RETURN_IF_ERROR(write_file_atomically(out_path, model));
  sink.on_message(absl::StrCat("tokenizer: ", options.model_type, ", ", tokenizer.vocab_size(),
                               " pieces, trained on ", sentences, " lines; sha256 ",
                               tokenizer.sha256(), "; written to ", out_path));
  return absl::OkStatus();
}

absl::StatusOr<Tokenizer> Tokenizer::load(const std::string& path) {
  SY_ASSIGN_OR_RETURN(std::string bytes, read_file(path));
  return from_bytes(std::move(bytes), path);
}

absl::StatusOr<Tokenizer> Tokenizer::from_bytes(std::string model_bytes, const std::string& name) {
  if (model_bytes.empty())
    return absl::InvalidArgumentError(absl::StrCat(name, ": is empty, not a SentencePiece model"));
  if (static_cast<int64_t>(model_bytes.size()) > kMaxMetadataFileBytes)
    return absl::InvalidArgumentError(absl::StrCat(name, ": is ", model_bytes.size(),
                                                   " bytes, more than the ", kMaxMetadataFileBytes,
                                                   " allowed"));
  auto model = std::make_shared<spm::Model>();
  const std::string error = model->load(model_bytes);
  if (!error.empty())
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": not a SentencePiece model (", error, ")"));
  if (model->piece_size() > kMaxVocabSize)
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": has ", model->piece_size(), " pieces, more than the ", kMaxVocabSize, " allowed"));
  Tokenizer t;
  t.model_ = std::move(model);
  t.sha256_ = sha256_hex(model_bytes);
  t.model_bytes_ = std::make_shared<const std::string>(std::move(model_bytes));
  return t;
}

int64_t Tokenizer::vocab_size() const { return model_->piece_size(); }

SpecialTokenIds Tokenizer::special_ids() const {
  return {model_->unk_id(), model_->bos_id(), model_->eos_id(), model_->pad_id()};
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  model_->encode(text, &ids);
  return ids;
}

void Tokenizer::encode_append(std::string_view text, std::vector<int32_t>* ids) const {
  model_->encode(text, ids);
}

absl::StatusOr<std::string> Tokenizer::decode(absl::Span<const int32_t> ids) const {
  std::string text;
  const std::string error = model_->decode(ids.data(), ids.size(), &text);
  if (!error.empty()) return absl::InvalidArgumentError(error);
  return text;
}

}  // namespace switchyard
