#include "data/document_reader.h"

#include <zlib.h>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/runtime/status_macros.h"

namespace switchyard {
namespace {

constexpr size_t kReadBytes = 1 << 20;

}  // namespace

TextFormat text_format_for_path(const std::string& path) {
  std::string name = path;
  if (absl::EndsWith(name, ".gz")) name.resize(name.size() - 3);
  return absl::EndsWith(name, ".jsonl") || absl::EndsWith(name, ".json") ? TextFormat::kJsonLines
                                                                         : TextFormat::kPlainText;
}

absl::StatusOr<std::unique_ptr<DocumentReader>> DocumentReader::open(
    const std::string& path, const std::string& text_field) {
  std::unique_ptr<DocumentReader> reader(new DocumentReader());
  reader->path_ = path;
  reader->text_field_ = text_field;
  reader->format_ = text_format_for_path(path);
  gzFile gz = gzopen(path.c_str(), "rb");
  if (gz == nullptr) return absl::NotFoundError(absl::StrCat(path, ": cannot open the input file"));
  gzbuffer(gz, kReadBytes);
  reader->gz_ = gz;
  // Address space for the longest line a document may hold, touched only as far as the
  // input fills it: a long line grows in place instead of being copied to twice the size.
  reader->buffer_.reserve(kMaxDocumentBytes + kReadBytes);
  return reader;
}

DocumentReader::~DocumentReader() {
  if (gz_ != nullptr) gzclose(static_cast<gzFile>(gz_));
}

int64_t DocumentReader::disk_bytes_read() const {
  return static_cast<int64_t>(gzoffset(static_cast<gzFile>(gz_)));
}

absl::Status DocumentReader::fill() {
  buffer_.erase(0, buffer_pos_);
  buffer_pos_ = 0;
  const size_t old_size = buffer_.size();
  buffer_.resize(old_size + kReadBytes);
  gzFile gz = static_cast<gzFile>(gz_);
  const int n = gzread(gz, buffer_.data() + old_size, kReadBytes);
  int error = Z_OK;
  const char* message = gzerror(gz, &error);
  if (n < 0 || error != Z_OK)
    return absl::DataLossError(
        absl::StrCat(path_, ": cannot read (", message, "); is the gzip file truncated?"));
  buffer_.resize(old_size + std::max(n, 0));
  if (n == 0) eof_ = true;
  return absl::OkStatus();
}

absl::StatusOr<bool> DocumentReader::next_line(std::string* line) {
  while (true) {
    const size_t newline = buffer_.find('\n', buffer_pos_);
    if (newline != std::string::npos) {
      line->assign(buffer_, buffer_pos_, newline - buffer_pos_);
      buffer_pos_ = newline + 1;
      ++line_number_;
      return true;
    }
    if (static_cast<int64_t>(buffer_.size() - buffer_pos_) > kMaxDocumentBytes)
      return absl::InvalidArgumentError(absl::StrCat(path_, ":", line_number_ + 1,
                                                     ": a line longer than ", kMaxDocumentBytes,
                                                     " bytes (64 MiB), the most a document holds"));
    if (eof_) {
      if (buffer_pos_ == buffer_.size()) return false;
      line->assign(buffer_, buffer_pos_, std::string::npos);
      buffer_pos_ = buffer_.size();
      ++line_number_;
      return true;
    }
    SY_RETURN_IF_ERROR(fill());
  }
}

absl::StatusOr<bool> DocumentReader::next_record(std::string* line) {
  while (true) {
    SY_ASSIGN_OR_RETURN(const bool more, next_line(line));
    if (!more) return false;
    if (line->find_first_not_of(" \t\r") != std::string::npos) return true;
  }
}

absl::StatusOr<bool> DocumentReader::next(std::string* text) {
  std::string line;
  text->clear();
  if (format_ == TextFormat::kJsonLines) {
    while (true) {
      SY_ASSIGN_OR_RETURN(const bool more, next_record(&line));
      if (!more) return false;
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object())
        return absl::InvalidArgumentError(
            absl::StrCat(path_, ":", line_number_, ": not a JSON object"));
      const auto field = j.find(text_field_);
      if (field == j.end() || !field->is_string())
        return absl::InvalidArgumentError(
            absl::StrCat(path_, ":", line_number_, ": no string field \"", text_field_, "\""));
      *text = field->get<std::string>();
      if (!text->empty()) return true;
    }
  }
  while (true) {
    SY_ASSIGN_OR_RETURN(const bool more, next_line(&line));
    const bool blank = !more || line.empty() || line == "\r";
    if (blank) {
      if (!text->empty()) return true;
      if (!more) return false;
      continue;
    }
    if (!text->empty()) text->push_back('\n');
    text->append(line);
    if (static_cast<int64_t>(text->size()) > kMaxDocumentBytes)
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ":", line_number_, ": a paragraph longer than ", kMaxDocumentBytes,
                       " bytes (64 MiB), the most a document holds; separate documents by a "
                       "blank line"));
  }
}

}  // namespace switchyard
