// Status and Result<T>: errors that can happen (I/O, bad input, corruption,
// exhaustion) travel as values; no exceptions cross engine/, cache/, store/.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace agentkv {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // bad input from a caller or a user
  kNotFound,           // a file, tensor, agent or record that does not exist
  kCorruption,         // data on disk that fails its checks
  kIoError,            // the operating system said no
  kResourceExhausted,  // out of blocks, disk quota, map size
  kUnimplemented,      // a feature this build does not have
  kCancelled,
  kInternal,  // a bug: an invariant broke
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "Corruption: <message>", or "OK".
  std::string ToString() const;

  // Returns a copy with `context + ": "` prepended to the message.
  Status WithContext(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status Corruption(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
inline Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status ResourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// A value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT: implicit by design
    assert(!std::get<Status>(v_).ok());
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace agentkv

#define AGENTKV_CONCAT_INNER(a, b) a##b
#define AGENTKV_CONCAT(a, b) AGENTKV_CONCAT_INNER(a, b)

// Returns the status from the enclosing function if it is not OK.
#define RETURN_IF_ERROR(expr)       \
  do {                              \
    ::agentkv::Status _st = (expr); \
    if (!_st.ok()) return _st;      \
  } while (0)

// ASSIGN_OR_RETURN(auto x, MakeX()): binds the value or returns the status.
#define ASSIGN_OR_RETURN(decl, expr)                                                          \
  auto AGENTKV_CONCAT(_res_, __LINE__) = (expr);                                              \
  if (!AGENTKV_CONCAT(_res_, __LINE__).ok()) return AGENTKV_CONCAT(_res_, __LINE__).status(); \
  decl = std::move(AGENTKV_CONCAT(_res_, __LINE__)).value()
