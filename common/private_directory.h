// Private directories: the run directory cpprun makes under --log-dir (and under $TMPDIR) and
// the attempt directories in it, made fresh and removed without following a symbolic link.
//
// The threat is another user of the node (docs/security.md, "The log directory"): a name cpprun
// would use, planted in advance as a link to a directory of their choice, would make cpprun
// write its workers' output there or delete what is there. So a run's directory is always a new
// one (mkdtemp: a new name, mode 0700, never an existing entry), nothing in it is removed
// through a link (a link is removed itself; directories are opened with O_NOFOLLOW and emptied
// through their descriptors), and the directory it is made in is checked: one where another
// user could rename cpprun's entry away and put a link in its place is refused.
//
// Thread safety: free functions without shared state; concurrent calls on different paths are
// safe.
#pragma once

#include <string>

#include "common/status.h"

namespace cpprun {

// How far removeTree descends; a deeper tree is an error (named), not a crash.
inline constexpr int kMaxRemoveDepth = 64;

// Whether `dir` (an existing directory; a link the user named in the path is followed) may hold
// a private directory of this user. `status` is kInvalidArgument when another user could replace
// an entry of it: `dir` is owned by someone other than this user or root, or anyone may write it
// without the sticky bit (as /tmp has). `warning` is set (status OK) when its group may write it
// without the sticky bit: with a user private group (umask 002) that is only this user, so it is
// allowed, and said. `what` names the directory in messages ("--log-dir").
struct ParentCheck {
  Status status;
  std::string warning;
};
ParentCheck checkParentDirectory(const std::string& dir, const std::string& what);

// Makes `<parent>/<prefix>XXXXXX` with mkdtemp(3): a name that did not exist, mode 0700, owned
// by this user. `prefix` is used as a file name: a '/' in it becomes '_' and it is cut to 200
// bytes. REQUIRES: `parent` exists.
Result<std::string> makeFreshDirectory(const std::string& parent, const std::string& prefix);

// Removes `path` and everything under it without following a link: a link (at `path` or in the
// tree) is removed itself, never what it points to; directories are opened with O_NOFOLLOW and
// emptied through their descriptors, so an entry swapped for a link while this runs is not
// followed either. A missing `path` is OK. Links in the directories above `path` are the
// caller's (they are followed, as the user named them).
Status removeTree(const std::string& path);

// `<dir>/<name>` made fresh: whatever is there is removed (removeTree), then the directory is
// made with mode 0700 relative to a descriptor of `dir`. Returns its path. `name` is one path
// component (no '/', not "." or "..").
Result<std::string> makeFreshSubdirectory(const std::string& dir, const std::string& name);

}  // namespace cpprun
