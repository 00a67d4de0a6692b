#include "common/status.h"

namespace cpprun {

const char* statusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kNotFound:
      return "not found";
    case StatusCode::kAlreadyExists:
      return "already exists";
    case StatusCode::kUnavailable:
      return "unavailable";
    case StatusCode::kTimeout:
      return "timeout";
    case StatusCode::kProtocolError:
      return "protocol error";
    case StatusCode::kResourceExhausted:
      return "resource exhausted";
    case StatusCode::kInternal:
      return "internal error";
  }
  return "unknown";
}

std::string Status::toString() const {
  if (isOk()) return "OK";
  return std::string(statusCodeName(code_)) + ": " + message_;
}

}  // namespace cpprun
