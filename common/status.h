// Status and Result<T>: errors as values at module boundaries.
//
// A Status is either OK or carries a code and a human-readable message that names what went
// wrong and where ("bind 10.0.0.1:29500: Address already in use"). Result<T> holds a value or a
// non-OK Status. Both are plain values.
// Thread safety: none needed; copy or move them between threads like any value type.
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "common/check.h"

namespace cpprun {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad input from a user: a flag, a file, a value
  kNotFound,
  kAlreadyExists,
  kUnavailable,  // the network or a peer is not there (yet)
  kTimeout,
  kProtocolError,  // bytes that do not follow the wire protocol
  kResourceExhausted,
  kInternal,
};

const char* statusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }

  bool isOk() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "<code name>: <message>", or "OK".
  std::string toString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalidArgument(std::string m) {
  return Status(StatusCode::kInvalidArgument, std::move(m));
}
inline Status unavailable(std::string m) { return Status(StatusCode::kUnavailable, std::move(m)); }
inline Status timeoutError(std::string m) { return Status(StatusCode::kTimeout, std::move(m)); }
inline Status internalError(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    CPPRUN_CHECK(!status_.isOk());
  }

  bool isOk() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  // REQUIRES: isOk().
  T& value() & {
    CPPRUN_CHECK(isOk());
    return *value_;
  }
  const T& value() const& {
    CPPRUN_CHECK(isOk());
    return *value_;
  }
  T&& value() && {
    CPPRUN_CHECK(isOk());
    return std::move(*value_);
  }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace cpprun
