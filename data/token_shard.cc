#include "data/token_shard.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/runtime/check.h"
#include "core/runtime/file_util.h"
#include "core/runtime/status_macros.h"
#include "data/hdf5_writer.h"

namespace switchyard {
namespace {

// Tokens move between memory, the temporary file and the shard in blocks of this many.
constexpr int64_t kBlockTokens = 1 << 20;
constexpr int64_t kScanTokens = 1 << 20;

absl::Status write_int_attribute(hid_t object, const char* name, int64_t value) {
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle attr(H5Acreate2(object, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                H5Aclose);
  if (!attr.valid() || H5Awrite(attr.get(), H5T_NATIVE_INT64, &value) < 0)
    return absl::InternalError(absl::StrCat("cannot write attribute ", name));
  return absl::OkStatus();
}

// Fixed-length, null-padded UTF-8 (h5py reads it back as bytes); the reader refuses
// variable-length strings, which live in a global heap.
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

// Strings longer than this are refused before they are copied.
constexpr int64_t kMaxStringAttributeBytes = 1024;

absl::Status attribute_error(const std::string& path, const char* name, const char* why) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": attribute ", name, " ", why));
}

// A root attribute holding one integer, sign-extended from its width; `fallback` when
// it is absent (an error when there is none).
absl::StatusOr<int64_t> read_int_attribute(const Hdf5File& file, const char* name,
                                           std::optional<int64_t> fallback = std::nullopt) {
  SY_ASSIGN_OR_RETURN(const std::optional<Hdf5File::Attribute> attr, file.root_attribute(name));
  if (!attr) {
    if (fallback) return *fallback;
    return attribute_error(file.name(), name, "is missing");
  }
  if (attr->type.type_class != Hdf5Type::kInteger)
    return attribute_error(file.name(), name, "is not an integer");
  uint64_t bits = 0;
  std::memcpy(&bits, attr->bytes.data(), attr->bytes.size());
  const int shift = 64 - 8 * static_cast<int>(attr->bytes.size());
  if (!attr->type.is_signed) {
    if (attr->bytes.size() == 8 && (bits >> 63) != 0)
      return attribute_error(file.name(), name, "is beyond int64");
    return static_cast<int64_t>(bits);
  }
  return shift == 0 ? static_cast<int64_t>(bits) : static_cast<int64_t>(bits << shift) >> shift;
}

// Fixed-length strings only: the reader refuses variable-length ones.
absl::StatusOr<std::string> read_string_attribute(const Hdf5File& file, const char* name) {
  SY_ASSIGN_OR_RETURN(const std::optional<Hdf5File::Attribute> attr, file.root_attribute(name));
  if (!attr || attr->type.type_class != Hdf5Type::kString)
    return attribute_error(file.name(), name, "is missing or not a string");
  if (attr->type.size > kMaxStringAttributeBytes)
    return attribute_error(file.name(), name, "is longer than 1024 bytes");
  return std::string(attr->bytes.c_str());
}

// The length of the one-dimensional dataset `d`.
absl::StatusOr<int64_t> one_dimensional_length(const Hdf5Dataset& d) {
  if (d.dims.size() != 1)
    return absl::InvalidArgumentError(absl::StrCat(d.where, " must be one-dimensional"));
  return d.dims[0];
}

absl::Status check_special_id(const std::string& path, const char* name, int64_t id,
                              int64_t vocab_size) {
  if (id < -1 || id >= vocab_size)
    return absl::InvalidArgumentError(absl::StrCat(path, ": attribute ", name, " is ", id,
                                                   ", outside [-1, vocab_size ", vocab_size, ")"));
  return absl::OkStatus();
}

int64_t token_bytes(TokenDType dtype) { return dtype == TokenDType::kUint16 ? 2 : 4; }

// Packs `count` ids into the shard's little-endian element width.
std::string pack_tokens(const uint32_t* ids, int64_t count, TokenDType dtype) {
  std::string bytes(static_cast<size_t>(count * token_bytes(dtype)), '\0');
  for (int64_t i = 0; i < count; ++i) {
    if (dtype == TokenDType::kUint16) {
      const uint16_t v = static_cast<uint16_t>(ids[i]);
      std::memcpy(bytes.data() + 2 * i, &v, 2);
    } else {
      std::memcpy(bytes.data() + 4 * i, &ids[i], 4);
    }
  }
  return bytes;
}

// Writes all `size` bytes to `fd` (the temporary file of the shard at `path`).
absl::Status write_all(int fd, const void* data, size_t size, const std::string& path) {
  const char* bytes = static_cast<const char*>(data);
  size_t done = 0;
  while (done < size) {
    errno = 0;
    const ssize_t n = ::write(fd, bytes + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      return absl::DataLossError(
          absl::StrCat(path, ": cannot write its temporary file: ", errno_reason()));
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// A temporary file beside `path`, named only for the moment between mkstemp and unlink.
absl::StatusOr<int> unnamed_file_beside(const std::string& path, const char* suffix) {
  std::string name = path + suffix;
  const int fd = ::mkstemp(name.data());
  if (fd < 0)
    return absl::PermissionDeniedError(
        absl::StrCat(path, ": cannot create a temporary file beside it: ", errno_reason()));
  ::unlink(name.c_str());
  return fd;
}

// A contiguous 1-D dataset without creation and modification times in its header, so
// that the same documents make the same shard bytes (a resumed prepare relies on it).
hid_t create_dataset(hid_t file, const char* name, hid_t file_type, hid_t space) {
  H5Handle creation(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_obj_track_times(creation.get(), false);
  return H5Dcreate2(file, name, file_type, space, H5P_DEFAULT, creation.get(), H5P_DEFAULT);
}

// Copies `count` elements of `width` bytes from the temporary file `spill_fd` into the
// new contiguous 1-D dataset `name` of `file`.
absl::Status copy_spill(hid_t file, int spill_fd, const char* name, hid_t file_type,
                        int64_t width, int64_t count, const std::string& path) {
  const hsize_t total = static_cast<hsize_t>(count);
  H5Handle space(H5Screate_simple(1, &total, nullptr), H5Sclose);
  errno = 0;
  H5Handle dataset(create_dataset(file, name, file_type, space.get()), H5Dclose);
  if (!dataset.valid())
    return absl::DataLossError(absl::StrCat(path, ": cannot create /", name, ": ", errno_reason()));
  std::string block;
  for (int64_t start = 0; start < count; start += kBlockTokens) {
    const hsize_t first = static_cast<hsize_t>(start);
    const hsize_t n = static_cast<hsize_t>(std::min(kBlockTokens, count - start));
    block.resize(n * static_cast<size_t>(width));
    errno = 0;
    if (pread(spill_fd, block.data(), block.size(), start * width) !=
        static_cast<ssize_t>(block.size()))
      return absl::DataLossError(
          absl::StrCat(path, ": cannot read back its /", name, ": ", errno_reason()));
    H5Handle file_space(H5Dget_space(dataset.get()), H5Sclose);
    H5Handle mem_space(H5Screate_simple(1, &n, nullptr), H5Sclose);
    errno = 0;
    if (H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &first, nullptr, &n, nullptr) < 0 ||
        H5Dwrite(dataset.get(), file_type, mem_space.get(), file_space.get(), H5P_DEFAULT,
                 block.data()) < 0)
      return absl::DataLossError(absl::StrCat(path, ": cannot write /", name, ": ", errno_reason()));
  }
  errno = 0;
  if (!dataset.reset())
    return absl::DataLossError(absl::StrCat(path, ": cannot write /", name, ": ", errno_reason()));
  return absl::OkStatus();
}

}  // namespace

TokenDType token_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size <= kUint16VocabLimit ? TokenDType::kUint16 : TokenDType::kUint32;
}

const char* token_dtype_name(TokenDType dtype) {
  return dtype == TokenDType::kUint16 ? "uint16" : "uint32";
}

absl::StatusOr<std::unique_ptr<ShardWriter>> ShardWriter::create(
    const std::string& path, const ShardAttributes& attributes) {
  SY_CHECK(attributes.vocab_size > 0);
  std::unique_ptr<ShardWriter> w(new ShardWriter());
  w->path_ = path;
  w->attributes_ = attributes;
  w->dtype_ = token_dtype_for_vocab(attributes.vocab_size);
  SY_ASSIGN_OR_RETURN(w->spill_fd_, unnamed_file_beside(path, ".tokens-XXXXXX"));
  w->pending_.reserve(static_cast<size_t>(kBlockTokens));
  return w;
}

ShardWriter::~ShardWriter() {
  if (spill_fd_ >= 0) ::close(spill_fd_);
  if (mask_fd_ >= 0) ::close(mask_fd_);
}

absl::Status ShardWriter::start_loss_mask() {
  SY_ASSIGN_OR_RETURN(mask_fd_, unnamed_file_beside(path_, ".mask-XXXXXX"));
  // The file holds the flushed tokens' entries, pending_mask_ the pending ones'.
  const int64_t flushed = num_tokens_ - static_cast<int64_t>(pending_.size());
  const std::vector<uint8_t> ones(static_cast<size_t>(kBlockTokens), 1);
  for (int64_t done = 0; done < flushed; done += kBlockTokens)
    SY_RETURN_IF_ERROR(write_all(mask_fd_, ones.data(),
                                 static_cast<size_t>(std::min(kBlockTokens, flushed - done)),
                                 path_));
  pending_mask_.reserve(static_cast<size_t>(kBlockTokens));
  pending_mask_.assign(pending_.size(), 1);
  return absl::OkStatus();
}

absl::Status ShardWriter::append_document(const int32_t* ids, int64_t count,
                                          const uint8_t* loss_mask) {
  SY_CHECK(!closed_);
  if (loss_mask != nullptr && mask_fd_ < 0) SY_RETURN_IF_ERROR(start_loss_mask());
  for (int64_t i = 0; i < count; ++i) {
    if (mask_fd_ >= 0) {
      const uint8_t m = loss_mask ? loss_mask[i] : 1;
      if (m > 1)
        return absl::InvalidArgumentError(absl::StrCat(
            path_, ": loss mask entry ", static_cast<int>(m), " of document ", num_documents(),
            " is not 0 or 1"));
      pending_mask_.push_back(m);
    }
    if (ids[i] < 0 || ids[i] >= attributes_.vocab_size)
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": token id ", ids[i], " of document ", num_documents(),
                       " is outside the vocabulary (", attributes_.vocab_size, ")"));
    pending_.push_back(static_cast<uint32_t>(ids[i]));
    if (static_cast<int64_t>(pending_.size()) == kBlockTokens) SY_RETURN_IF_ERROR(flush());
  }
  num_tokens_ += count;
  doc_offsets_.push_back(num_tokens_);
  return absl::OkStatus();
}

absl::Status ShardWriter::flush() {
  const std::string bytes =
      pack_tokens(pending_.data(), static_cast<int64_t>(pending_.size()), dtype_);
  SY_RETURN_IF_ERROR(write_all(spill_fd_, bytes.data(), bytes.size(), path_));
  pending_.clear();
  if (mask_fd_ >= 0) {
    SY_RETURN_IF_ERROR(write_all(mask_fd_, pending_mask_.data(), pending_mask_.size(), path_));
    pending_mask_.clear();
  }
  return absl::OkStatus();
}

absl::Status ShardWriter::close() {
  SY_CHECK(!closed_);
  closed_ = true;
  SY_RETURN_IF_ERROR(flush());
  SY_ASSIGN_OR_RETURN(H5Handle h5, create_hdf5_file(path_));
  const hid_t file = h5.get();
  SY_RETURN_IF_ERROR(copy_spill(file, spill_fd_, "tokens",
                                dtype_ == TokenDType::kUint16 ? H5T_STD_U16LE : H5T_STD_U32LE,
                                token_bytes(dtype_), num_tokens_, path_));
  if (mask_fd_ >= 0)
    SY_RETURN_IF_ERROR(copy_spill(file, mask_fd_, "loss_mask", H5T_STD_U8LE, 1, num_tokens_, path_));
  const hsize_t offsets = doc_offsets_.size();
  H5Handle space(H5Screate_simple(1, &offsets, nullptr), H5Sclose);
  errno = 0;
  H5Handle dataset(create_dataset(file, "doc_offsets", H5T_STD_I64LE, space.get()), H5Dclose);
  if (!dataset.valid() || H5Dwrite(dataset.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                   doc_offsets_.data()) < 0)
    return absl::DataLossError(absl::StrCat(path_, ": cannot write doc_offsets: ", errno_reason()));
  dataset.reset();
  const SpecialTokenIds& special = attributes_.special_ids;
  absl::Status status = write_int_attribute(file, "format_version", attributes_.format_version);
  status.Update(write_string_attribute(file, "tokenizer_sha256", attributes_.tokenizer_sha256));
  status.Update(write_int_attribute(file, "vocab_size", attributes_.vocab_size));
  status.Update(write_int_attribute(file, "unk_id", special.unk));
  status.Update(write_int_attribute(file, "bos_id", special.bos));
  status.Update(write_int_attribute(file, "eos_id", special.eos));
  status.Update(write_int_attribute(file, "pad_id", special.pad));
  if (!status.ok()) return absl::DataLossError(absl::StrCat(path_, ": ", status.message()));
  errno = 0;
  if (!h5.reset())
    return absl::DataLossError(
        absl::StrCat(path_, ": cannot finish the shard file: ", errno_reason()));
  return fsync_path(path_);
}

absl::StatusOr<std::shared_ptr<ShardReader>> ShardReader::open(const std::string& path) {
  SY_ASSIGN_OR_RETURN(Hdf5File file, Hdf5File::open(path));
  return from_file(std::move(file));
}

absl::StatusOr<std::shared_ptr<ShardReader>> ShardReader::open_image(std::string_view bytes,
                                                                     const std::string& name) {
  SY_ASSIGN_OR_RETURN(Hdf5File file, Hdf5File::open_image(bytes, name));
  return from_file(std::move(file));
}

absl::StatusOr<std::shared_ptr<ShardReader>> ShardReader::from_file(Hdf5File file) {
  std::shared_ptr<ShardReader> r(new ShardReader(std::move(file)));
  r->path_ = r->file_.name();
  SY_RETURN_IF_ERROR(r->read_attributes());
  SY_RETURN_IF_ERROR(r->open_tokens());
  SY_RETURN_IF_ERROR(r->check_doc_offsets());
  SY_RETURN_IF_ERROR(r->open_loss_mask());
  return r;
}

absl::Status ShardReader::read_attributes() {
  ShardAttributes& a = attributes_;
  SY_ASSIGN_OR_RETURN(a.format_version, read_int_attribute(file_, "format_version"));
  if (a.format_version != kTokenFormatVersion)
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": format_version ", a.format_version, "; this build reads version ",
        kTokenFormatVersion, " (prepare the dataset again with `switchyard data prepare`)"));
  SY_ASSIGN_OR_RETURN(a.tokenizer_sha256, read_string_attribute(file_, "tokenizer_sha256"));
  SY_ASSIGN_OR_RETURN(a.vocab_size, read_int_attribute(file_, "vocab_size"));
  if (a.vocab_size <= 0 || a.vocab_size > kMaxVocabSize)
    return absl::InvalidArgumentError(absl::StrCat(path_, ": attribute vocab_size ", a.vocab_size,
                                                   " is outside [1, ", kMaxVocabSize, "]"));
  SpecialTokenIds& ids = a.special_ids;
  for (auto [name, id] : {std::pair{"unk_id", &ids.unk}, std::pair{"bos_id", &ids.bos},
                          std::pair{"eos_id", &ids.eos}, std::pair{"pad_id", &ids.pad}}) {
    SY_ASSIGN_OR_RETURN(*id, read_int_attribute(file_, name, -1));
    SY_RETURN_IF_ERROR(check_special_id(path_, name, *id, a.vocab_size));
  }
  return absl::OkStatus();
}

absl::Status ShardReader::open_tokens() {
  SY_ASSIGN_OR_RETURN(tokens_, file_.dataset("tokens"));
  const Hdf5Type& type = tokens_.type;
  if (type.type_class != Hdf5Type::kInteger || type.is_signed || (type.size != 2 && type.size != 4))
    return absl::InvalidArgumentError(absl::StrCat(tokens_.where, " must be uint16 or uint32"));
  dtype_ = type.size == 2 ? TokenDType::kUint16 : TokenDType::kUint32;
  SY_ASSIGN_OR_RETURN(num_tokens_, one_dimensional_length(tokens_));
  return absl::OkStatus();
}

ShardReader::~ShardReader() = default;

absl::StatusOr<Hdf5Dataset> ShardReader::doc_offsets_dataset() const {
  SY_ASSIGN_OR_RETURN(const Hdf5Dataset dataset, file_.dataset("doc_offsets"));
  if (dataset.type.type_class != Hdf5Type::kInteger || dataset.type.size != 8)
    return absl::InvalidArgumentError(absl::StrCat(dataset.where, " must hold 64-bit integers"));
  SY_ASSIGN_OR_RETURN(const int64_t size, one_dimensional_length(dataset));
  if (size < 1 || size > num_tokens_ + 1)
    return absl::InvalidArgumentError(absl::StrCat(dataset.where, " has ", size,
                                                   " entries; its ", num_tokens_,
                                                   " tokens allow 1 to ", num_tokens_ + 1));
  return dataset;
}

// Reads /doc_offsets in blocks, so that a long one (a sparse file can declare gigabytes)
// is checked without holding it: it must rise from 0 to the number of tokens.
absl::Status ShardReader::check_doc_offsets() {
  SY_ASSIGN_OR_RETURN(const Hdf5Dataset dataset, doc_offsets_dataset());
  const int64_t size = dataset.dims[0];
  std::vector<int64_t> block;
  int64_t previous = 0;
  bool rising = true;
  for (int64_t start = 0; start < size && rising; start += kBlockTokens) {
    block.resize(static_cast<size_t>(std::min(kBlockTokens, size - start)));
    SY_RETURN_IF_ERROR(file_.read(dataset, start * 8, static_cast<int64_t>(block.size()) * 8,
                                  block.data()));
    if (start == 0 && block.front() != 0) rising = false;
    for (const int64_t offset : block) {
      rising = rising && offset >= previous;
      previous = offset;
    }
  }
  if (!rising || previous != num_tokens_)
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": /doc_offsets must rise from 0 to the number of tokens (", num_tokens_, ")"));
  num_documents_ = size - 1;
  return absl::OkStatus();
}

absl::Status ShardReader::open_loss_mask() {
  absl::StatusOr<Hdf5Dataset> mask = file_.dataset("loss_mask");
  if (absl::IsNotFound(mask.status())) return absl::OkStatus();
  SY_RETURN_IF_ERROR(mask.status());
  if (mask->type.type_class != Hdf5Type::kInteger || mask->type.size != 1)
    return absl::InvalidArgumentError(absl::StrCat(mask->where, " must be uint8"));
  SY_ASSIGN_OR_RETURN(const int64_t length, one_dimensional_length(*mask));
  if (length != num_tokens_)
    return absl::InvalidArgumentError(absl::StrCat(mask->where, " has ", length,
                                                   " entries, not one per token (", num_tokens_,
                                                   ")"));
  loss_mask_ = std::move(*mask);
  return absl::OkStatus();
}

absl::Status ShardReader::read_loss_mask(int64_t start, int64_t count, uint8_t* out) const {
  SY_CHECK(start >= 0 && count >= 0 && start + count <= num_tokens_);
  if (!loss_mask_) {
    std::fill_n(out, count, uint8_t{1});
    return absl::OkStatus();
  }
  SY_RETURN_IF_ERROR(file_.read(*loss_mask_, start, count, out));
  const uint8_t* bad = std::find_if(out, out + count, [](uint8_t m) { return m > 1; });
  if (bad != out + count)
    return absl::InvalidArgumentError(absl::StrCat(path_, ": /loss_mask entry ",
                                                   start + (bad - out), " is ",
                                                   static_cast<int>(*bad), ", not 0 or 1"));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ShardReader::count_loss_tokens() const {
  std::vector<uint8_t> block(static_cast<size_t>(std::min(num_tokens_, kScanTokens)));
  int64_t carrying = 0;
  for (int64_t start = 0; start < num_tokens_; start += kScanTokens) {
    const int64_t count = std::min(kScanTokens, num_tokens_ - start);
    SY_RETURN_IF_ERROR(read_loss_mask(start, count, block.data()));
    carrying += std::count(block.begin(), block.begin() + count, uint8_t{1});
  }
  return carrying;
}

absl::StatusOr<std::vector<int64_t>> ShardReader::read_doc_offsets() const {
  SY_ASSIGN_OR_RETURN(const Hdf5Dataset dataset, doc_offsets_dataset());
  std::vector<int64_t> offsets(static_cast<size_t>(dataset.dims[0]));
  SY_RETURN_IF_ERROR(file_.read(dataset, 0, dataset.num_bytes, offsets.data()));
  return offsets;
}

absl::Status ShardReader::read_tokens(int64_t start, int64_t count, int32_t* out) const {
  SY_CHECK(start >= 0 && count >= 0 && start + count <= num_tokens_);
  if (count == 0) return absl::OkStatus();
  // The stored ids go into the front of the int32 buffer (uint32: the same width; ids
  // are checked below). uint16 ids are then widened in place from the last one down, so
  // each is read before its slot is written over.
  auto* ids = reinterpret_cast<uint32_t*>(out);
  const int64_t width = token_bytes(dtype_);
  SY_RETURN_IF_ERROR(file_.read(tokens_, start * width, count * width, ids));
  if (dtype_ == TokenDType::kUint16) {
    const char* narrow = reinterpret_cast<const char*>(ids);
    for (int64_t i = count - 1; i >= 0; --i) {
      uint16_t id;
      std::memcpy(&id, narrow + 2 * i, 2);
      ids[i] = id;
    }
  }
  const uint32_t vocab = static_cast<uint32_t>(attributes_.vocab_size);
  uint32_t bad = 0;
  for (int64_t i = 0; i < count; ++i) bad |= ids[i] >= vocab;
  if (bad) {
    const int64_t i =
        std::find_if(ids, ids + count, [&](uint32_t id) { return id >= vocab; }) - ids;
    return absl::InvalidArgumentError(absl::StrCat(path_, ": token ", start + i, " has id ", ids[i],
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
