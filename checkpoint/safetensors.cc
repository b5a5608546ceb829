#include "checkpoint/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace switchyard {

namespace {

const char* safetensors_dtype(DType d) {
  switch (d) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kU8: return "U8";
  }
  return "";
}

bool parse_dtype(const std::string& s, DType* d) {
  static const std::pair<const char*, DType> table[] = {
      {"F32", DType::kF32}, {"BF16", DType::kBF16}, {"F16", DType::kF16},
      {"I32", DType::kI32}, {"I64", DType::kI64},   {"U8", DType::kU8}};
  for (const auto& [name, dtype] : table)
    if (s == name) {
      *d = dtype;
      return true;
    }
  return false;
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
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return absl::PermissionDeniedError(absl::StrCat(tmp, ": cannot open for writing"));
    const uint64_t n = text.size();
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (size_t i : order) {
      const Tensor& t = tensors[i].second;
      out.write(static_cast<const char*>(t.raw_data()), static_cast<std::streamsize>(t.nbytes()));
    }
    out.flush();
    if (!out) return absl::DataLossError(absl::StrCat(tmp, ": write failed (disk full?)"));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::DataLossError(absl::StrCat(path, ": cannot rename into place: ", ec.message()));
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, Tensor>> read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  in.seekg(0, std::ios::end);
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat(path, ": not a valid safetensors file: ", why));
  };
  if (file_size < 8) return bad("shorter than its 8-byte header length");
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(len[i]) << (8 * i);
  if (header_len > file_size - 8) return bad("header length exceeds the file size");
  std::string text(header_len, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_len));
  nlohmann::json header = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) return bad("header is not a JSON object");
  const uint64_t data_size = file_size - 8 - header_len;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  std::map<std::string, Tensor> out;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const auto& e = it.value();
    DType dtype;
    if (!e.is_object() || !e.contains("dtype") || !e["dtype"].is_string() ||
        !parse_dtype(e["dtype"].get<std::string>(), &dtype))
      return bad(absl::StrCat("tensor ", it.key(), " has a missing or unsupported dtype"));
    if (!e.contains("shape") || !e["shape"].is_array() || !e.contains("data_offsets") ||
        !e["data_offsets"].is_array() || e["data_offsets"].size() != 2)
      return bad(absl::StrCat("tensor ", it.key(), " lacks shape or data_offsets"));
    Shape shape;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_unsigned()) return bad(absl::StrCat("tensor ", it.key(), " has a bad shape"));
      shape.push_back(d.get<int64_t>());
    }
    const auto& offs = e["data_offsets"];
    if (!offs[0].is_number_unsigned() || !offs[1].is_number_unsigned())
      return bad(absl::StrCat("tensor ", it.key(), " has bad data_offsets"));
    const uint64_t begin = offs[0].get<uint64_t>(), end = offs[1].get<uint64_t>();
    if (begin > end || end > data_size)
      return bad(absl::StrCat("tensor ", it.key(), " lies outside the data (file truncated?)"));
    if (end - begin != static_cast<uint64_t>(shape_numel(shape)) * dtype_size(dtype))
      return bad(absl::StrCat("tensor ", it.key(), " byte range does not match its shape"));
    ranges.emplace_back(begin, end);
    Tensor t = Tensor::empty(shape, dtype);
    in.seekg(static_cast<std::streamoff>(8 + header_len + begin));
    in.read(static_cast<char*>(t.raw_data()), static_cast<std::streamsize>(end - begin));
    if (!in) return bad(absl::StrCat("tensor ", it.key(), " could not be read"));
    out.emplace(it.key(), std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) return bad("tensor byte ranges overlap");
  return out;
}

}  // namespace switchyard
