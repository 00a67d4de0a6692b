#include "common/collective_record.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <utility>

#include "common/clip.h"

namespace cpprun {

namespace {

bool nameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-' || c == '.' || c == ':';
}

}  // namespace

bool validCollectiveName(const std::string& name) {
  return !name.empty() && name.size() <= kMaxCollectiveNameBytes &&
         std::all_of(name.begin(), name.end(), nameChar);
}

Result<CollectiveRecord> parseCollectiveRecord(const std::string& text) {
  const std::string line = text.substr(0, text.find('\n'));
  std::istringstream in(line);
  std::string state, op, group, seq, extra;
  in >> state >> op >> group >> seq;
  auto bad = [](const std::string& what) {
    return Status(StatusCode::kInvalidArgument, "collective record: " + what);
  };
  if (state.empty()) return bad("empty");
  if (in >> extra || seq.empty()) {
    return bad("not \"<in|after> <op> <group> <seq>\": \"" + clipValue(line, 80) + "\"");
  }
  if (state != "in" && state != "after") {
    return bad("state \"" + clipValue(state, 16) + "\" is not in or after");
  }
  if (!validCollectiveName(op) || !validCollectiveName(group)) {
    return bad("op and group are 1 to " + std::to_string(kMaxCollectiveNameBytes) +
               " of [A-Za-z0-9_.:-]");
  }
  if (seq.size() > 19 ||
      !std::all_of(seq.begin(), seq.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return bad("sequence \"" + clipValue(seq, 24) + "\" is not a number");
  }
  CollectiveRecord r;
  r.inside = state == "in";
  r.op = op;
  r.group = group;
  r.seq = std::strtoull(seq.c_str(), nullptr, 10);
  return r;
}

std::string formatCollectiveRecord(const CollectiveRecord& r) {
  std::string line =
      std::string(r.inside ? "in " : "after ") + r.op + " " + r.group + " " + std::to_string(r.seq);
  line.resize(kCollectiveRecordBytes - 1, ' ');
  return line + "\n";
}

CollectiveRecorder CollectiveRecorder::fromEnvironment(std::string group) {
  const char* path = std::getenv(kCollectiveFileVariable);
  return CollectiveRecorder(path == nullptr ? std::string() : std::string(path), std::move(group));
}

CollectiveRecorder::CollectiveRecorder(const std::string& path, std::string group)
    : group_(std::move(group)) {
  if (!path.empty()) fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
}

CollectiveRecorder::~CollectiveRecorder() {
  if (fd_ >= 0) ::close(fd_);
}

CollectiveRecorder::CollectiveRecorder(CollectiveRecorder&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), group_(std::move(other.group_)), seq_(other.seq_) {}

CollectiveRecorder& CollectiveRecorder::operator=(CollectiveRecorder&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    group_ = std::move(other.group_);
    seq_ = other.seq_;
  }
  return *this;
}

CollectiveRecorder::Scope CollectiveRecorder::enter(const char* op) {
  ++seq_;
  write(true, op);
  return Scope(*this, op);
}

CollectiveRecorder::Scope::~Scope() {
  if (std::uncaught_exceptions() == exceptions_) owner_.write(false, op_);
}

void CollectiveRecorder::write(bool inside, const char* op) {
  if (fd_ < 0) return;
  const std::string line = formatCollectiveRecord({inside, op, group_, seq_});
  // Best effort: a record never breaks training.
  (void)!::pwrite(fd_, line.data(), line.size(), 0);
}

}  // namespace cpprun
