// RAII for HDF5 ids, and the switch that keeps HDF5 from printing its error stack:
// failures become absl::Status with one line instead.
#pragma once

#include <hdf5.h>

#include <utility>

namespace switchyard {

// HDF5's automatic error printing is per thread in its thread-safe build, so every
// entry point into HDF5 calls this first.
inline void silence_hdf5_errors() {
  thread_local bool silenced = false;
  if (!silenced) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    silenced = true;
  }
}

class H5Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  H5Handle() = default;
  H5Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  H5Handle(H5Handle&& other) noexcept
      : id_(std::exchange(other.id_, H5I_INVALID_HID)), closer_(other.closer_) {}
  H5Handle& operator=(H5Handle&& other) noexcept {
    reset();
    id_ = std::exchange(other.id_, H5I_INVALID_HID);
    closer_ = other.closer_;
    return *this;
  }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  ~H5Handle() { reset(); }

  bool valid() const { return id_ >= 0; }
  hid_t get() const { return id_; }
  // Closes now; false when HDF5 reports a failure (a write it could not finish).
  bool reset() {
    bool ok = true;
    if (id_ >= 0) ok = closer_(id_) >= 0;
    id_ = H5I_INVALID_HID;
    return ok;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

}  // namespace switchyard
