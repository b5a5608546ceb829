#include "data/prepare.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "data/chat_template.h"
#include "data/conversation.h"
#include "data/dataset_index.h"
#include "data/document_reader.h"
#include "engine/runtime/file_util.h"
#include "data/sha256.h"
#include "data/token_shard.h"
#include "data/tokenizer.h"
#include "engine/runtime/status_macros.h"

namespace switchyard {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kBatchBytes = 1 << 20;  // text per encoding task
constexpr char kTokenizerFileName[] = "tokenizer.model";
constexpr const char* kSplitNames[2] = {"train", "val"};

struct TextBatch {
  std::vector<std::string> documents;
  std::vector<Conversation> conversations;  // instead, with a chat template
  int64_t bytes_done = 0;  // input bytes read when the batch was complete
};

struct EncodedBatch {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;  // the ids' loss mask, with a chat template; else empty
  std::vector<int64_t> ends;  // end of each document in ids, its eos included
  int64_t bytes_done = 0;
};

EncodedBatch encode_batch(const Tokenizer& tokenizer, int32_t eos, const ChatTemplate* chat,
                          TextBatch batch) {
  EncodedBatch out;
  out.bytes_done = batch.bytes_done;
  out.ends.reserve(batch.documents.size() + batch.conversations.size());
  for (const std::string& document : batch.documents) {
    tokenizer.encode_append(document, &out.ids);
    out.ids.push_back(eos);
    out.ends.push_back(static_cast<int64_t>(out.ids.size()));
  }
  for (const Conversation& conversation : batch.conversations) {
    const size_t begin = out.ids.size();
    chat->render(conversation, tokenizer, &out.ids, &out.mask);
    if (out.ids.size() == begin || out.ids.back() != eos) {
      out.ids.push_back(eos);
      out.mask.push_back(0);
    }
    out.ends.push_back(static_cast<int64_t>(out.ids.size()));
  }
  return out;
}

// Encoding threads that live for the whole run, so that each keeps its tokenizer's
// per-thread word cache warm from batch to batch.
class EncoderPool {
 public:
  EncoderPool(int threads, const Tokenizer& tokenizer, int32_t eos, const ChatTemplate* chat)
      : chat_(chat) {
    for (int t = 0; t < threads; ++t)
      workers_.emplace_back([this, &tokenizer, eos] {
        while (true) {
          std::packaged_task<EncodedBatch(const Tokenizer&, int32_t)> task;
          {
            std::unique_lock<std::mutex> lock(mutex_);
            ready_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
            if (tasks_.empty()) return;
            task = std::move(tasks_.front());
            tasks_.pop_front();
          }
          task(tokenizer, eos);
        }
      });
  }
  ~EncoderPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_all();
    for (std::thread& worker : workers_) worker.join();
  }

  std::future<EncodedBatch> submit(TextBatch batch) {
    std::packaged_task<EncodedBatch(const Tokenizer&, int32_t)> task(
        [batch = std::move(batch), chat = chat_](const Tokenizer& tokenizer, int32_t eos) mutable {
          return encode_batch(tokenizer, eos, chat, std::move(batch));
        });
    std::future<EncodedBatch> result = task.get_future();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      tasks_.push_back(std::move(task));
    }
    ready_.notify_one();
    return result;
  }

 private:
  const ChatTemplate* chat_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::packaged_task<EncodedBatch(const Tokenizer&, int32_t)>> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

// The shards of one split, under temporary names until publish().
class SplitWriter {
 public:
  SplitWriter(const std::string& dir, const char* split, const ShardAttributes& attributes,
              int64_t shard_tokens)
      : dir_(dir), split_(split), attributes_(attributes), shard_tokens_(shard_tokens) {}

  // `mask`: the ids' loss mask, or null (all carry loss).
  absl::Status append(const int32_t* ids, int64_t count, const uint8_t* mask) {
    if (!writer_) {
      temp_paths_.push_back(
          (fs::path(dir_) / absl::StrFormat(".%s-%05d.h5.partial", split_, temp_paths_.size()))
              .string());
      SY_ASSIGN_OR_RETURN(writer_, ShardWriter::create(temp_paths_.back(), attributes_));
    }
    SY_RETURN_IF_ERROR(writer_->append_document(ids, count, mask));
    ++documents_;
    tokens_ += count;
    if (writer_->num_tokens() >= shard_tokens_) return close_shard();
    return absl::OkStatus();
  }

  absl::Status close_shard() {
    if (!writer_) return absl::OkStatus();
    entries_.push_back({"", writer_->num_tokens(), writer_->num_documents(), 0, ""});
    absl::Status status = writer_->close();
    writer_.reset();
    return status;
  }

  // Renames the finished shards to their final names and describes them for the index.
  absl::StatusOr<std::vector<ShardEntry>> publish() {
    SY_RETURN_IF_ERROR(close_shard());
    const int64_t count = static_cast<int64_t>(entries_.size());
    for (int64_t i = 0; i < count; ++i) {
      ShardEntry& e = entries_[i];
      e.file = shard_file_name(split_, i, count);
      const std::string path = (fs::path(dir_) / e.file).string();
      SY_ASSIGN_OR_RETURN(e.sha256, sha256_file(temp_paths_[i]));
      std::error_code ec;
      e.bytes = static_cast<int64_t>(fs::file_size(temp_paths_[i], ec));
      if (!ec) fs::rename(temp_paths_[i], path, ec);
      if (ec)
        return absl::InternalError(absl::StrCat(path, ": cannot move into place: ", ec.message()));
    }
    temp_paths_.clear();
    return entries_;
  }

  // Removes what an unfinished run left.
  void discard() {
    writer_.reset();
    std::error_code ec;
    for (const std::string& path : temp_paths_) fs::remove(path, ec);
  }

  int64_t documents() const { return documents_; }
  int64_t tokens() const { return tokens_; }
  int64_t shards() const { return static_cast<int64_t>(entries_.size()); }

 private:
  std::string dir_;
  const char* split_;
  ShardAttributes attributes_;
  int64_t shard_tokens_;
  std::unique_ptr<ShardWriter> writer_;
  std::vector<std::string> temp_paths_;
  std::vector<ShardEntry> entries_;
  int64_t documents_ = 0;
  int64_t tokens_ = 0;
};

absl::Status check_options(const PrepareOptions& options) {
  if (options.inputs.empty()) return absl::InvalidArgumentError("no input files given");
  if (!(options.val_fraction >= 0 && options.val_fraction < 1))
    return absl::InvalidArgumentError(
        absl::StrCat("--val-fraction ", options.val_fraction, " is not in [0, 1)"));
  if (options.shard_tokens < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("--shard-tokens ", options.shard_tokens, " is not positive"));
  if (options.out_dir.empty()) return absl::InvalidArgumentError("no output directory given");
  std::error_code ec;
  if (fs::exists(fs::path(options.out_dir) / kIndexFileName, ec))
    return absl::AlreadyExistsError(absl::StrCat(
        options.out_dir, ": already holds a dataset (index.json); choose another directory"));
  fs::create_directories(options.out_dir, ec);
  if (ec || !fs::is_directory(options.out_dir, ec))
    return absl::PermissionDeniedError(
        absl::StrCat(options.out_dir, ": cannot create the directory"));
  return absl::OkStatus();
}

// Reads the next document (or, with a chat template, conversation) of `reader` into
// `batch`, returning its size in bytes; 0 at the end of the file.
absl::StatusOr<int64_t> read_document(DocumentReader& reader, const ChatTemplate* chat,
                                      TextBatch& batch) {
  std::string text;
  if (chat == nullptr) {
    SY_ASSIGN_OR_RETURN(const bool more, reader.next(&text));
    if (!more) return 0;
    const int64_t bytes = std::max<int64_t>(1, static_cast<int64_t>(text.size()));
    batch.documents.push_back(std::move(text));
    return bytes;
  }
  SY_ASSIGN_OR_RETURN(const bool more, reader.next_record(&text));
  if (!more) return 0;
  const std::string where = absl::StrCat(reader.path(), ":", reader.line_number());
  SY_ASSIGN_OR_RETURN(Conversation conversation, parse_conversation(text, where));
  SY_RETURN_IF_ERROR(chat->check(conversation, where));
  batch.conversations.push_back(std::move(conversation));
  return std::max<int64_t>(1, static_cast<int64_t>(text.size()));
}

absl::StatusOr<PrepareSummary> run_prepare(const PrepareOptions& options,
                                           const Tokenizer& tokenizer, const ChatTemplate* chat,
                                           SplitWriter* writers, DataProgressSink& sink) {
  const auto start = std::chrono::steady_clock::now();
  PrepareSummary summary;
  SY_ASSIGN_OR_RETURN(summary.input_bytes, total_file_bytes(options.inputs));
  const int32_t eos = static_cast<int32_t>(tokenizer.special_ids().eos);
  const int threads =
      options.threads > 0 ? options.threads : static_cast<int>(std::thread::hardware_concurrency());

  DataProgress progress;
  progress.stage = "prepare";
  progress.bytes_total = summary.input_bytes;
  int64_t document_index = 0;
  auto write_batch = [&](const EncodedBatch& batch) -> absl::Status {
    int64_t begin = 0;
    for (const int64_t end : batch.ends) {
      const int64_t i = document_index++;
      const bool val = static_cast<int64_t>(static_cast<double>(i + 1) * options.val_fraction) >
                       static_cast<int64_t>(static_cast<double>(i) * options.val_fraction);
      SY_RETURN_IF_ERROR(writers[val ? 1 : 0].append(
          batch.ids.data() + begin, end - begin, batch.mask.empty() ? nullptr : batch.mask.data() + begin));
      begin = end;
    }
    progress.bytes_done = batch.bytes_done;
    progress.documents = document_index;
    progress.tokens += static_cast<int64_t>(batch.ids.size());
    progress.elapsed_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    sink.on_progress(progress);
    return absl::OkStatus();
  };

  // Reading and writing stay on this thread, in order; `threads` workers encode, with
  // one batch more in flight than workers so that none waits for the reader.
  EncoderPool pool(threads, tokenizer, eos, chat);
  std::deque<std::future<EncodedBatch>> encoding;
  auto launch = [&](TextBatch batch) -> absl::Status {
    if (static_cast<int>(encoding.size()) > threads) {
      SY_RETURN_IF_ERROR(write_batch(encoding.front().get()));
      encoding.pop_front();
    }
    encoding.push_back(pool.submit(std::move(batch)));
    return absl::OkStatus();
  };

  TextBatch batch;
  int64_t batch_bytes = 0, files_bytes = 0;
  for (const std::string& input : options.inputs) {
    SY_ASSIGN_OR_RETURN(std::unique_ptr<DocumentReader> reader,
                        DocumentReader::open(input, options.text_field));
    if (chat && reader->format() != TextFormat::kJsonLines)
      return absl::InvalidArgumentError(absl::StrCat(
          input, ": --chat-template reads JSON Lines conversations (.jsonl or .json, .gz too)"));
    int64_t documents = 0;
    while (true) {
      SY_ASSIGN_OR_RETURN(const int64_t bytes, read_document(*reader, chat, batch));
      if (bytes == 0) break;
      ++documents;
      batch_bytes += bytes;
      if (batch_bytes >= kBatchBytes) {
        batch.bytes_done = files_bytes + reader->disk_bytes_read();
        SY_RETURN_IF_ERROR(launch(std::move(batch)));
        batch = TextBatch();
        batch_bytes = 0;
      }
    }
    if (documents == 0) return absl::InvalidArgumentError(absl::StrCat(input, ": holds no text"));
    files_bytes += reader->disk_bytes_read();
  }
  batch.bytes_done = files_bytes;
  if (!batch.documents.empty() || !batch.conversations.empty())
    SY_RETURN_IF_ERROR(launch(std::move(batch)));
  while (!encoding.empty()) {
    SY_RETURN_IF_ERROR(write_batch(encoding.front().get()));
    encoding.pop_front();
  }

  // A fraction asked for and none held out: training would have nothing to evaluate on.
  if (options.val_fraction > 0 && writers[1].documents() == 0)
    return absl::InvalidArgumentError(absl::StrCat(
        options.inputs.size() == 1 ? options.inputs.front()
                                   : absl::StrCat(options.inputs.size(), " input files"),
        ": ", document_index, " documents are too few to hold out a validation fraction of ",
        options.val_fraction, " (none would be held out): raise it (data prepare "
        "--val-fraction, a recipe's data.val_fraction), or make it 0 for no validation split "
        "and train with train.eval_interval=0"));
  DatasetIndex index;
  index.format_version = kTokenFormatVersion;
  index.tokenizer_sha256 = tokenizer.sha256();
  index.tokenizer_file = kTokenizerFileName;
  index.vocab_size = tokenizer.vocab_size();
  index.special_ids = tokenizer.special_ids();
  for (int s = 0; s < 2; ++s) {
    SY_ASSIGN_OR_RETURN(index.splits[kSplitNames[s]], writers[s].publish());
    summary.documents[s] = writers[s].documents();
    summary.tokens[s] = writers[s].tokens();
    summary.shards[s] = writers[s].shards();
  }
  SY_RETURN_IF_ERROR(write_file_atomically(
      (fs::path(options.out_dir) / kTokenizerFileName).string(), tokenizer.model_bytes()));
  SY_RETURN_IF_ERROR(write_dataset_index(options.out_dir, index));
  SY_RETURN_IF_ERROR(fsync_path(options.out_dir));
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  progress.elapsed_s = summary.seconds;
  progress.finished = true;
  sink.on_progress(progress);
  return summary;
}

}  // namespace

absl::StatusOr<PrepareSummary> prepare_dataset(const PrepareOptions& options,
                                               DataProgressSink& sink) {
  SY_ASSIGN_OR_RETURN(const Tokenizer tokenizer, Tokenizer::load(options.tokenizer_path));
  if (tokenizer.special_ids().eos < 0)
    return absl::InvalidArgumentError(
        absl::StrCat(options.tokenizer_path, ": the tokenizer has no end-of-document (eos) piece"));
  std::optional<ChatTemplate> chat;
  if (!options.chat_template.empty()) {
    SY_ASSIGN_OR_RETURN(chat, ChatTemplate::load(options.chat_template));
    SY_RETURN_IF_ERROR(chat->check_tokenizer(tokenizer));
  }
  std::error_code ec;
  const bool dir_existed = fs::exists(options.out_dir, ec);
  SY_RETURN_IF_ERROR(check_options(options));
  ShardAttributes attributes;
  attributes.tokenizer_sha256 = tokenizer.sha256();
  attributes.vocab_size = tokenizer.vocab_size();
  attributes.special_ids = tokenizer.special_ids();
  SplitWriter writers[2] = {
      SplitWriter(options.out_dir, kSplitNames[0], attributes, options.shard_tokens),
      SplitWriter(options.out_dir, kSplitNames[1], attributes, options.shard_tokens)};
  absl::StatusOr<PrepareSummary> summary =
      run_prepare(options, tokenizer, chat ? &*chat : nullptr, writers, sink);
  if (!summary.ok()) {
    for (SplitWriter& writer : writers) writer.discard();
    if (!dir_existed) fs::remove(options.out_dir, ec);  // only if empty
  }
  return summary;
}

}  // namespace switchyard
