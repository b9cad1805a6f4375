// StagingPool: a fixed set of equal host buffers from Backend::AllocateHostBuffer
// (pinned on a GPU) that the engine lends out for device reads whose bytes
// live on after the engine is done with them: a finished turn's KV is read
// into a chunk asynchronously, handed to the KV tier as SharedBytes slices of
// it, and the chunk comes back when the tier's last reference is gone.
//
// Thread-safety: TryAcquire on the engine thread; chunks are returned from
// any thread (the store's writer drops them). The pool lives while any chunk
// is out (each chunk holds it), so a tier may outlast the engine; the
// memory is freed through the backend's allocator by whichever thread lets
// go last (host memory only, never device memory).
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "engine/backend/backend.h"
#include "util/status.h"

namespace agentkv::engine {

class StagingPool : public std::enable_shared_from_this<StagingPool> {
 public:
  // `chunks` buffers of `chunk_bytes` each, allocated now (not in hot paths).
  static Result<std::shared_ptr<StagingPool>> Create(backend::Backend& backend, size_t chunk_bytes,
                                                     int chunks);

  // A free chunk, or null when every chunk is out. The chunk returns to the
  // pool when the last copy of the pointer is destroyed.
  std::shared_ptr<std::span<std::byte>> TryAcquire();

  size_t chunk_bytes() const { return chunk_bytes_; }
  int chunks() const { return static_cast<int>(buffers_.size()); }
  int free_chunks() const;

 private:
  StagingPool() = default;
  void Return(int index);

  size_t chunk_bytes_ = 0;
  std::vector<backend::HostBuffer> buffers_;
  mutable std::mutex mu_;
  std::vector<int> free_;
};

}  // namespace agentkv::engine
