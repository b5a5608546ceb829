#include "data/prepare.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/runtime/file_util.h"
#include "core/runtime/status_macros.h"
#include "data/chat_template.h"
#include "data/conversation.h"
#include "data/dataset_index.h"
#include "data/document_reader.h"
#include "data/sha256.h"
#include "data/token_shard.h"
#include "data/tokenizer.h"

namespace switchyard {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kBatchBytes = 1 << 20;  // text per encoding task

struct TextBatch {
  std::vector<std::string> documents;
  std::vector<Conversation> conversations;  // instead, with a chat template
  std::vector<uint8_t> splits;  // each document's split: 0 train, 1 val
  int64_t bytes_done = 0;  // input bytes read when the batch was complete
};

struct EncodedBatch {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;  // the ids' loss mask, with a chat template; else empty
  std::vector<int64_t> ends;  // end of each document in ids, its eos included
  std::vector<uint8_t> splits;
  int64_t bytes_done = 0;
};

EncodedBatch encode_batch(const Tokenizer& tokenizer, int32_t eos, const ChatTemplate* chat,
                          TextBatch batch) {
  EncodedBatch out;
  out.bytes_done = batch.bytes_done;
  out.splits = std::move(batch.splits);
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

// The shards of one split of one part, under their part names (data/prepare_parts.h).
// Each complete shard is appended, with its size and sha256, to the part's list.
class SplitWriter {
 public:
  SplitWriter(std::string dir, PartId part, int split, const ShardAttributes& attributes,
              int64_t shard_tokens, std::vector<ShardEntry>* complete)
      : dir_(std::move(dir)), part_(part), split_(split), attributes_(attributes),
        shard_tokens_(shard_tokens), complete_(complete) {}

  // Appends one document; true when that completed a shard. `mask`: the ids' loss mask,
  // or null (all carry loss).
  absl::StatusOr<bool> append(const int32_t* ids, int64_t count, const uint8_t* mask) {
    if (!writer_) {
      SY_ASSIGN_OR_RETURN(writer_, ShardWriter::create(open_path(), attributes_));
    }
    SY_RETURN_IF_ERROR(writer_->append_document(ids, count, mask));
    if (writer_->num_tokens() < shard_tokens_) return false;
    SY_RETURN_IF_ERROR(close_shard().status());
    return true;
  }

  // Completes the open shard, if any; true when there was one.
  absl::StatusOr<bool> close_shard() {
    if (!writer_) return false;
    ShardEntry e{part_shard_name(part_, split_, static_cast<int64_t>(complete_->size())),
                 writer_->num_tokens(), writer_->num_documents(), 0, ""};
    const absl::Status closed = writer_->close();
    writer_.reset();
    SY_RETURN_IF_ERROR(closed);
    const std::string path = (fs::path(dir_) / e.file).string();
    SY_ASSIGN_OR_RETURN(e.bytes, regular_file_size(path));
    SY_ASSIGN_OR_RETURN(e.sha256, sha256_file(path));
    complete_->push_back(std::move(e));
    return true;
  }

  // Removes the open shard's file.
  void discard() {
    if (!writer_) return;
    writer_.reset();
    std::error_code ec;
    fs::remove(open_path(), ec);
  }

 private:
  std::string open_path() const {
    return (fs::path(dir_) / part_shard_name(part_, split_, static_cast<int64_t>(complete_->size())))
        .string();
  }

  std::string dir_;
  PartId part_;
  int split_;
  ShardAttributes attributes_;
  int64_t shard_tokens_;
  std::vector<ShardEntry>* complete_;
  std::unique_ptr<ShardWriter> writer_;
};

absl::Status check_options(const PrepareOptions& options, PartId part) {
  if (options.inputs.empty()) return absl::InvalidArgumentError("no input files given");
  if (!(options.val_fraction >= 0 && options.val_fraction < 1))
    return absl::InvalidArgumentError(
        absl::StrCat("--val-fraction ", options.val_fraction, " is not in [0, 1)"));
  if (options.shard_tokens < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("--shard-tokens ", options.shard_tokens, " is not positive"));
  if (part.count > static_cast<int64_t>(options.inputs.size()))
    return absl::InvalidArgumentError(absl::StrCat(
        "--part ", part.index, "/", part.count, ": parts divide the inputs by file, and there are ",
        options.inputs.size(), " input files; use at most ", options.inputs.size(), " parts"));
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

// What the dataset depends on (data/prepare_parts.h's PartRecord::arguments); the thread
// count is not part of it.
absl::StatusOr<nlohmann::json> prepare_arguments(const PrepareOptions& options,
                                                 const Tokenizer& tokenizer, PartId part) {
  nlohmann::json a;
  a["tokenizer_sha256"] = tokenizer.sha256();
  a["chat_template_sha256"] = "";
  if (!options.chat_template.empty()) {
    SY_ASSIGN_OR_RETURN(a["chat_template_sha256"], sha256_file(options.chat_template));
  }
  a["val_fraction"] = options.val_fraction;
  a["shard_tokens"] = options.shard_tokens;
  a["text_field"] = options.text_field;
  a["parts"] = part.count;
  a["inputs"] = nlohmann::json::array();
  for (const std::string& input : options.inputs) {
    struct stat st;
    if (::stat(input.c_str(), &st) != 0)
      return absl::NotFoundError(absl::StrCat(input, ": cannot read: ", errno_reason()));
    a["inputs"].push_back({{"path", input},
                           {"bytes", static_cast<int64_t>(st.st_size)},
                           {"mtime_ns", int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec}});
  }
  return a;
}

// Checks that the shards an earlier run recorded are still those it recorded.
absl::Status check_recorded_shards(const std::string& dir, const PartRecord& record) {
  for (const std::vector<ShardEntry>& shards : record.shards)
    for (const ShardEntry& e : shards) {
      const std::string path = (fs::path(dir) / e.file).string();
      if (!holds_recorded_shard(path, e))
        return absl::DataLossError(absl::StrCat(
            path, ": missing or not the shard ", part_record_name(record.id),
            " records; remove ", dir, " (or choose another --out) to start over"));
    }
  return absl::OkStatus();
}

// One part's run: its options, its record (an earlier run's, to resume, or a new one).
struct PartJob {
  const PrepareOptions& options;
  const Tokenizer& tokenizer;
  const ChatTemplate* chat;
  std::string record_path;
  PartRecord record;
  bool resuming = false;
};

absl::Status start_part(PartJob& job) {
  const std::string& dir = job.options.out_dir;
  SY_ASSIGN_OR_RETURN(job.record.arguments,
                      prepare_arguments(job.options, job.tokenizer, job.record.id));
  job.record.fingerprint = fingerprint_of(job.record.arguments);
  job.record.val_fraction = job.options.val_fraction;
  job.record.tokenizer_sha256 = job.tokenizer.sha256();
  SY_ASSIGN_OR_RETURN(const std::vector<int64_t> counts, part_counts_in(dir));
  for (const int64_t count : counts)
    if (count != job.record.id.count)
      return absl::FailedPreconditionError(absl::StrCat(
          dir, ": holds the parts of a prepare split into ", count, " (part-*-of-",
          absl::StrFormat("%05d", count), ".json); finish and merge those, or choose another --out"));
  job.record_path = (fs::path(dir) / part_record_name(job.record.id)).string();
  std::error_code ec;
  if (!fs::exists(job.record_path, ec)) return absl::OkStatus();
  SY_ASSIGN_OR_RETURN(PartRecord earlier, read_part_record(job.record_path));
  if (earlier.fingerprint != job.record.fingerprint || earlier.id.index != job.record.id.index)
    return absl::FailedPreconditionError(absl::StrCat(
        job.record_path, ": a prepare made with other arguments, tokenizer, template or "
        "inputs (changed since) is in ", dir, "; rerun it as it was, or remove ", dir,
        " (or choose another --out) to start over"));
  // A finished part's shards are merge_parts' to check: an interrupted merge may have
  // moved some to their dataset names.
  if (!earlier.finished) SY_RETURN_IF_ERROR(check_recorded_shards(dir, earlier));
  job.record = std::move(earlier);
  job.resuming = true;
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

// Passes over the next document without encoding it; false at the end of the file.
absl::StatusOr<bool> skip_document(DocumentReader& reader, const ChatTemplate* chat) {
  std::string text;
  return chat ? reader.next_record(&text) : reader.next(&text);
}

absl::StatusOr<std::unique_ptr<DocumentReader>> open_input(const std::string& input,
                                                           const PrepareOptions& options,
                                                           const ChatTemplate* chat) {
  SY_ASSIGN_OR_RETURN(std::unique_ptr<DocumentReader> reader,
                      DocumentReader::open(input, options.text_field));
  if (chat && reader->format() != TextFormat::kJsonLines)
    return absl::InvalidArgumentError(absl::StrCat(
        input, ": --chat-template reads JSON Lines conversations (.jsonl or .json, .gz too)"));
  return reader;
}

// The documents of `files` (those before a part's), read but not encoded.
absl::StatusOr<int64_t> count_documents(const std::vector<std::string>& files,
                                        const PrepareOptions& options, const ChatTemplate* chat,
                                        DataProgressSink& sink) {
  const auto start = std::chrono::steady_clock::now();
  DataProgress progress;
  progress.stage = "count";
  SY_ASSIGN_OR_RETURN(progress.bytes_total, total_file_bytes(files));
  int64_t files_bytes = 0;
  for (const std::string& input : files) {
    SY_ASSIGN_OR_RETURN(std::unique_ptr<DocumentReader> reader, open_input(input, options, chat));
    while (true) {
      SY_ASSIGN_OR_RETURN(const bool more, skip_document(*reader, chat));
      if (!more) break;
      if (++progress.documents % 4096 != 0) continue;
      progress.bytes_done = files_bytes + reader->disk_bytes_read();
      progress.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      sink.on_progress(progress);
    }
    files_bytes += reader->disk_bytes_read();
  }
  progress.bytes_done = files_bytes;
  progress.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  progress.finished = true;
  sink.on_progress(progress);
  return progress.documents;
}

int64_t documents_in(const std::vector<ShardEntry>& shards) {
  int64_t documents = 0;
  for (const ShardEntry& e : shards) documents += e.documents;
  return documents;
}

// Encodes the part's documents that its complete shards do not hold yet, in input order,
// and writes them to the shards of their splits, recording each complete shard.
class PartRun {
 public:
  PartRun(PartJob& job, SplitWriter* writers, DataProgressSink& sink)
      : job_(job), writers_(writers), sink_(sink) {}

  absl::Status run() {
    const PartRecord& record = job_.record;
    const auto [first, end] = part_inputs(job_.options.inputs.size(), record.id);
    inputs_.assign(job_.options.inputs.begin() + first, job_.options.inputs.begin() + end);
    for (int s = 0; s < 2; ++s) done_[s] = documents_in(record.shards[s]);
    if (!job_.resuming && first > 0) {
      const std::vector<std::string> before(job_.options.inputs.begin(),
                                            job_.options.inputs.begin() + first);
      SY_ASSIGN_OR_RETURN(job_.record.first_document,
                          count_documents(before, job_.options, job_.chat, sink_));
    }
    SY_ASSIGN_OR_RETURN(progress_.bytes_total, total_file_bytes(inputs_));
    progress_.stage = "prepare";
    start_ = std::chrono::steady_clock::now();
    const int threads = job_.options.threads > 0
                            ? job_.options.threads
                            : static_cast<int>(std::thread::hardware_concurrency());
    EncoderPool pool(threads, job_.tokenizer, static_cast<int32_t>(job_.tokenizer.special_ids().eos),
                     job_.chat);
    SY_RETURN_IF_ERROR(read_inputs(pool, threads));
    while (!encoding_.empty()) {
      SY_RETURN_IF_ERROR(write_batch(encoding_.front().get()));
      encoding_.pop_front();
    }
    for (int s = 0; s < 2; ++s) SY_RETURN_IF_ERROR(writers_[s].close_shard().status());
    progress_.finished = true;
    sink_.on_progress(progress_);
    return absl::OkStatus();
  }

  int64_t documents() const { return documents_; }
  // Tokens this run encoded, and those of them that carry loss.
  int64_t tokens() const { return progress_.tokens; }
  int64_t loss_tokens() const { return loss_tokens_; }
  // The loss-carrying tokens that are the end-of-sequence token (chat templates' {eos}).
  int64_t loss_eos_tokens() const { return loss_eos_tokens_; }

 private:
  // Reading stays on this thread, in order; `threads` workers encode, with one batch more
  // in flight than workers so that none waits for the reader.
  absl::Status read_inputs(EncoderPool& pool, int threads) {
    TextBatch batch;
    int64_t batch_bytes = 0, files_bytes = 0;
    bool encoding = false;
    for (const std::string& input : inputs_) {
      SY_ASSIGN_OR_RETURN(std::unique_ptr<DocumentReader> reader,
                          open_input(input, job_.options, job_.chat));
      int64_t file_documents = 0;
      while (true) {
        const int s = is_val_document(job_.record.first_document + documents_,
                                      job_.options.val_fraction) ? 1 : 0;
        if (seen_[s] < done_[s]) {
          SY_ASSIGN_OR_RETURN(const bool more, skip_document(*reader, job_.chat));
          if (!more) break;
        } else {
          if (!encoding) start_encoding(files_bytes + reader->disk_bytes_read());
          encoding = true;
          SY_ASSIGN_OR_RETURN(const int64_t bytes, read_document(*reader, job_.chat, batch));
          if (bytes == 0) break;
          batch.splits.push_back(static_cast<uint8_t>(s));
          batch_bytes += bytes;
        }
        ++seen_[s];
        ++documents_;
        ++file_documents;
        if (batch_bytes >= kBatchBytes) {
          batch.bytes_done = files_bytes + reader->disk_bytes_read();
          SY_RETURN_IF_ERROR(launch(pool, threads, std::move(batch)));
          batch = TextBatch();
          batch_bytes = 0;
        }
      }
      if (file_documents == 0) return absl::InvalidArgumentError(absl::StrCat(input, ": holds no text"));
      files_bytes += reader->disk_bytes_read();
    }
    batch.bytes_done = files_bytes;
    if (!batch.splits.empty()) SY_RETURN_IF_ERROR(launch(pool, threads, std::move(batch)));
    return absl::OkStatus();
  }

  // From here on the progress (and its ETA) counts only the bytes that are encoded.
  void start_encoding(int64_t bytes_skipped) {
    bytes_skipped_ = bytes_skipped;
    progress_.bytes_total -= bytes_skipped;
    start_ = std::chrono::steady_clock::now();
  }

  absl::Status launch(EncoderPool& pool, int threads, TextBatch batch) {
    if (static_cast<int>(encoding_.size()) > threads) {
      SY_RETURN_IF_ERROR(write_batch(encoding_.front().get()));
      encoding_.pop_front();
    }
    encoding_.push_back(pool.submit(std::move(batch)));
    return absl::OkStatus();
  }

  absl::Status write_batch(const EncodedBatch& batch) {
    int64_t begin = 0;
    bool completed = false;
    for (size_t d = 0; d < batch.ends.size(); ++d) {
      const int64_t end = batch.ends[d];
      SY_ASSIGN_OR_RETURN(const bool closed,
                          writers_[batch.splits[d]].append(
                              batch.ids.data() + begin, end - begin,
                              batch.mask.empty() ? nullptr : batch.mask.data() + begin));
      completed = completed || closed;
      begin = end;
      ++progress_.documents;
    }
    if (completed) SY_RETURN_IF_ERROR(record_shards());
    progress_.bytes_done = batch.bytes_done - bytes_skipped_;
    progress_.tokens += static_cast<int64_t>(batch.ids.size());
    loss_tokens_ += batch.mask.empty() ? static_cast<int64_t>(batch.ids.size())
                                       : std::count(batch.mask.begin(), batch.mask.end(), 1);
    const int32_t eos = static_cast<int32_t>(job_.tokenizer.special_ids().eos);
    for (size_t i = 0; i < batch.mask.size(); ++i)
      loss_eos_tokens_ += batch.mask[i] == 1 && batch.ids[i] == eos;
    progress_.elapsed_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    sink_.on_progress(progress_);
    return absl::OkStatus();
  }

  absl::Status record_shards() {
    PartRecord& record = job_.record;
    record.documents = documents_in(record.shards[0]) + documents_in(record.shards[1]);
    return write_part_record(job_.record_path, record);
  }

  PartJob& job_;
  SplitWriter* writers_;
  DataProgressSink& sink_;
  std::vector<std::string> inputs_;
  int64_t done_[2] = {0, 0};  // documents of each split in shards complete before this run
  int64_t seen_[2] = {0, 0};  // documents of each split read so far
  int64_t documents_ = 0;     // documents of the part read so far
  std::deque<std::future<EncodedBatch>> encoding_;
  DataProgress progress_;
  int64_t loss_tokens_ = 0;
  int64_t loss_eos_tokens_ = 0;
  int64_t bytes_skipped_ = 0;
  std::chrono::steady_clock::time_point start_;
};

// Runs the part to its end and records it finished; part 0 also copies the tokenizer in.
absl::Status run_part(PartJob& job, DataProgressSink& sink) {
  PartRecord& record = job.record;
  if (job.resuming)
    sink.on_message(absl::StrFormat(
        "resuming %s: %d train and %d val shards complete (%d documents); reading past them "
        "without encoding",
        job.record_path, record.shards[0].size(), record.shards[1].size(),
        documents_in(record.shards[0]) + documents_in(record.shards[1])));
  ShardAttributes attributes;
  attributes.tokenizer_sha256 = job.tokenizer.sha256();
  attributes.vocab_size = job.tokenizer.vocab_size();
  attributes.special_ids = job.tokenizer.special_ids();
  SplitWriter writers[2] = {
      SplitWriter(job.options.out_dir, record.id, 0, attributes, job.options.shard_tokens, &record.shards[0]),
      SplitWriter(job.options.out_dir, record.id, 1, attributes, job.options.shard_tokens, &record.shards[1])};
  PartRun run(job, writers, sink);
  absl::Status status = run.run();
  if (status.ok() && run.tokens() > 0 && run.loss_tokens() == 0)
    status = absl::InvalidArgumentError(
        "--input: no token of the conversations carries loss (every message of the template's "
        "loss roles is empty): the dataset would train nothing");
  if (!status.ok()) {
    for (SplitWriter& writer : writers) writer.discard();
    return status;
  }
  if (run.loss_tokens() > 0 && run.loss_tokens() == run.loss_eos_tokens())
    sink.on_message(absl::StrFormat(
        "warning: --input: the only tokens that carry loss are the template's end-of-sequence "
        "tokens (%d, one per answer): every answer is empty, so the dataset trains a model to "
        "end its answer at once and nothing else",
        run.loss_tokens()));
  if (record.id.index == 0)
    SY_RETURN_IF_ERROR(write_file_atomically(
        (fs::path(job.options.out_dir) / kTokenizerFileName).string(), job.tokenizer.model_bytes()));
  record.finished = true;
  record.documents = run.documents();
  return write_part_record(job.record_path, record);
}

// Removes what a failed part wrote: its shards, its record and (part 0) the tokenizer.
void discard_part(const PartJob& job) {
  std::error_code ec;
  for (const std::vector<ShardEntry>& shards : job.record.shards)
    for (const ShardEntry& e : shards) fs::remove(fs::path(job.options.out_dir) / e.file, ec);
  if (!job.record_path.empty()) fs::remove(job.record_path, ec);
  if (job.record.id.index == 0) fs::remove(fs::path(job.options.out_dir) / kTokenizerFileName, ec);
}

void add_part_totals(const PartRecord& record, PrepareSummary* summary) {
  for (int s = 0; s < 2; ++s) {
    summary->documents[s] += documents_in(record.shards[s]);
    summary->shards[s] += static_cast<int64_t>(record.shards[s].size());
    for (const ShardEntry& e : record.shards[s]) summary->tokens[s] += e.tokens;
  }
}

}  // namespace

absl::StatusOr<PrepareSummary> prepare_dataset(const PrepareOptions& options,
                                               DataProgressSink& sink) {
  const auto start = std::chrono::steady_clock::now();
  SY_ASSIGN_OR_RETURN(const Tokenizer tokenizer, Tokenizer::load(options.tokenizer_path));
  if (tokenizer.special_ids().eos < 0)
    return absl::InvalidArgumentError(
        absl::StrCat(options.tokenizer_path, ": the tokenizer has no end-of-document (eos) piece"));
  std::optional<ChatTemplate> chat;
  if (!options.chat_template.empty()) {
    SY_ASSIGN_OR_RETURN(chat, ChatTemplate::load(options.chat_template));
    SY_RETURN_IF_ERROR(chat->check_tokenizer(tokenizer));
  }
  const PartId id = options.part.value_or(PartId{});
  std::error_code ec;
  const bool dir_existed = fs::exists(options.out_dir, ec);
  SY_RETURN_IF_ERROR(check_options(options, id));
  PartJob job{options, tokenizer, chat ? &*chat : nullptr, "", PartRecord{}, false};
  job.record.id = id;
  absl::Status status = start_part(job);
  const bool started = status.ok();
  PrepareSummary summary;
  summary.shards_resumed =
      static_cast<int64_t>(job.record.shards[0].size() + job.record.shards[1].size());
  const auto [first, end] = part_inputs(options.inputs.size(), id);
  if (started) {
    const absl::StatusOr<int64_t> bytes = total_file_bytes(
        std::vector<std::string>(options.inputs.begin() + first, options.inputs.begin() + end));
    status = bytes.status();
    summary.input_bytes = bytes.value_or(0);
  }
  if (status.ok() && !job.record.finished) status = run_part(job, sink);
  if (status.ok() && !options.part) {
    absl::StatusOr<PrepareSummary> merged = merge_parts(options.out_dir, sink);
    status = merged.status();
    if (merged.ok()) {
      const PrepareSummary part = summary;
      summary = *merged;
      summary.input_bytes = part.input_bytes;
      summary.shards_resumed = part.shards_resumed;
    }
  } else if (status.ok()) {
    add_part_totals(job.record, &summary);
  }
  if (!status.ok()) {
    if (started) discard_part(job);
    if (!dir_existed) fs::remove(options.out_dir, ec);  // only if empty
    return status;
  }
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace switchyard
