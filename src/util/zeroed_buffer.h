// ZeroedBuffer: a large, zero-filled, page-aligned block of host memory whose
// pages are provided by the kernel on first touch (an anonymous private
// mapping). A CPU KV pool sized from a share of the machine's memory costs
// nothing until sequences write into it, and allocating it is instant
// instead of writing gigabytes of zeros.
//
// Move-only; unmaps itself. Thread-safety: as for plain memory.
#pragma once

#include <cstddef>
#include <cstdint>

#include "util/status.h"

namespace agentkv {

class ZeroedBuffer {
 public:
  ZeroedBuffer() = default;
  ~ZeroedBuffer();
  ZeroedBuffer(ZeroedBuffer&& other) noexcept;
  ZeroedBuffer& operator=(ZeroedBuffer&& other) noexcept;
  ZeroedBuffer(const ZeroedBuffer&) = delete;
  ZeroedBuffer& operator=(const ZeroedBuffer&) = delete;

  // `bytes` of zeros (0: an empty buffer). ResourceExhausted when the
  // address space or the kernel's overcommit policy refuses it.
  static Result<ZeroedBuffer> Allocate(size_t bytes);

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(data_);
  }

 private:
  void Release();
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace agentkv
