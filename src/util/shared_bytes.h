// SharedBytes: an immutable run of bytes that shares ownership of whatever
// holds them: a string it took over, or a slice of a larger buffer (the
// engine's pinned staging chunks, so that a turn's KV goes from the device
// copy to the store's compressor without another copy). Copies share the
// owner, which is released with the last of them, on whichever thread.
//
// Thread-safety: as std::shared_ptr; nothing writes through a SharedBytes.
// The owner must keep the bytes unchanged while any SharedBytes refers to
// them.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

namespace agentkv {

class SharedBytes {
 public:
  SharedBytes() = default;
  // Takes over `s` (implicit: a string is the common case).
  SharedBytes(std::string s) {  // NOLINT(google-explicit-constructor)
    auto owned = std::make_shared<const std::string>(std::move(s));
    bytes_ = *owned;
    owner_ = std::move(owned);
  }
  // `bytes` inside memory that `owner` keeps alive.
  SharedBytes(std::shared_ptr<const void> owner, std::string_view bytes)
      : owner_(std::move(owner)), bytes_(bytes) {}

  std::string_view view() const { return bytes_; }
  const char* data() const { return bytes_.data(); }
  size_t size() const { return bytes_.size(); }
  bool empty() const { return bytes_.empty(); }
  std::string str() const { return std::string(bytes_); }
  void clear() {
    owner_.reset();
    bytes_ = {};
  }
  friend bool operator==(const SharedBytes& a, std::string_view b) { return a.bytes_ == b; }

 private:
  std::shared_ptr<const void> owner_;
  std::string_view bytes_;
};

}  // namespace agentkv
