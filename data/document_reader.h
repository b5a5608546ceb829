// Documents from a text input file, gzip-compressed or not (by content, so any name works).
//   *.jsonl, *.json (optionally + .gz): JSON Lines, one document per non-empty line,
//       taken from a string field ("text" unless told otherwise).
//   anything else: plain text, one document per paragraph; paragraphs are separated by
//       one or more blank lines (empty, or a lone "\r"); a paragraph keeps its inner
//       newlines and loses the newline that ends it.
// Empty documents are skipped.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace switchyard {

enum class TextFormat { kPlainText, kJsonLines };

TextFormat text_format_for_path(const std::string& path);

// The longest line, and the longest document, a reader takes: longer ones are refused,
// so that reading holds at most this much of one input at a time.
inline constexpr int64_t kMaxDocumentBytes = int64_t{64} << 20;

class DocumentReader {
 public:
  static absl::StatusOr<std::unique_ptr<DocumentReader>> open(const std::string& path,
                                                              const std::string& text_field);
  ~DocumentReader();

  // Reads the next document into *text; false at the end of the file. Errors name the
  // file and, for JSON Lines, the line.
  absl::StatusOr<bool> next(std::string* text);
  // JSON Lines only: the next non-blank line as it is (a record the caller parses);
  // false at the end of the file. line_number() is then that line's.
  absl::StatusOr<bool> next_record(std::string* line);
  int64_t line_number() const { return line_number_; }
  TextFormat format() const { return format_; }

  // Bytes of the file on disk consumed so far, for progress.
  int64_t disk_bytes_read() const;
  const std::string& path() const { return path_; }

 private:
  DocumentReader() = default;
  // Reads one line (without its '\n') into *line; false at the end of the file.
  absl::StatusOr<bool> next_line(std::string* line);
  absl::Status fill();

  std::string path_;
  std::string text_field_;
  TextFormat format_ = TextFormat::kPlainText;
  void* gz_ = nullptr;  // gzFile; zlib reads uncompressed files unchanged
  std::string buffer_;
  size_t buffer_pos_ = 0;
  bool eof_ = false;
  int64_t line_number_ = 0;
};

}  // namespace switchyard
