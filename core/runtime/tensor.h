// Tensor: dtype, shape, device, shared storage; contiguous row-major, no autograd.
// Views are only leading-dimension slices and reshapes of the same bytes.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/runtime/bf16.h"
#include "core/runtime/check.h"
#include "core/runtime/device.h"

namespace switchyard {

enum class DType { kF32, kBF16, kF16, kI32, kI64, kU8 };
size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::kF32; }
template <> constexpr DType dtype_of<bf16>() { return DType::kBF16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::kI32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::kI64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::kU8; }

using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& shape);
// For shapes read from files: the element count and byte size, or nullopt when a
// dimension is negative or the count or byte size overflows int64.
std::optional<int64_t> checked_numel(const Shape& shape);
std::optional<int64_t> checked_nbytes(const Shape& shape, DType dtype);
std::string shape_string(const Shape& shape);

class Storage {
 public:
  Storage(Device& device, size_t bytes, MemoryKind kind);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device& device() const { return *device_; }

 private:
  Device* device_;
  void* data_;
  size_t bytes_;
  MemoryKind kind_;
};

class Tensor {
 public:
  Tensor() = default;
  // Uninitialised memory.
  static Tensor empty(const Shape& shape, DType dtype = DType::kF32,
                      MemoryKind kind = MemoryKind::kOther, Device& device = cpu_device());
  static Tensor zeros(const Shape& shape, DType dtype = DType::kF32,
                      MemoryKind kind = MemoryKind::kOther, Device& device = cpu_device());

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const;
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  Device& device() const { return storage_->device(); }

  // Rows (leading-dimension entries) and the size of one row in elements.
  int64_t rows() const { return shape_.empty() ? 1 : shape_[0]; }
  int64_t row_size() const;

  void* raw_data() const {
    return static_cast<char*>(storage_->data()) + offset_bytes_;
  }
  template <typename T> T* data() const {
    SY_CHECK_MSG(dtype_of<T>() == dtype_, "tensor dtype does not match the requested type");
    return static_cast<T*>(raw_data());
  }

  // View of rows [begin, end) along the leading dimension.
  Tensor slice_rows(int64_t begin, int64_t end) const;
  // Same bytes, another shape with the same number of elements.
  Tensor reshape(const Shape& shape) const;
  void zero_();
  // Copies the bytes of `src` (same dtype and numel, any device) into this tensor.
  void copy_from(const Tensor& src);
  // This tensor on `device`: itself when it is there already, else a copy.
  Tensor to(Device& device, MemoryKind kind = MemoryKind::kOther) const;
  // Shorthand for to(cpu_device()): host code reads a tensor from any device this way.
  Tensor on_host() const;

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_bytes_ = 0;
  Shape shape_;
  DType dtype_ = DType::kF32;
};

}  // namespace switchyard
