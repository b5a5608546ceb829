#include "checkpoint/safetensors.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "core/runtime/file_util.h"
#include "core/runtime/json_fields.h"
#include "core/runtime/status_macros.h"

namespace switchyard {

namespace {

using Json = nlohmann::json;

constexpr int64_t kLengthBytes = 8;

constexpr std::pair<const char*, DType> kDTypes[] = {
    {"F32", DType::kF32}, {"BF16", DType::kBF16}, {"F16", DType::kF16},
    {"I32", DType::kI32}, {"I64", DType::kI64},   {"U8", DType::kU8}};

const char* safetensors_dtype(DType d) {
  for (const auto& [name, dtype] : kDTypes)
    if (d == dtype) return name;
  return "";
}

using Entry = SafetensorsEntry;

// A JSON integer in [0, int64 max], as written for dims and offsets.
std::optional<int64_t> non_negative(const Json& v) {
  if (v.is_number_unsigned() && v.get<uint64_t>() <= static_cast<uint64_t>(JsonFields::kMaxInt))
    return v.get<int64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return v.get<int64_t>();
  return std::nullopt;
}

absl::StatusOr<DType> parse_dtype(const JsonFields& tensor) {
  SY_ASSIGN_OR_RETURN(const std::string text, tensor.string("dtype"));
  for (const auto& [name, dtype] : kDTypes)
    if (text == name) return dtype;
  return tensor.error("dtype", absl::StrCat("\"", text.substr(0, 32),
                                            "\" is not one of F32, BF16, F16, I32, I64, U8"));
}

absl::StatusOr<Shape> parse_shape(const JsonFields& tensor) {
  const Json* dims = tensor.find("shape");
  if (!dims || !dims->is_array())
    return tensor.error("shape", "must be an array of non-negative integers");
  Shape shape;
  for (const Json& d : *dims) {
    const std::optional<int64_t> dim = non_negative(d);
    if (!dim) return tensor.error("shape", "must be an array of non-negative integers");
    shape.push_back(*dim);
  }
  return shape;
}

// dtype, shape and data_offsets of tensor `key`, checked against a data section of
// `data_bytes` bytes.
absl::StatusOr<Entry> parse_entry(const JsonFields& header, const std::string& key,
                                  int64_t data_bytes) {
  SY_ASSIGN_OR_RETURN(const JsonFields tensor, header.object(key.c_str()));
  Entry e;
  e.name = key;
  SY_ASSIGN_OR_RETURN(e.dtype, parse_dtype(tensor));
  SY_ASSIGN_OR_RETURN(e.shape, parse_shape(tensor));
  const std::optional<int64_t> nbytes = checked_nbytes(e.shape, e.dtype);
  if (!nbytes)
    return absl::InvalidArgumentError(absl::StrCat(header.path(), ": tensor ", key, " has shape ",
                                                   shape_string(e.shape),
                                                   " whose byte size overflows"));
  const Json* offsets = tensor.find("data_offsets");
  if (!offsets || !offsets->is_array() || offsets->size() != 2 || !non_negative((*offsets)[0]) ||
      !non_negative((*offsets)[1]))
    return tensor.error("data_offsets", "must be two non-negative integers [begin, end]");
  e.begin = *non_negative((*offsets)[0]);
  e.end = *non_negative((*offsets)[1]);
  if (e.begin > e.end || e.end > data_bytes)
    return tensor.error("data_offsets",
                        absl::StrCat("[", e.begin, ", ", e.end, "] lies outside the data's ",
                                     data_bytes, " bytes (file truncated?)"));
  if (e.end - e.begin != *nbytes)
    return tensor.error("data_offsets",
                        absl::StrCat("spans ", e.end - e.begin, " bytes, but ",
                                     safetensors_dtype(e.dtype), shape_string(e.shape), " needs ",
                                     *nbytes));
  return e;
}

absl::Status check_metadata(const JsonFields& header) {
  if (!header.json().contains("__metadata__")) return absl::OkStatus();
  SY_ASSIGN_OR_RETURN(const JsonFields metadata, header.object("__metadata__"));
  for (const auto& [key, value] : metadata.json().items())
    if (!value.is_string()) return metadata.error(key, "must be a string");
  return absl::OkStatus();
}

absl::Status check_no_overlap(std::vector<Entry>& entries, const std::string& name) {
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  const Entry* previous = nullptr;
  for (const Entry& e : entries) {
    if (e.begin == e.end) continue;
    if (previous && e.begin < previous->end)
      return absl::InvalidArgumentError(absl::StrCat(name, ": tensors ", previous->name, " and ",
                                                     e.name, " overlap in the data (bytes ",
                                                     e.begin, " to ", previous->end, ")"));
    previous = &e;
  }
  return absl::OkStatus();
}

// Every entry of the header `text`, validated against a data section of `data_bytes`.
absl::StatusOr<std::vector<Entry>> parse_header(std::string_view text, int64_t data_bytes,
                                                const std::string& name) {
  SY_ASSIGN_OR_RETURN(const Json json, parse_json_object(text, absl::StrCat(name, " header")));
  const JsonFields header(json, name);
  SY_RETURN_IF_ERROR(check_metadata(header));
  std::vector<Entry> entries;
  for (const auto& item : json.items()) {
    if (item.key() == "__metadata__") continue;
    SY_ASSIGN_OR_RETURN(Entry e, parse_entry(header, item.key(), data_bytes));
    entries.push_back(std::move(e));
  }
  SY_RETURN_IF_ERROR(check_no_overlap(entries, name));
  return entries;
}

// The header length from the first 8 bytes of a source of `size` bytes.
absl::StatusOr<int64_t> header_length(const unsigned char* bytes, int64_t size,
                                      const std::string& name) {
  uint64_t length = 0;
  for (int i = 0; i < kLengthBytes; ++i) length |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  if (length > static_cast<uint64_t>(kMaxMetadataFileBytes))
    return absl::InvalidArgumentError(absl::StrCat(name, ": header length ", length,
                                                   " is over the cap of ",
                                                   kMaxMetadataFileBytes, " bytes"));
  if (static_cast<int64_t>(length) > size - kLengthBytes)
    return absl::InvalidArgumentError(absl::StrCat(name, ": header length ", length,
                                                   " runs past the end of the file (", size,
                                                   " bytes; truncated?)"));
  return static_cast<int64_t>(length);
}

// Reads `bytes` bytes at `offset` of the source into `data`.
using ReadAt = std::function<absl::Status(int64_t offset, void* data, size_t bytes)>;

struct Layout {
  int64_t data_start = 0;
  std::vector<Entry> entries;
};

// Where the tensors of a source of `size` bytes lie: its header validated whole.
absl::StatusOr<Layout> parse_layout(int64_t size, const ReadAt& read, const std::string& name) {
  if (size < kLengthBytes)
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": is ", size, " bytes, shorter than the 8-byte header length (truncated?)"));
  unsigned char length_bytes[kLengthBytes];
  SY_RETURN_IF_ERROR(read(0, length_bytes, kLengthBytes));
  SY_ASSIGN_OR_RETURN(const int64_t length, header_length(length_bytes, size, name));
  std::string text(static_cast<size_t>(length), '\0');
  SY_RETURN_IF_ERROR(read(kLengthBytes, text.data(), text.size()));
  Layout layout;
  layout.data_start = kLengthBytes + length;
  SY_ASSIGN_OR_RETURN(layout.entries, parse_header(text, size - layout.data_start, name));
  return layout;
}

// The tensors of a source of `size` bytes: the header validated whole, then each tensor
// allocated and read.
absl::StatusOr<std::map<std::string, Tensor>> parse_source(int64_t size, const ReadAt& read,
                                                           const std::string& name) {
  SY_ASSIGN_OR_RETURN(const Layout layout, parse_layout(size, read, name));
  std::map<std::string, Tensor> out;
  for (const Entry& e : layout.entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    SY_RETURN_IF_ERROR(read(layout.data_start + e.begin, t.raw_data(), t.nbytes()));
    out.emplace(e.name, std::move(t));
  }
  return out;
}

}  // namespace

absl::Status write_safetensors(const std::string& path,
                               const std::vector<std::pair<std::string, Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  nlohmann::ordered_json meta = {{"format", "pt"}};
  for (const auto& [k, v] : metadata) meta[k] = v;
  header["__metadata__"] = meta;
  // Larger element types first keeps every tensor naturally aligned.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return dtype_size(tensors[a].second.dtype()) > dtype_size(tensors[b].second.dtype());
  });
  size_t offset = 0;
  for (size_t i : order) {
    const auto& [name, t] = tensors[i];
    if (header.contains(name))
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor name repeated: ", name));
    header[name] = {{"dtype", safetensors_dtype(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string text = header.dump();
  text.append((8 - (text.size() % 8)) % 8, ' ');
  const uint64_t n = text.size();
  unsigned char length[kLengthBytes];
  for (int i = 0; i < kLengthBytes; ++i) length[i] = static_cast<unsigned char>(n >> (8 * i));
  SY_ASSIGN_OR_RETURN(AtomicFileWriter out, AtomicFileWriter::open(path));
  SY_RETURN_IF_ERROR(out.write(length, kLengthBytes));
  SY_RETURN_IF_ERROR(out.write(text));
  for (size_t i : order) {
    const Tensor& t = tensors[i].second;
    SY_RETURN_IF_ERROR(out.write(t.raw_data(), t.nbytes()));
  }
  return out.commit();
}

absl::StatusOr<std::map<std::string, Tensor>> read_safetensors(const std::string& path) {
  SY_ASSIGN_OR_RETURN(const RegularFile file, RegularFile::open(path));
  return parse_source(
      file.size(),
      [&](int64_t offset, void* data, size_t bytes) { return file.read_at(offset, data, bytes); },
      path);
}

absl::StatusOr<std::map<std::string, Tensor>> parse_safetensors(std::string_view bytes,
                                                                const std::string& name) {
  return parse_source(
      static_cast<int64_t>(bytes.size()),
      [&](int64_t offset, void* data, size_t n) {
        std::memcpy(data, bytes.data() + offset, n);
        return absl::OkStatus();
      },
      name);
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  SY_ASSIGN_OR_RETURN(RegularFile file, RegularFile::open(path));
  SY_ASSIGN_OR_RETURN(
      Layout layout,
      parse_layout(
          file.size(),
          [&](int64_t offset, void* data, size_t bytes) { return file.read_at(offset, data, bytes); },
          path));
  std::map<std::string, Entry> entries;
  for (Entry& e : layout.entries) entries.emplace(e.name, std::move(e));
  return SafetensorsFile(std::move(file), layout.data_start, std::move(entries));
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  const auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

absl::Status SafetensorsFile::read_rows(const SafetensorsEntry& entry, int64_t first_row,
                                        Tensor& out) const {
  const int64_t rows = entry.shape.empty() ? 1 : entry.shape[0];
  const int64_t row_bytes = rows == 0 ? 0 : (entry.end - entry.begin) / rows;
  SY_CHECK_MSG(out.dtype() == entry.dtype && first_row >= 0 && first_row + out.rows() <= rows &&
                   static_cast<int64_t>(out.nbytes()) == out.rows() * row_bytes,
               "rows read from a safetensors tensor must lie inside it");
  return file_.read_at(data_start_ + entry.begin + first_row * row_bytes, out.raw_data(),
                       out.nbytes());
}

}  // namespace switchyard
