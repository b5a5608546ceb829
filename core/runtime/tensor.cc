#include "core/runtime/tensor.h"

#include <cstring>

namespace switchyard {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
  }
  return "?";
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::optional<int64_t> checked_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return std::nullopt;
  return n;
}

std::optional<int64_t> checked_nbytes(const Shape& shape, DType dtype) {
  const std::optional<int64_t> n = checked_numel(shape);
  int64_t bytes = 0;
  if (!n || __builtin_mul_overflow(*n, static_cast<int64_t>(dtype_size(dtype)), &bytes))
    return std::nullopt;
  return bytes;
}

std::string shape_string(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

Storage::Storage(Device& device, size_t bytes, MemoryKind kind)
    : device_(&device), data_(device.allocate(bytes, kind)), bytes_(bytes), kind_(kind) {}

Storage::~Storage() { device_->deallocate(data_, bytes_, kind_); }

Tensor Tensor::empty(const Shape& shape, DType dtype, MemoryKind kind, Device& device) {
  for (int64_t d : shape) SY_CHECK_MSG(d >= 0, "negative tensor dimension");
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(device, t.nbytes(), kind);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, MemoryKind kind, Device& device) {
  Tensor t = empty(shape, dtype, kind, device);
  t.zero_();
  return t;
}

int64_t Tensor::dim(int i) const {
  if (i < 0) i += rank();
  SY_CHECK(i >= 0 && i < rank());
  return shape_[i];
}

int64_t Tensor::row_size() const {
  // The product of the trailing dimensions, so that it stays defined with zero rows.
  int64_t n = 1;
  for (size_t i = 1; i < shape_.size(); ++i) n *= shape_[i];
  return n;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  SY_CHECK(!shape_.empty() && 0 <= begin && begin <= end && end <= shape_[0]);
  Tensor t = *this;
  t.offset_bytes_ += static_cast<size_t>(begin * row_size()) * dtype_size(dtype_);
  t.shape_[0] = end - begin;
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  SY_CHECK_MSG(shape_numel(shape) == numel(), "reshape changes the number of elements");
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

void Tensor::zero_() { device().fill_zero(raw_data(), nbytes()); }

void Tensor::copy_from(const Tensor& src) {
  SY_CHECK(src.dtype() == dtype_ && src.numel() == numel());
  Device& to = device();
  Device& from = src.device();
  Device& host = cpu_device();
  if (&to == &from) {
    to.copy_within(raw_data(), src.raw_data(), nbytes());
  } else if (&from == &host) {
    to.copy_from_host(raw_data(), src.raw_data(), nbytes());
  } else if (&to == &host) {
    from.copy_to_host(raw_data(), src.raw_data(), nbytes());
  } else {
    // Between two devices: through the host, which keeps GPUs free of peer access setup.
    copy_from(src.on_host());
  }
}

Tensor Tensor::to(Device& device, MemoryKind kind) const {
  if (&this->device() == &device) return *this;
  Tensor t = empty(shape_, dtype_, kind, device);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::on_host() const { return to(cpu_device()); }

}  // namespace switchyard
