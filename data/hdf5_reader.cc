#include "data/hdf5_reader.h"

#include <cstring>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "core/runtime/file_util.h"
#include "core/runtime/status_macros.h"

namespace switchyard {
namespace {

constexpr std::string_view kSignature("\x89HDF\r\n\x1a\n", 8);
constexpr uint64_t kUndefinedAddress = ~uint64_t{0};
constexpr int64_t kSuperblockBytes = 48;  // version 2 and 3 with 8-byte offsets
// Bounds on one object header: a chunk, all its chunks together, their number, its
// messages (a group of kMaxHdf5GroupLinks members takes about 5 MiB and 65536 messages).
constexpr int64_t kMaxHeaderChunkBytes = int64_t{16} << 20;
constexpr int64_t kMaxHeaderBytes = int64_t{16} << 20;
constexpr size_t kMaxHeaderChunks = 4096;
constexpr size_t kMaxHeaderMessages = size_t{1} << 20;
constexpr size_t kMaxRank = 32;
// A dataset path has at most this many components ("exp_avg/model.norm.weight" has 2).
constexpr int kMaxPathComponents = 16;

// Header message types (HDF5 file format specification, section IV.A.2).
enum MessageType : uint8_t {
  kNil = 0x00,
  kDataspace = 0x01,
  kLinkInfo = 0x02,
  kDatatype = 0x03,
  kFillValueOld = 0x04,
  kFillValue = 0x05,
  kLink = 0x06,
  kExternalFiles = 0x07,
  kLayout = 0x08,
  kGroupInfo = 0x0A,
  kFilterPipeline = 0x0B,
  kAttribute = 0x0C,
  kComment = 0x0D,
  kModificationTimeOld = 0x0E,
  kContinuation = 0x10,
  kSymbolTable = 0x11,
  kModificationTime = 0x12,
  kAttributeInfo = 0x15,
  kReferenceCount = 0x16,
};

bool known_message(uint8_t type) {
  switch (type) {
    case kNil:
    case kDataspace:
    case kLinkInfo:
    case kDatatype:
    case kFillValueOld:
    case kFillValue:
    case kLink:
    case kExternalFiles:
    case kLayout:
    case kGroupInfo:
    case kFilterPipeline:
    case kAttribute:
    case kComment:
    case kModificationTimeOld:
    case kContinuation:
    case kSymbolTable:
    case kModificationTime:
    case kAttributeInfo:
    case kReferenceCount:
      return true;
    default:
      return false;
  }
}

absl::Status damaged(const std::string& where, std::string_view what) {
  return absl::DataLossError(absl::StrCat(where, ": damaged HDF5 ", std::string(what)));
}

absl::Status refused(const std::string& where, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", std::string(what)));
}

// A little-endian cursor over bytes; every read is checked against the end.
class Cursor {
 public:
  explicit Cursor(std::string_view bytes) : bytes_(bytes) {}
  bool uint(size_t width, uint64_t& value) {
    if (width > 8 || left() < width) return false;
    value = 0;
    for (size_t i = 0; i < width; ++i)
      value |= uint64_t{static_cast<uint8_t>(bytes_[pos_ + i])} << (8 * i);
    pos_ += width;
    return true;
  }
  bool take(size_t count, std::string_view& out) {
    if (left() < count) return false;
    out = bytes_.substr(pos_, count);
    pos_ += count;
    return true;
  }
  bool skip(size_t count) {
    std::string_view unused;
    return take(count, unused);
  }
  size_t left() const { return bytes_.size() - pos_; }

 private:
  std::string_view bytes_;
  size_t pos_ = 0;
};

struct Message {
  uint8_t type;
  uint8_t flags;
  std::string_view data;
};

// An object header's messages; `chunks` holds the bytes the messages view (each chunk
// on the heap, so that views stay put when the header moves).
struct ObjectHeader {
  std::vector<std::unique_ptr<std::string>> chunks;
  std::vector<Message> messages;

  std::vector<const Message*> all(uint8_t type) const {
    std::vector<const Message*> found;
    for (const Message& m : messages)
      if (m.type == type) found.push_back(&m);
    return found;
  }
  const Message* first(uint8_t type) const {
    for (const Message& m : messages)
      if (m.type == type) return &m;
    return nullptr;
  }
};

bool add_overflows(uint64_t a, uint64_t b, uint64_t limit) { return a > limit || b > limit - a; }

const char* class_name(uint8_t type_class) {
  switch (type_class) {
    case 2:
      return "a time type";
    case 4:
      return "a bitfield type";
    case 5:
      return "an opaque type";
    case 6:
      return "a compound type";
    case 7:
      return "a reference type";
    case 8:
      return "an enumeration type";
    case 9:
      return "a variable-length type";
    case 10:
      return "an array type";
    default:
      return "an unknown type class";
  }
}

absl::StatusOr<Hdf5Type> parse_integer(Cursor& c, uint64_t bits, uint64_t size,
                                       const std::string& where) {
  uint64_t offset = 0, precision = 0;
  if (!c.uint(2, offset) || !c.uint(2, precision)) return damaged(where, "integer type");
  if ((bits & 1) != 0) return refused(where, "is a big-endian integer, which the engine refuses");
  if ((size != 1 && size != 2 && size != 4 && size != 8) || offset != 0 || precision != size * 8)
    return refused(where, absl::StrCat("is an integer of ", size, " bytes with ", precision,
                                       " bits at bit ", offset, ", which the engine refuses"));
  return Hdf5Type{Hdf5Type::kInteger, static_cast<int64_t>(size), (bits & 0x8) != 0};
}

// IEEE 754 binary32 or binary64, little-endian, the only floats the engine reads.
absl::StatusOr<Hdf5Type> parse_float(Cursor& c, uint64_t bits, uint64_t size,
                                     const std::string& where) {
  uint64_t offset = 0, precision = 0, exp_at = 0, exp_bits = 0, mant_at = 0, mant_bits = 0,
           bias = 0;
  if (!c.uint(2, offset) || !c.uint(2, precision) || !c.uint(1, exp_at) || !c.uint(1, exp_bits) ||
      !c.uint(1, mant_at) || !c.uint(1, mant_bits) || !c.uint(4, bias))
    return damaged(where, "float type");
  const uint64_t sign_at = (bits >> 8) & 0xff;
  const bool little_endian = (bits & 0x41) == 0;
  const bool binary32 = size == 4 && precision == 32 && exp_at == 23 && exp_bits == 8 &&
                        mant_bits == 23 && bias == 127 && sign_at == 31;
  const bool binary64 = size == 8 && precision == 64 && exp_at == 52 && exp_bits == 11 &&
                        mant_bits == 52 && bias == 1023 && sign_at == 63;
  if (!little_endian || offset != 0 || mant_at != 0 || (bits & 0x0e) != 0 ||
      ((bits >> 4) & 3) != 2 || !(binary32 || binary64))
    return refused(where, absl::StrCat("is a float of ", size,
                                       " bytes that is not little-endian IEEE 754, which the "
                                       "engine refuses"));
  return Hdf5Type{Hdf5Type::kFloat, static_cast<int64_t>(size), true};
}

absl::StatusOr<Hdf5Type> parse_datatype(std::string_view bytes, const std::string& where) {
  Cursor c(bytes);
  uint64_t class_version = 0, bits = 0, size = 0;
  if (!c.uint(1, class_version) || !c.uint(3, bits) || !c.uint(4, size))
    return damaged(where, "datatype");
  const uint64_t version = class_version >> 4;
  const uint8_t type_class = class_version & 0x0f;
  if (version < 1 || version > 3) return damaged(where, "datatype version");
  switch (type_class) {
    case 0:
      return parse_integer(c, bits, size, where);
    case 1:
      return parse_float(c, bits, size, where);
    case 3:
      if (size == 0 || (bits & 0x0f) > 2 || ((bits >> 4) & 0x0f) > 1)
        return damaged(where, "string type");
      return Hdf5Type{Hdf5Type::kString, static_cast<int64_t>(size), false};
    default:
      return refused(where, absl::StrCat("is ", class_name(type_class), ", which the engine refuses",
                                         type_class == 9 ? " (write strings fixed-length: "
                                                           "numpy.bytes_ in h5py)"
                                                         : ""));
  }
}

// The extent of a simple or scalar dataspace (version 1 or 2).
absl::StatusOr<std::vector<int64_t>> parse_dataspace(std::string_view bytes,
                                                     const std::string& where) {
  Cursor c(bytes);
  uint64_t version = 0, rank = 0, flags = 0, kind = 1;
  if (!c.uint(1, version) || !c.uint(1, rank) || !c.uint(1, flags))
    return damaged(where, "dataspace");
  if (version == 1) {
    if (!c.skip(5)) return damaged(where, "dataspace");
  } else if (version != 2 || !c.uint(1, kind)) {
    return damaged(where, "dataspace version");
  }
  if (kind == 2) return refused(where, "has a null dataspace (no data), which the engine refuses");
  if (kind > 2 || rank > kMaxRank || (kind == 0 && rank != 0))
    return damaged(where, "dataspace");
  std::vector<int64_t> dims(rank);
  for (int64_t& d : dims) {
    uint64_t value = 0;
    if (!c.uint(8, value) || value > static_cast<uint64_t>(INT64_MAX))
      return damaged(where, "dataspace extent");
    d = static_cast<int64_t>(value);
  }
  return dims;
}

// Elements x `element_bytes`, or nullopt when that overflows int64.
std::optional<int64_t> byte_size(const std::vector<int64_t>& dims, int64_t element_bytes) {
  int64_t total = element_bytes;
  for (int64_t d : dims)
    if (__builtin_mul_overflow(total, d, &total)) return std::nullopt;
  return total;
}

struct Link {
  std::string_view name;
  uint64_t type = 0;
  uint64_t address = kUndefinedAddress;
};

std::optional<Link> parse_link(std::string_view bytes) {
  Cursor c(bytes);
  uint64_t version = 0, flags = 0, charset = 0, name_length = 0;
  Link link;
  if (!c.uint(1, version) || version != 1 || !c.uint(1, flags) ||
      ((flags & 0x08) != 0 && !c.uint(1, link.type)) || ((flags & 0x04) != 0 && !c.skip(8)) ||
      ((flags & 0x10) != 0 && !c.uint(1, charset)) || !c.uint(size_t{1} << (flags & 3), name_length) ||
      name_length == 0 || !c.take(name_length, link.name))
    return std::nullopt;
  if (link.type == 0 && !c.uint(8, link.address)) return std::nullopt;
  return link;
}

const char* link_type_name(uint64_t type) {
  switch (type) {
    case 1:
      return "a soft link";
    case 64:
      return "an external link (to another file)";
    default:
      return "a user-defined link";
  }
}

// The fractal heap address of a link info or attribute info message: defined when the
// object keeps its links or attributes in dense storage, which the engine does not read.
absl::Status check_compact_storage(const Message* info, size_t counter_bytes,
                                   const std::string& where, std::string_view members) {
  if (info == nullptr) return absl::OkStatus();
  Cursor c(info->data);
  uint64_t version = 0, flags = 0, heap = 0;
  if (!c.uint(1, version) || version != 0 || !c.uint(1, flags) ||
      ((flags & 1) != 0 && !c.skip(counter_bytes)) || !c.uint(8, heap))
    return damaged(where, absl::StrCat(std::string(members), " info"));
  if (heap != kUndefinedAddress)
    return refused(where, absl::StrCat("keeps its ", std::string(members),
                                       " in dense storage, which the engine does not read"));
  return absl::OkStatus();
}

struct AttributeParts {
  std::string_view name, datatype, dataspace, data;
};

size_t padded8(size_t n) { return (n + 7) / 8 * 8; }

std::optional<AttributeParts> parse_attribute(std::string_view bytes, bool& shared) {
  Cursor c(bytes);
  uint64_t version = 0, flags = 0, name_size = 0, type_size = 0, space_size = 0;
  if (!c.uint(1, version) || version < 1 || version > 3 || !c.uint(1, flags) ||
      !c.uint(2, name_size) || !c.uint(2, type_size) || !c.uint(2, space_size) ||
      (version == 3 && !c.skip(1)) || name_size == 0)
    return std::nullopt;
  shared = version > 1 && (flags & 0x03) != 0;
  const auto pad = [&](uint64_t n) { return version == 1 ? padded8(n) : n; };
  AttributeParts a;
  if (!c.take(name_size, a.name) || !c.skip(pad(name_size) - name_size) ||
      !c.take(type_size, a.datatype) || !c.skip(pad(type_size) - type_size) ||
      !c.take(space_size, a.dataspace) || !c.skip(pad(space_size) - space_size) ||
      a.name.back() != '\0')
    return std::nullopt;
  a.name.remove_suffix(1);
  c.take(c.left(), a.data);
  return a;
}

uint32_t rotate(uint32_t x, int k) { return (x << k) | (x >> (32 - k)); }

void mix(uint32_t& a, uint32_t& b, uint32_t& c) {
  a -= c, a ^= rotate(c, 4), c += b;
  b -= a, b ^= rotate(a, 6), a += c;
  c -= b, c ^= rotate(b, 8), b += a;
  a -= c, a ^= rotate(c, 16), c += b;
  b -= a, b ^= rotate(a, 19), a += c;
  c -= b, c ^= rotate(b, 4), b += a;
}

void final_mix(uint32_t& a, uint32_t& b, uint32_t& c) {
  c ^= b, c -= rotate(b, 14);
  a ^= c, a -= rotate(c, 11);
  b ^= a, b -= rotate(a, 25);
  c ^= b, c -= rotate(b, 16);
  a ^= c, a -= rotate(c, 4);
  b ^= a, b -= rotate(a, 14);
  c ^= b, c -= rotate(b, 24);
}

uint32_t word(const uint8_t* k, size_t n) {
  uint32_t w = 0;
  for (size_t i = 0; i < n && i < 4; ++i) w |= uint32_t{k[i]} << (8 * i);
  return w;
}

}  // namespace

uint32_t hdf5_checksum(std::string_view bytes) {
  const auto* k = reinterpret_cast<const uint8_t*>(bytes.data());
  size_t length = bytes.size();
  uint32_t a, b, c;
  a = b = c = 0xdeadbeef + static_cast<uint32_t>(length);
  while (length > 12) {
    a += word(k, 4), b += word(k + 4, 4), c += word(k + 8, 4);
    mix(a, b, c);
    length -= 12, k += 12;
  }
  if (length == 0) return c;
  a += word(k, length);
  if (length > 4) b += word(k + 4, length - 4);
  if (length > 8) c += word(k + 8, length - 8);
  final_mix(a, b, c);
  return c;
}

struct Hdf5File::Source {
  std::optional<RegularFile> file;
  std::string image;
};

Hdf5File::Hdf5File(std::string name, std::unique_ptr<Source> source, int64_t size)
    : name_(std::move(name)), source_(std::move(source)), size_(size) {}
Hdf5File::Hdf5File(Hdf5File&&) noexcept = default;
Hdf5File& Hdf5File::operator=(Hdf5File&&) noexcept = default;
Hdf5File::~Hdf5File() = default;

absl::StatusOr<Hdf5File> Hdf5File::open(const std::string& path) {
  SY_ASSIGN_OR_RETURN(RegularFile file, RegularFile::open(path));
  auto source = std::make_unique<Source>();
  const int64_t size = file.size();
  source->file.emplace(std::move(file));
  Hdf5File h5(path, std::move(source), size);
  SY_RETURN_IF_ERROR(h5.read_superblock());
  return h5;
}

absl::StatusOr<Hdf5File> Hdf5File::open_image(std::string_view bytes, const std::string& name) {
  auto source = std::make_unique<Source>();
  source->image.assign(bytes);
  Hdf5File h5(name, std::move(source), static_cast<int64_t>(bytes.size()));
  SY_RETURN_IF_ERROR(h5.read_superblock());
  return h5;
}

absl::Status Hdf5File::read_bytes(int64_t offset, int64_t count, void* out) const {
  if (offset < 0 || count < 0 || offset > size_ || count > size_ - offset)
    return absl::DataLossError(absl::StrCat(name_, ": bytes ", offset, "..", offset + count,
                                            " are past the end of the file (", size_,
                                            " bytes; truncated?)"));
  if (count == 0) return absl::OkStatus();
  if (source_->file) return source_->file->read_at(offset, out, static_cast<size_t>(count));
  std::memcpy(out, source_->image.data() + offset, static_cast<size_t>(count));
  return absl::OkStatus();
}

absl::Status Hdf5File::read_superblock() {
  std::string bytes(static_cast<size_t>(std::min(size_, kSuperblockBytes)), '\0');
  SY_RETURN_IF_ERROR(read_bytes(0, static_cast<int64_t>(bytes.size()), bytes.data()));
  if (!std::string_view(bytes).starts_with(kSignature))
    return absl::DataLossError(absl::StrCat(name_, ": not an HDF5 file (no signature at byte 0)"));
  const uint8_t version = bytes.size() > 8 ? static_cast<uint8_t>(bytes[8]) : 0;
  if (version != 2 && version != 3)
    return refused(name_, absl::StrCat("HDF5 superblock version ", version,
                                       ", which the engine does not read (it reads superblock "
                                       "2 or 3: write the file again with this version of the "
                                       "engine, or with h5py's libver=(\"v108\", \"v108\"), "
                                       "docs/data.md)"));
  if (static_cast<int64_t>(bytes.size()) < kSuperblockBytes)
    return damaged(name_, "superblock (truncated)");
  Cursor c(bytes);
  uint64_t offsets = 0, lengths = 0, base = 0, extension = 0, eof = 0, checksum = 0;
  c.skip(9);
  c.uint(1, offsets), c.uint(1, lengths), c.skip(1);
  c.uint(8, base), c.uint(8, extension), c.uint(8, eof), c.uint(8, root_address_);
  c.uint(4, checksum);
  if (hdf5_checksum(std::string_view(bytes).substr(0, kSuperblockBytes - 4)) != checksum)
    return damaged(name_, "superblock (checksum mismatch)");
  if (offsets != 8 || lengths != 8)
    return refused(name_, absl::StrCat("HDF5 file with ", offsets, "-byte addresses and ", lengths,
                                       "-byte lengths; the engine reads 8-byte ones"));
  if (base != 0) return refused(name_, "HDF5 file with a user block, which the engine refuses");
  if (extension != kUndefinedAddress)
    return refused(name_, "HDF5 superblock extension, which the engine does not read");
  if (eof > static_cast<uint64_t>(size_))
    return absl::DataLossError(absl::StrCat(name_, ": truncated: its superblock records ", eof,
                                            " bytes, the file has ", size_));
  return absl::OkStatus();
}

namespace {

// The object header at `address` of `file`, all its chunks read and checksummed.
class HeaderReader {
 public:
  HeaderReader(const Hdf5File& file, std::string where) : file_(file), where_(std::move(where)) {}

  absl::StatusOr<ObjectHeader> read(uint64_t address) {
    SY_RETURN_IF_ERROR(read_first_chunk(address));
    while (!pending_.empty()) {
      const auto [chunk_address, length] = pending_.back();
      pending_.pop_back();
      SY_RETURN_IF_ERROR(read_continuation(chunk_address, length));
    }
    for (const Message& m : header_.messages) {
      if ((m.flags & 0x02) != 0)
        return refused(where_, "uses a shared HDF5 message, which the engine does not read");
      if (!known_message(m.type))
        return refused(where_, absl::StrCat("holds HDF5 header message type ", int{m.type},
                                            ", which the engine does not read"));
    }
    return std::move(header_);
  }

 private:
  // The bytes [address, address + count) as a new chunk; checks the chunk bounds.
  absl::StatusOr<std::string_view> load(uint64_t address, uint64_t count) {
    if (count > static_cast<uint64_t>(kMaxHeaderChunkBytes) ||
        add_overflows(address, count, static_cast<uint64_t>(file_.size())))
      return damaged(where_, "object header (a chunk outside the file)");
    total_bytes_ += static_cast<int64_t>(count);
    if (header_.chunks.size() >= kMaxHeaderChunks || total_bytes_ > kMaxHeaderBytes ||
        !seen_.insert(address).second)
      return damaged(where_, "object header (too many or repeated chunks)");
    std::string& chunk =
        *header_.chunks.emplace_back(std::make_unique<std::string>(count, '\0'));
    SY_RETURN_IF_ERROR(file_.read_bytes(static_cast<int64_t>(address),
                                        static_cast<int64_t>(count), chunk.data()));
    return std::string_view(chunk);
  }

  absl::Status check_sum(std::string_view chunk) {
    Cursor c(chunk.substr(chunk.size() - 4));
    uint64_t stored = 0;
    c.uint(4, stored);
    if (hdf5_checksum(chunk.substr(0, chunk.size() - 4)) != stored)
      return damaged(where_, "object header (checksum mismatch)");
    return absl::OkStatus();
  }

  absl::Status read_first_chunk(uint64_t address) {
    constexpr size_t kMaxPrefix = 4 + 2 + 16 + 4 + 8;
    if (address >= static_cast<uint64_t>(file_.size()))
      return damaged(where_, "object header (an address outside the file)");
    std::string prefix(std::min<uint64_t>(kMaxPrefix, file_.size() - address), '\0');
    SY_RETURN_IF_ERROR(file_.read_bytes(static_cast<int64_t>(address),
                                        static_cast<int64_t>(prefix.size()), prefix.data()));
    if (!prefix.starts_with("OHDR"))
      return refused(where_, "is not a version 2 HDF5 object header, which the engine does not "
                             "read (it reads the layout it writes)");
    Cursor c(std::string_view(prefix).substr(4));
    uint64_t version = 0, flags = 0, size = 0;
    if (!c.uint(1, version) || version != 2 || !c.uint(1, flags) ||
        ((flags & 0x20) != 0 && !c.skip(16)) || ((flags & 0x10) != 0 && !c.skip(4)) ||
        !c.uint(size_t{1} << (flags & 3), size))
      return damaged(where_, "object header");
    attribute_order_ = (flags & 0x04) != 0;
    const uint64_t prefix_bytes = prefix.size() - c.left();
    if (size > static_cast<uint64_t>(kMaxHeaderChunkBytes))
      return damaged(where_, "object header (a chunk too large)");
    SY_ASSIGN_OR_RETURN(const std::string_view chunk, load(address, prefix_bytes + size + 4));
    SY_RETURN_IF_ERROR(check_sum(chunk));
    return parse_messages(chunk.substr(prefix_bytes, size));
  }

  absl::Status read_continuation(uint64_t address, uint64_t length) {
    if (length < 8) return damaged(where_, "object header continuation");
    SY_ASSIGN_OR_RETURN(const std::string_view chunk, load(address, length));
    if (!chunk.starts_with("OCHK")) return damaged(where_, "object header continuation");
    SY_RETURN_IF_ERROR(check_sum(chunk));
    return parse_messages(chunk.substr(4, chunk.size() - 8));
  }

  absl::Status parse_messages(std::string_view bytes) {
    const size_t envelope = attribute_order_ ? 6 : 4;
    Cursor c(bytes);
    while (c.left() >= envelope) {
      uint64_t type = 0, size = 0, flags = 0;
      std::string_view data;
      c.uint(1, type), c.uint(2, size), c.uint(1, flags);
      if (attribute_order_) c.skip(2);
      if (!c.take(size, data)) return damaged(where_, "object header (a message past its chunk)");
      if (header_.messages.size() >= kMaxHeaderMessages)
        return damaged(where_, "object header (too many messages)");
      header_.messages.push_back(
          {static_cast<uint8_t>(type), static_cast<uint8_t>(flags), data});
      if (type != kContinuation) continue;
      Cursor cont(data);
      uint64_t address = 0, length = 0;
      if (!cont.uint(8, address) || !cont.uint(8, length))
        return damaged(where_, "object header continuation");
      pending_.emplace_back(address, length);
    }
    return absl::OkStatus();
  }

  const Hdf5File& file_;
  std::string where_;
  ObjectHeader header_;
  std::vector<std::pair<uint64_t, uint64_t>> pending_;
  std::set<uint64_t> seen_;
  int64_t total_bytes_ = 0;
  bool attribute_order_ = false;
};

// The address of the member `name` of the group whose header is `group`.
absl::StatusOr<uint64_t> find_member(const ObjectHeader& group, std::string_view name,
                                     const std::string& where, const std::string& member_where) {
  if (group.first(kSymbolTable) != nullptr)
    return refused(where, "is an old-style HDF5 group (symbol table), which the engine does "
                          "not read");
  SY_RETURN_IF_ERROR(check_compact_storage(group.first(kLinkInfo), 8, where, "links"));
  for (const Message* m : group.all(kLink)) {
    const std::optional<Link> link = parse_link(m->data);
    if (!link) return damaged(where, "link");
    if (link->name != name) continue;
    if (link->type != 0)
      return refused(member_where, absl::StrCat("is ", link_type_name(link->type),
                                                ", which the engine refuses"));
    return link->address;
  }
  return absl::NotFoundError(absl::StrCat(member_where, ": no such object"));
}

absl::StatusOr<Hdf5Dataset> parse_dataset(const ObjectHeader& header, const Hdf5File& file,
                                          std::string where) {
  if (header.first(kExternalFiles) != nullptr)
    return refused(where, "keeps its data in external files, which the engine refuses");
  if (header.first(kFilterPipeline) != nullptr)
    return refused(where, "uses HDF5 filters, which the engine does not read");
  const Message* space = header.first(kDataspace);
  const Message* type = header.first(kDatatype);
  const Message* layout = header.first(kLayout);
  if (layout == nullptr || space == nullptr || type == nullptr)
    return refused(where, "is not a dataset");
  Hdf5Dataset d;
  SY_ASSIGN_OR_RETURN(d.type, parse_datatype(type->data, where));
  SY_ASSIGN_OR_RETURN(d.dims, parse_dataspace(space->data, where));
  const std::optional<int64_t> bytes = byte_size(d.dims, d.type.size);
  if (!bytes) return damaged(where, "dataspace (its byte size overflows)");
  d.num_bytes = *bytes;
  Cursor c(layout->data);
  uint64_t version = 0, layout_class = 0, address = 0, size = 0;
  if (!c.uint(1, version) || (version != 3 && version != 4) || !c.uint(1, layout_class))
    return damaged(where, "layout");
  if (layout_class != 1)
    return refused(where, absl::StrCat("is stored ",
                                       layout_class == 0   ? "compact"
                                       : layout_class == 2 ? "in chunks"
                                       : layout_class == 3 ? "as a virtual dataset (data in other files)"
                                                           : "in an unknown layout",
                                       "; the engine reads contiguous datasets"));
  if (!c.uint(8, address) || !c.uint(8, size)) return damaged(where, "layout");
  if (size != static_cast<uint64_t>(d.num_bytes))
    return damaged(where, absl::StrCat("layout (", size, " bytes stored for ", d.num_bytes,
                                       " bytes of data)"));
  if (d.num_bytes > 0 && add_overflows(address, size, static_cast<uint64_t>(file.size())))
    return absl::DataLossError(absl::StrCat(where, ": its ", d.num_bytes,
                                            " bytes of data are not inside the file (",
                                            file.size(), " bytes; truncated?)"));
  d.offset = d.num_bytes > 0 ? static_cast<int64_t>(address) : 0;
  d.where = std::move(where);
  return d;
}

}  // namespace

absl::StatusOr<Hdf5Dataset> Hdf5File::dataset(std::string_view path) const {
  const std::string where = absl::StrCat(name_, ": /", std::string(path));
  uint64_t address = root_address_;
  std::string group_where = absl::StrCat(name_, ": /");
  size_t start = 0;
  int components = 0;
  while (start <= path.size()) {
    const size_t end = std::min(path.find('/', start), path.size());
    const std::string component(path.substr(start, end - start));
    start = end + 1;
    if (component.empty()) continue;
    if (++components > kMaxPathComponents)
      return refused(where, absl::StrCat("is more than ", kMaxPathComponents, " groups deep"));
    SY_ASSIGN_OR_RETURN(const ObjectHeader group, HeaderReader(*this, group_where).read(address));
    std::string member_where =
        absl::StrCat(group_where, group_where.ends_with('/') ? "" : "/", component);
    SY_ASSIGN_OR_RETURN(address, find_member(group, component, group_where, member_where));
    group_where = std::move(member_where);
  }
  SY_ASSIGN_OR_RETURN(const ObjectHeader header, HeaderReader(*this, where).read(address));
  return parse_dataset(header, *this, where);
}

absl::StatusOr<std::optional<Hdf5File::Attribute>> Hdf5File::root_attribute(
    std::string_view name) const {
  const std::string root = absl::StrCat(name_, ": /");
  const std::string where = absl::StrCat(name_, ": attribute ", std::string(name));
  SY_ASSIGN_OR_RETURN(const ObjectHeader header, HeaderReader(*this, root).read(root_address_));
  SY_RETURN_IF_ERROR(check_compact_storage(header.first(kAttributeInfo), 2, root, "attributes"));
  for (const Message* m : header.all(kAttribute)) {
    bool shared = false;
    const std::optional<AttributeParts> parts = parse_attribute(m->data, shared);
    if (!parts) return damaged(root, "attribute");
    if (parts->name != name) continue;
    if (shared) return refused(where, "uses a shared HDF5 message, which the engine does not read");
    Attribute a;
    SY_ASSIGN_OR_RETURN(a.type, parse_datatype(parts->datatype, where));
    SY_ASSIGN_OR_RETURN(const std::vector<int64_t> dims, parse_dataspace(parts->dataspace, where));
    const std::optional<int64_t> bytes = byte_size(dims, 1);
    if (!bytes || *bytes != 1) return refused(where, "must hold exactly one value");
    if (parts->data.size() < static_cast<size_t>(a.type.size))
      return damaged(where, "attribute (its value is cut short)");
    a.bytes.assign(parts->data.substr(0, static_cast<size_t>(a.type.size)));
    return a;
  }
  return std::nullopt;
}

absl::Status Hdf5File::read(const Hdf5Dataset& dataset, int64_t begin, int64_t count,
                            void* out) const {
  if (begin < 0 || count < 0 || begin > dataset.num_bytes || count > dataset.num_bytes - begin)
    return absl::OutOfRangeError(absl::StrCat(dataset.where, ": bytes ", begin, "..",
                                              begin + count, " are outside its data"));
  return read_bytes(dataset.offset + begin, count, out);
}

}  // namespace switchyard
