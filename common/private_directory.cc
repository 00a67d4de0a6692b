#include "common/private_directory.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

namespace cpprun {

namespace {

constexpr size_t kMaxPrefixBytes = 200;  // NAME_MAX is 255; mkdtemp adds 6

std::string errnoText(const char* call, const std::string& path, int error) {
  return std::string(call) + " " + path + ": " + std::strerror(error);
}

std::string octalMode(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

// A descriptor closed at the end of its scope.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// "/a/b/c" -> {"/a/b", "c"}; "c" -> {".", "c"}; trailing slashes dropped.
std::pair<std::string, std::string> splitParent(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return {".", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

bool isOneComponent(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos;
}

Status removeEntryAt(int parent_fd, const std::string& name, const std::string& shown, int depth);

// Removes what is in the directory `dir_fd` (taken: closed here).
Status emptyDirectory(int dir_fd, const std::string& shown, int depth) {
  DIR* dir = ::fdopendir(dir_fd);
  if (dir == nullptr) {
    const int error = errno;
    ::close(dir_fd);
    return unavailable(errnoText("fdopendir", shown, error));
  }
  // The names first, then the removals: removing while reading may skip entries.
  std::vector<std::string> names;
  errno = 0;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
    errno = 0;
  }
  const int read_error = errno;
  Status status =
      read_error == 0 ? Status::ok() : unavailable(errnoText("readdir", shown, read_error));
  for (const std::string& name : names) {
    if (!status.isOk()) break;
    status = removeEntryAt(::dirfd(dir), name, shown + "/" + name, depth + 1);
  }
  ::closedir(dir);
  return status;
}

// Removes `name` in `parent_fd`: a directory with what is in it, anything else (a link
// included) by unlinking the entry itself.
Status removeEntryAt(int parent_fd, const std::string& name, const std::string& shown, int depth) {
  if (depth > kMaxRemoveDepth) {
    return unavailable("cannot remove " + shown + ": more than " + std::to_string(kMaxRemoveDepth) +
                       " directories deep");
  }
  // O_NOFOLLOW: a link (even one put here after a check) fails with ELOOP and is unlinked as a
  // file; O_DIRECTORY: anything else that is not a directory fails with ENOTDIR.
  const int fd = ::openat(parent_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT) return Status::ok();
    if (error != ELOOP && error != ENOTDIR) return unavailable(errnoText("open", shown, error));
    if (::unlinkat(parent_fd, name.c_str(), 0) != 0 && errno != ENOENT) {
      return unavailable(errnoText("unlink", shown, errno));
    }
    return Status::ok();
  }
  Status emptied = emptyDirectory(fd, shown, depth);
  if (!emptied.isOk()) return emptied;
  if (::unlinkat(parent_fd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
    return unavailable(errnoText("rmdir", shown, errno));
  }
  return Status::ok();
}

}  // namespace

ParentCheck checkParentDirectory(const std::string& dir, const std::string& what) {
  ParentCheck check;
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    check.status = invalidArgument(what + ": " + errnoText("stat", dir, errno));
    return check;
  }
  if (!S_ISDIR(st.st_mode)) {
    check.status = invalidArgument(what + ": " + dir + " is not a directory");
    return check;
  }
  const uid_t me = ::geteuid();
  const bool sticky = (st.st_mode & S_ISVTX) != 0;
  if (st.st_uid != me && st.st_uid != 0) {
    check.status = invalidArgument(
        what + ": " + dir + " belongs to another user (uid " + std::to_string(st.st_uid) +
        "), who could replace the run's directory in it with a link; choose a directory of "
        "your own");
  } else if ((st.st_mode & S_IWOTH) != 0 && !sticky) {
    check.status = invalidArgument(
        what + ": anyone may write " + dir + " (mode " + octalMode(st.st_mode) +
        ") and it has no sticky bit, so another user could replace the run's directory in it "
        "with a link; chmod o-w or +t it, or choose another directory");
  } else if ((st.st_mode & S_IWGRP) != 0 && !sticky) {
    check.warning = what + ": its group may write " + dir + " (mode " + octalMode(st.st_mode) +
                    ") and it has no sticky bit: a member of the group could replace the run's "
                    "directory in it; chmod g-w or +t it unless the group is yours alone";
  }
  return check;
}

Result<std::string> makeFreshDirectory(const std::string& parent, const std::string& prefix) {
  std::string name = prefix.substr(0, kMaxPrefixBytes);
  for (char& c : name) {
    if (c == '/' || c == '\0') c = '_';
  }
  std::string templ = (parent.empty() ? std::string(".") : parent) + "/" + name + "XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  // mkdtemp: mkdir(2) of a random name with mode 0700, retried on EEXIST; mkdir never follows
  // a link in the last component (a link there is EEXIST), so the directory is new.
  if (::mkdtemp(buf.data()) == nullptr) {
    return unavailable("cannot create a directory " + templ + ": " + std::strerror(errno));
  }
  return std::string(buf.data());
}

Status removeTree(const std::string& path) {
  auto [parent, name] = splitParent(path);
  if (!isOneComponent(name)) return invalidArgument("will not remove " + path);
  Fd parent_fd(::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (parent_fd.get() < 0) {
    if (errno == ENOENT) return Status::ok();
    return unavailable(errnoText("open", parent, errno));
  }
  return removeEntryAt(parent_fd.get(), name, path, 0);
}

Result<std::string> makeFreshSubdirectory(const std::string& dir, const std::string& name) {
  if (!isOneComponent(name)) return invalidArgument("not a directory name: " + name);
  const std::string path = dir + "/" + name;
  Fd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir_fd.get() < 0) return unavailable(errnoText("open", dir, errno));
  Status removed = removeEntryAt(dir_fd.get(), name, path, 0);
  if (!removed.isOk()) return removed;
  // Relative to the descriptor: the directory made is in `dir` as opened above, and mkdirat
  // fails (EEXIST) rather than follow a link someone put there in between.
  if (::mkdirat(dir_fd.get(), name.c_str(), 0700) != 0) {
    return unavailable(errnoText("mkdir", path, errno));
  }
  return path;
}

}  // namespace cpprun
