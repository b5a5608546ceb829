#include "data/token_shard.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>

#include "absl/strings/str_cat.h"
#include "data/hdf5_checks.h"
#include "engine/runtime/check.h"
#include "engine/runtime/file_util.h"
#include "engine/runtime/status_macros.h"

namespace switchyard {
namespace {

// 64 Ki tokens per chunk keeps the unused tail of a shard's last chunk small. Readers
// turn HDF5's chunk cache off, so unfiltered chunks are read straight from the file and a
// window read costs only its own bytes.
constexpr hsize_t kChunkTokens = 1 << 16;
constexpr int64_t kScanTokens = 1 << 20;

absl::Status write_int_attribute(hid_t object, const char* name, int64_t value) {
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle attr(H5Acreate2(object, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                H5Aclose);
  if (!attr.valid() || H5Awrite(attr.get(), H5T_NATIVE_INT64, &value) < 0)
    return absl::InternalError(absl::StrCat("cannot write attribute ", name));
  return absl::OkStatus();
}

// Fixed-length, null-padded UTF-8 (h5py reads it back as bytes). Variable-length strings
// live in the file's global heap, which a damaged file can make libhdf5 misread (hang, or
// copy with a wild length), so the engine neither writes nor reads them.
absl::Status write_string_attribute(hid_t object, const char* name, const std::string& value) {
  const std::string bytes = value.empty() ? std::string(1, '\0') : value;
  H5Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), bytes.size());
  H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle attr(H5Acreate2(object, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                H5Aclose);
  if (!attr.valid() || H5Awrite(attr.get(), type.get(), bytes.data()) < 0)
    return absl::InternalError(absl::StrCat("cannot write attribute ", name));
  return absl::OkStatus();
}

// Attributes are single values: an array attribute would be read past the one value's
// memory. Strings longer than this are refused before they are read.
constexpr size_t kMaxStringAttributeBytes = 1024;

absl::Status attribute_error(const std::string& path, const char* name, const char* why) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": attribute ", name, " ", why));
}

// The attribute `name` of `object` when it holds exactly one value; an invalid handle
// (and no error) when it is absent.
absl::StatusOr<H5Handle> open_single_attribute(hid_t object, const std::string& path,
                                               const char* name) {
  const htri_t exists = H5Aexists(object, name);
  if (exists < 0) return attribute_error(path, name, "is unreadable");
  if (exists == 0) return H5Handle();
  H5Handle attr(H5Aopen(object, name, H5P_DEFAULT), H5Aclose);
  H5Handle space(attr.valid() ? H5Aget_space(attr.get()) : H5I_INVALID_HID, H5Sclose);
  if (!space.valid() || H5Sget_simple_extent_npoints(space.get()) != 1)
    return attribute_error(path, name, "must hold exactly one value");
  return attr;
}

absl::StatusOr<int64_t> read_int_attribute(hid_t object, const std::string& path, const char* name,
                                           std::optional<int64_t> fallback = std::nullopt) {
  SY_ASSIGN_OR_RETURN(const H5Handle attr, open_single_attribute(object, path, name));
  if (!attr.valid()) {
    if (fallback) return *fallback;
    return attribute_error(path, name, "is missing");
  }
  H5Handle type(H5Aget_type(attr.get()), H5Tclose);
  int64_t value = 0;
  if (!type.valid() || H5Tget_class(type.get()) != H5T_INTEGER ||
      H5Aread(attr.get(), H5T_NATIVE_INT64, &value) < 0)
    return attribute_error(path, name, "is not a readable integer");
  return value;
}

// Fixed-length strings only (see write_string_attribute): a variable-length one is
// refused before libhdf5 reads it.
absl::StatusOr<std::string> read_string_attribute(hid_t object, const std::string& path,
                                                  const char* name) {
  const char* kWhy = "is missing or not a string";
  SY_ASSIGN_OR_RETURN(const H5Handle attr, open_single_attribute(object, path, name));
  if (!attr.valid()) return attribute_error(path, name, kWhy);
  H5Handle type(H5Aget_type(attr.get()), H5Tclose);
  if (!type.valid() || H5Tget_class(type.get()) != H5T_STRING)
    return attribute_error(path, name, kWhy);
  if (H5Tis_variable_str(type.get()) != 0)
    return attribute_error(path, name,
                           "is a variable-length string, which the engine refuses (write it "
                           "fixed-length: numpy.bytes_ in h5py)");
  const size_t size = H5Tget_size(type.get());
  if (size == 0 || size > kMaxStringAttributeBytes)
    return attribute_error(path, name, "is longer than 1024 bytes");
  std::string value(size, '\0');
  if (H5Aread(attr.get(), type.get(), value.data()) < 0) return attribute_error(path, name, kWhy);
  value.resize(std::strlen(value.c_str()));
  return value;
}

// The length of the one-dimensional dataset `dataset` (`what` in errors), refused when
// its elements of `element_bytes` would take more than the file can hold.
absl::StatusOr<int64_t> checked_length(hid_t dataset, int64_t element_bytes, int64_t file_bytes,
                                       const std::string& what) {
  H5Handle space(H5Dget_space(dataset), H5Sclose);
  hsize_t size = 0;
  if (!space.valid() || H5Sget_simple_extent_ndims(space.get()) != 1 ||
      H5Sget_simple_extent_dims(space.get(), &size, nullptr) < 0)
    return absl::InvalidArgumentError(absl::StrCat(what, " must be one-dimensional"));
  const int64_t max_bytes = max_hdf5_dataset_bytes(dataset, file_bytes);
  if (size > static_cast<hsize_t>(max_bytes / element_bytes))
    return absl::InvalidArgumentError(absl::StrCat(what, " declares ", size, " elements of ",
                                                   element_bytes, " bytes, more than the file's ",
                                                   file_bytes, " bytes can hold"));
  return static_cast<int64_t>(size);
}

absl::Status check_special_id(const std::string& path, const char* name, int64_t id,
                              int64_t vocab_size) {
  if (id < -1 || id >= vocab_size)
    return absl::InvalidArgumentError(absl::StrCat(path, ": attribute ", name, " is ", id,
                                                   ", outside [-1, vocab_size ", vocab_size, ")"));
  return absl::OkStatus();
}

}  // namespace

TokenDType token_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size <= kUint16VocabLimit ? TokenDType::kUint16 : TokenDType::kUint32;
}

const char* token_dtype_name(TokenDType dtype) {
  return dtype == TokenDType::kUint16 ? "uint16" : "uint32";
}

struct ShardWriter::Handles {
  H5Handle file;
  H5Handle tokens;
};

absl::StatusOr<std::unique_ptr<ShardWriter>> ShardWriter::create(
    const std::string& path, const ShardAttributes& attributes) {
  SY_CHECK(attributes.vocab_size > 0);
  silence_hdf5_errors();
  std::unique_ptr<ShardWriter> w(new ShardWriter());
  w->path_ = path;
  w->attributes_ = attributes;
  w->dtype_ = token_dtype_for_vocab(attributes.vocab_size);
  w->h5_ = std::make_unique<Handles>();
  errno = 0;  // so that a failure's errno is the OS's reason (libhdf5 leaves it set)
  w->h5_->file =
      H5Handle(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  if (!w->h5_->file.valid())
    return absl::PermissionDeniedError(
        absl::StrCat(path, ": cannot create the shard file: ", errno_reason()));
  const hsize_t zero = 0, unlimited = H5S_UNLIMITED;
  H5Handle space(H5Screate_simple(1, &zero, &unlimited), H5Sclose);
  H5Handle plist(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_chunk(plist.get(), 1, &kChunkTokens);
  w->h5_->tokens =
      H5Handle(H5Dcreate2(w->h5_->file.get(), "tokens",
                          w->dtype_ == TokenDType::kUint16 ? H5T_STD_U16LE : H5T_STD_U32LE,
                          space.get(), H5P_DEFAULT, plist.get(), H5P_DEFAULT),
               H5Dclose);
  if (!w->h5_->tokens.valid())
    return absl::InternalError(absl::StrCat(path, ": cannot create the tokens dataset"));
  w->pending_.reserve(kChunkTokens);
  return w;
}

ShardWriter::~ShardWriter() = default;

absl::Status ShardWriter::append_document(const int32_t* ids, int64_t count) {
  SY_CHECK(!closed_);
  for (int64_t i = 0; i < count; ++i) {
    if (ids[i] < 0 || ids[i] >= attributes_.vocab_size)
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": token id ", ids[i], " of document ", num_documents(),
                       " is outside the vocabulary (", attributes_.vocab_size, ")"));
    pending_.push_back(static_cast<uint32_t>(ids[i]));
    if (pending_.size() == kChunkTokens) SY_RETURN_IF_ERROR(flush());
  }
  num_tokens_ += count;
  doc_offsets_.push_back(num_tokens_);
  return absl::OkStatus();
}

absl::Status ShardWriter::flush() {
  if (pending_.empty()) return absl::OkStatus();
  const hsize_t start = static_cast<hsize_t>(flushed_tokens_), count = pending_.size();
  const hsize_t size = start + count;
  hid_t tokens = h5_->tokens.get();
  errno = 0;
  bool ok = H5Dset_extent(tokens, &size) >= 0;
  H5Handle file_space(H5Dget_space(tokens), H5Sclose);
  H5Handle mem_space(H5Screate_simple(1, &count, nullptr), H5Sclose);
  ok = ok && file_space.valid() &&
       H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr) >=
           0 &&
       H5Dwrite(tokens, H5T_NATIVE_UINT32, mem_space.get(), file_space.get(), H5P_DEFAULT,
                pending_.data()) >= 0;
  if (!ok)
    return absl::DataLossError(absl::StrCat(path_, ": cannot write tokens: ", errno_reason()));
  flushed_tokens_ += static_cast<int64_t>(count);
  pending_.clear();
  return absl::OkStatus();
}

absl::Status ShardWriter::close() {
  SY_CHECK(!closed_);
  closed_ = true;
  SY_RETURN_IF_ERROR(flush());
  const hid_t file = h5_->file.get();
  const hsize_t offsets = doc_offsets_.size();
  H5Handle space(H5Screate_simple(1, &offsets, nullptr), H5Sclose);
  errno = 0;
  H5Handle dataset(H5Dcreate2(file, "doc_offsets", H5T_STD_I64LE, space.get(), H5P_DEFAULT,
                              H5P_DEFAULT, H5P_DEFAULT),
                   H5Dclose);
  if (!dataset.valid() || H5Dwrite(dataset.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                   doc_offsets_.data()) < 0)
    return absl::DataLossError(absl::StrCat(path_, ": cannot write doc_offsets: ", errno_reason()));
  dataset.reset();
  H5Handle root(H5Gopen2(file, "/", H5P_DEFAULT), H5Gclose);
  const SpecialTokenIds& special = attributes_.special_ids;
  absl::Status status =
      write_int_attribute(root.get(), "format_version", attributes_.format_version);
  status.Update(
      write_string_attribute(root.get(), "tokenizer_sha256", attributes_.tokenizer_sha256));
  status.Update(write_int_attribute(root.get(), "vocab_size", attributes_.vocab_size));
  status.Update(write_int_attribute(root.get(), "unk_id", special.unk));
  status.Update(write_int_attribute(root.get(), "bos_id", special.bos));
  status.Update(write_int_attribute(root.get(), "eos_id", special.eos));
  status.Update(write_int_attribute(root.get(), "pad_id", special.pad));
  if (!status.ok()) return absl::DataLossError(absl::StrCat(path_, ": ", status.message()));
  root.reset();
  errno = 0;
  const bool closed = h5_->tokens.reset() && h5_->file.reset();
  if (!closed)
    return absl::DataLossError(
        absl::StrCat(path_, ": cannot finish the shard file: ", errno_reason()));
  return fsync_path(path_);
}

struct ShardReader::Handles {
  H5Handle file;
  H5Handle tokens;
};

absl::StatusOr<std::shared_ptr<ShardReader>> ShardReader::open(const std::string& path) {
  SY_ASSIGN_OR_RETURN(const int64_t file_bytes, regular_file_size(path));
  SY_ASSIGN_OR_RETURN(H5Handle file, open_hdf5_file(path));
  return from_file(std::move(file), path, file_bytes);
}

absl::StatusOr<std::shared_ptr<ShardReader>> ShardReader::open_image(std::string_view bytes,
                                                                     const std::string& name) {
  SY_ASSIGN_OR_RETURN(H5Handle file, open_hdf5_image(bytes, name));
  return from_file(std::move(file), name, static_cast<int64_t>(bytes.size()));
}

absl::StatusOr<std::shared_ptr<ShardReader>> ShardReader::from_file(H5Handle file,
                                                                    const std::string& path,
                                                                    int64_t file_bytes) {
  std::shared_ptr<ShardReader> r(new ShardReader());
  r->path_ = path;
  r->file_bytes_ = file_bytes;
  r->h5_ = std::make_unique<Handles>();
  r->h5_->file = std::move(file);
  SY_RETURN_IF_ERROR(r->read_attributes());
  SY_RETURN_IF_ERROR(r->open_tokens());
  SY_ASSIGN_OR_RETURN(std::vector<int64_t> offsets, r->read_doc_offsets());
  if (offsets.empty() || offsets.front() != 0 || offsets.back() != r->num_tokens_ ||
      !std::is_sorted(offsets.begin(), offsets.end()))
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": /doc_offsets must rise from 0 to the number of tokens (", r->num_tokens_, ")"));
  r->num_documents_ = static_cast<int64_t>(offsets.size()) - 1;
  return r;
}

absl::Status ShardReader::read_attributes() {
  const std::string& path = path_;
  H5Handle root(H5Gopen2(h5_->file.get(), "/", H5P_DEFAULT), H5Gclose);
  if (!root.valid())
    return absl::DataLossError(absl::StrCat(path, ": cannot read the root group (corrupted?)"));
  ShardAttributes& a = attributes_;
  SY_ASSIGN_OR_RETURN(a.format_version, read_int_attribute(root.get(), path, "format_version"));
  if (a.format_version != kTokenFormatVersion)
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": format_version ", a.format_version, "; this build reads version ",
        kTokenFormatVersion, " (prepare the dataset again with `switchyard data prepare`)"));
  SY_ASSIGN_OR_RETURN(a.tokenizer_sha256,
                      read_string_attribute(root.get(), path, "tokenizer_sha256"));
  SY_ASSIGN_OR_RETURN(a.vocab_size, read_int_attribute(root.get(), path, "vocab_size"));
  if (a.vocab_size <= 0 || a.vocab_size > kMaxVocabSize)
    return absl::InvalidArgumentError(absl::StrCat(path, ": attribute vocab_size ", a.vocab_size,
                                                   " is outside [1, ", kMaxVocabSize, "]"));
  SpecialTokenIds& ids = a.special_ids;
  for (auto [name, id] : {std::pair{"unk_id", &ids.unk}, std::pair{"bos_id", &ids.bos},
                          std::pair{"eos_id", &ids.eos}, std::pair{"pad_id", &ids.pad}}) {
    SY_ASSIGN_OR_RETURN(*id, read_int_attribute(root.get(), path, name, -1));
    SY_RETURN_IF_ERROR(check_special_id(path, name, *id, a.vocab_size));
  }
  return absl::OkStatus();
}

absl::Status ShardReader::open_tokens() {
  const std::string what = absl::StrCat(path_, ": /tokens");
  H5Handle access = no_external_links_access();
  H5Pset_chunk_cache(access.get(), 0, 0, 1.0);
  SY_ASSIGN_OR_RETURN(h5_->tokens,
                      open_plain_hdf5_dataset(h5_->file.get(), "tokens", what, access.get()));
  H5Handle type(H5Dget_type(h5_->tokens.get()), H5Tclose);
  const size_t type_size = type.valid() ? H5Tget_size(type.get()) : 0;
  if (!type.valid() || H5Tget_class(type.get()) != H5T_INTEGER ||
      H5Tget_sign(type.get()) != H5T_SGN_NONE || (type_size != 2 && type_size != 4))
    return absl::InvalidArgumentError(absl::StrCat(what, " must be uint16 or uint32"));
  dtype_ = type_size == 2 ? TokenDType::kUint16 : TokenDType::kUint32;
  SY_ASSIGN_OR_RETURN(
      num_tokens_,
      checked_length(h5_->tokens.get(), static_cast<int64_t>(type_size), file_bytes_, what));
  return absl::OkStatus();
}

ShardReader::~ShardReader() = default;

absl::StatusOr<std::vector<int64_t>> ShardReader::read_doc_offsets() const {
  silence_hdf5_errors();
  const std::string what = absl::StrCat(path_, ": /doc_offsets");
  SY_ASSIGN_OR_RETURN(const H5Handle dataset,
                      open_plain_hdf5_dataset(h5_->file.get(), "doc_offsets", what));
  H5Handle type(H5Dget_type(dataset.get()), H5Tclose);
  if (!type.valid() || H5Tget_class(type.get()) != H5T_INTEGER)
    return absl::InvalidArgumentError(absl::StrCat(what, " must hold integers"));
  const int64_t element_bytes = static_cast<int64_t>(std::max<size_t>(H5Tget_size(type.get()), 1));
  SY_ASSIGN_OR_RETURN(const int64_t size,
                      checked_length(dataset.get(), element_bytes, file_bytes_, what));
  std::vector<int64_t> offsets(static_cast<size_t>(size));
  if (size > 0 &&
      H5Dread(dataset.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, offsets.data()) < 0)
    return absl::DataLossError(absl::StrCat(what, ": cannot read (corrupted?)"));
  return offsets;
}

absl::Status ShardReader::read_tokens(int64_t start, int64_t count, int32_t* out) const {
  SY_CHECK(start >= 0 && count >= 0 && start + count <= num_tokens_);
  if (count == 0) return absl::OkStatus();
  silence_hdf5_errors();
  const hsize_t file_start = static_cast<hsize_t>(start), n = static_cast<hsize_t>(count);
  const hid_t tokens = h5_->tokens.get();
  H5Handle file_space(H5Dget_space(tokens), H5Sclose);
  H5Handle mem_space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  // uint32 into the int32 buffer: the same width, and ids are checked below.
  auto* raw = reinterpret_cast<uint32_t*>(out);
  if (!file_space.valid() ||
      H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &file_start, nullptr, &n, nullptr) <
          0 ||
      H5Dread(tokens, H5T_NATIVE_UINT32, mem_space.get(), file_space.get(), H5P_DEFAULT, raw) < 0)
    return absl::DataLossError(absl::StrCat(path_, ": cannot read tokens ", start, "..",
                                            start + count, " (corrupted shard?)"));
  const uint32_t vocab = static_cast<uint32_t>(attributes_.vocab_size);
  uint32_t bad = 0;
  for (int64_t i = 0; i < count; ++i) bad |= raw[i] >= vocab;
  if (bad) {
    const int64_t i =
        std::find_if(raw, raw + count, [&](uint32_t id) { return id >= vocab; }) - raw;
    return absl::InvalidArgumentError(absl::StrCat(path_, ": token ", start + i, " has id ", raw[i],
                                                   ", not below vocab_size ", vocab));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ShardReader::scan_max_token() const {
  std::vector<int32_t> block(static_cast<size_t>(std::min(num_tokens_, kScanTokens)));
  int32_t max_id = -1;
  for (int64_t start = 0; start < num_tokens_; start += kScanTokens) {
    const int64_t count = std::min(kScanTokens, num_tokens_ - start);
    SY_RETURN_IF_ERROR(read_tokens(start, count, block.data()));
    max_id = std::max(max_id, *std::max_element(block.begin(), block.begin() + count));
  }
  return max_id;
}

}  // namespace switchyard
