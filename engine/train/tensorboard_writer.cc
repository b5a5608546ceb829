#include "engine/train/tensorboard_writer.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/train/crc_table.h"
#include "engine/train/png.h"
#include "engine/train/tensorboard_event.pb.h"

namespace switchyard {

namespace tensorboard {
namespace {

constexpr std::array<uint32_t, 256> kCrc32cTable = reflected_crc32_table(0x82F63B78u);

void put_u32_le(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
uint32_t get_u32_le(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
uint64_t get_u64_le(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

}  // namespace

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  for (size_t i = 0; i < size; ++i) c = kCrc32cTable[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return ~c;
}

uint32_t crc32c(const void* data, size_t size) { return crc32c_extend(0, data, size); }

uint32_t mask_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }

uint32_t unmask_crc(uint32_t masked) {
  const uint32_t rot = masked - 0xA282EAD8u;
  return (rot >> 17) | (rot << 15);
}

std::string frame_record(absl::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  const uint64_t length = data.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((length >> (8 * i)) & 0xFF));
  put_u32_le(out, mask_crc(crc32c(out.data(), 8)));
  out.append(data.data(), data.size());
  put_u32_le(out, mask_crc(crc32c(data)));
  return out;
}

absl::StatusOr<std::vector<std::string>> read_records(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> records;
  size_t at = 0;
  while (at < bytes.size()) {
    if (bytes.size() - at < 12) {
      return absl::DataLossError(absl::StrFormat("%s: truncated record header at byte %d",
                                                 path, at));
    }
    const uint64_t length = get_u64_le(bytes.data() + at);
    if (unmask_crc(get_u32_le(bytes.data() + at + 8)) != crc32c(bytes.data() + at, 8)) {
      return absl::DataLossError(absl::StrFormat("%s: bad length CRC at byte %d", path, at));
    }
    if (length > bytes.size() - at - 12 || bytes.size() - at - 12 - length < 4) {
      return absl::DataLossError(absl::StrFormat("%s: truncated record at byte %d", path, at));
    }
    const char* data = bytes.data() + at + 12;
    if (unmask_crc(get_u32_le(data + length)) != crc32c(data, length)) {
      return absl::DataLossError(absl::StrFormat("%s: bad data CRC at byte %d", path, at));
    }
    records.emplace_back(data, length);
    at += 12 + length + 4;
  }
  return records;
}

const std::vector<double>& default_bucket_limits() {
  static const std::vector<double> limits = [] {
    std::vector<double> pos;
    for (double v = 1.0e-12; v < 1.0e20; v *= 1.1) pos.push_back(v);
    pos.push_back(DBL_MAX);
    std::vector<double> all;
    all.reserve(2 * pos.size() + 1);
    for (auto it = pos.rbegin(); it != pos.rend(); ++it) all.push_back(-*it);
    all.push_back(0.0);
    all.insert(all.end(), pos.begin(), pos.end());
    return all;
  }();
  return limits;
}

}  // namespace tensorboard

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

absl::Status check_tag(const std::string& tag) {
  if (tag.empty()) return absl::InvalidArgumentError("TensorBoard tag must not be empty");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::create(
    const std::string& log_dir) {
  if (log_dir.empty()) return absl::InvalidArgumentError("TensorBoard log dir must not be empty");
  std::error_code ec;
  std::filesystem::create_directories(log_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create TensorBoard log dir ", log_dir, ": ", ec.message()));
  }
  if (!std::filesystem::is_directory(log_dir, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("TensorBoard log dir ", log_dir, " is not a directory"));
  }
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') std::strcpy(host, "localhost");
  const double wall_time = now_seconds();
  const std::string base = absl::StrFormat(
      "%s/events.out.tfevents.%010d.%s.%d.switchyard", log_dir,
      static_cast<int64_t>(std::time(nullptr)), host, static_cast<int>(getpid()));
  std::string path = base;
  std::FILE* file = nullptr;
  for (int n = 1;; ++n) {
    file = std::fopen(path.c_str(), "wbx");  // exclusive: never clobber another writer
    if (file != nullptr) break;
    if (errno != EEXIST || n > 1000) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create TensorBoard event file ", path, ": ", std::strerror(errno)));
    }
    path = absl::StrCat(base, ".", n);
  }
  std::unique_ptr<TensorBoardWriter> writer(new TensorBoardWriter(path, file));
  tbproto::Event event;
  event.set_wall_time(wall_time);
  event.set_file_version("brain.Event:2");
  {
    std::lock_guard<std::mutex> lock(writer->mu_);
    if (auto status = writer->write_event_locked(event.SerializeAsString()); !status.ok()) {
      return status;
    }
  }
  if (auto status = writer->flush(); !status.ok()) return status;
  return writer;
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

absl::Status TensorBoardWriter::write_event_locked(const std::string& serialized) {
  if (!sticky_error_.ok()) return sticky_error_;
  const std::string record = tensorboard::frame_record(serialized);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size()) {
    sticky_error_ = absl::DataLossError(
        absl::StrCat("writing TensorBoard event file ", path_, ": ", std::strerror(errno)));
  }
  return sticky_error_;
}

absl::Status TensorBoardWriter::flush() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!sticky_error_.ok()) return sticky_error_;
  if (std::fflush(file_) != 0) {
    sticky_error_ = absl::DataLossError(
        absl::StrCat("flushing TensorBoard event file ", path_, ": ", std::strerror(errno)));
  }
  return sticky_error_;
}

absl::Status TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  if (auto status = check_tag(tag); !status.ok()) return status;
  tbproto::Event event;
  event.set_wall_time(now_seconds());
  event.set_step(step);
  auto* v = event.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));
  std::lock_guard<std::mutex> lock(mu_);
  return write_event_locked(event.SerializeAsString());
}

absl::Status TensorBoardWriter::add_histogram(const std::string& tag,
                                              const std::vector<double>& values, int64_t step) {
  if (auto status = check_tag(tag); !status.ok()) return status;
  if (values.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("histogram ", tag, " has no values"));
  }
  const std::vector<double>& limits = tensorboard::default_bucket_limits();
  std::vector<double> counts(limits.size(), 0.0);
  double lo = values[0], hi = values[0], sum = 0, sum_squares = 0;
  for (double x : values) {
    if (!std::isfinite(x)) {
      return absl::InvalidArgumentError(
          absl::StrCat("histogram ", tag, " has a non-finite value (", x, ")"));
    }
    lo = std::min(lo, x);
    hi = std::max(hi, x);
    sum += x;
    sum_squares += x * x;
    // Bucket b holds limits[b-1] <= x < limits[b], as in TensorFlow's Histogram::Add.
    size_t b = std::upper_bound(limits.begin(), limits.end(), x) - limits.begin();
    counts[std::min(b, limits.size() - 1)] += 1;
  }
  tbproto::Event event;
  event.set_wall_time(now_seconds());
  event.set_step(step);
  auto* v = event.mutable_summary()->add_value();
  v->set_tag(tag);
  tbproto::HistogramProto* h = v->mutable_histo();
  h->set_min(lo);
  h->set_max(hi);
  h->set_num(static_cast<double>(values.size()));
  h->set_sum(sum);
  h->set_sum_squares(sum_squares);
  // Each run of empty buckets collapses into one that ends where the run ends
  // (TensorFlow's Histogram::EncodeToProto with preserve_zero_buckets=false).
  for (size_t i = 0; i < limits.size();) {
    double end = limits[i];
    double count = counts[i];
    ++i;
    if (count <= 0) {
      while (i < limits.size() && counts[i] <= 0) {
        end = limits[i];
        count = counts[i];
        ++i;
      }
    }
    h->add_bucket_limit(end);
    h->add_bucket(count);
  }
  std::lock_guard<std::mutex> lock(mu_);
  return write_event_locked(event.SerializeAsString());
}

absl::Status TensorBoardWriter::add_image(const std::string& tag, int height, int width,
                                          const std::vector<uint8_t>& rgb, int64_t step) {
  if (auto status = check_tag(tag); !status.ok()) return status;
  absl::StatusOr<std::string> encoded = png::encode_rgb(height, width, rgb);
  if (!encoded.ok()) return encoded.status();
  tbproto::Event event;
  event.set_wall_time(now_seconds());
  event.set_step(step);
  auto* v = event.mutable_summary()->add_value();
  v->set_tag(tag);
  auto* image = v->mutable_image();
  image->set_height(height);
  image->set_width(width);
  image->set_colorspace(3);  // RGB
  image->set_encoded_image_string(std::move(*encoded));
  std::lock_guard<std::mutex> lock(mu_);
  return write_event_locked(event.SerializeAsString());
}

}  // namespace switchyard
