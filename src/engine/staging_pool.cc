#include "engine/staging_pool.h"

namespace agentkv::engine {

Result<std::shared_ptr<StagingPool>> StagingPool::Create(backend::Backend& backend,
                                                         size_t chunk_bytes, int chunks) {
  std::shared_ptr<StagingPool> p(new StagingPool());
  p->chunk_bytes_ = chunk_bytes;
  for (int i = 0; i < chunks; ++i) {
    ASSIGN_OR_RETURN(backend::HostBuffer b, backend.AllocateHostBuffer(chunk_bytes));
    p->buffers_.push_back(std::move(b));
    p->free_.push_back(chunks - 1 - i);
  }
  return p;
}

std::shared_ptr<std::span<std::byte>> StagingPool::TryAcquire() {
  int index;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.empty()) return nullptr;
    index = free_.back();
    free_.pop_back();
  }
  // The deleter holds the pool: the memory stays while the chunk is out.
  auto* span = new std::span<std::byte>(buffers_[index].span());
  return std::shared_ptr<std::span<std::byte>>(
      span, [pool = shared_from_this(), index](std::span<std::byte>* sp) {
        delete sp;
        pool->Return(index);
      });
}

int StagingPool::free_chunks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(free_.size());
}

void StagingPool::Return(int index) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(index);
}

}  // namespace agentkv::engine
