#include "util/zeroed_buffer.h"

#include <sys/mman.h>

#include <string>
#include <utility>

namespace agentkv {

ZeroedBuffer::~ZeroedBuffer() { Release(); }

ZeroedBuffer::ZeroedBuffer(ZeroedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

ZeroedBuffer& ZeroedBuffer::operator=(ZeroedBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void ZeroedBuffer::Release() {
  if (data_ != nullptr) munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

Result<ZeroedBuffer> ZeroedBuffer::Allocate(size_t bytes) {
  ZeroedBuffer b;
  if (bytes == 0) return b;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return ResourceExhausted("cannot map " + std::to_string(bytes) + " bytes of host memory");
  }
  b.data_ = static_cast<std::byte*>(p);
  b.size_ = bytes;
  return b;
}

}  // namespace agentkv
