// cpprun_launcher_probe: what a process started by the ProcessLauncher sees of itself, read
// from inside it (the kernel's view, not the launcher's), one "key=value" per line on stdout:
//
//   pid, pgid, ppid, sid     getpid(), getpgid(0), getppid(), getsid(0)
//   stdin_foreground         tcgetpgrp(0): the foreground group of the terminal on stdin
//                            (-1 when stdin is not this process's controlling terminal)
//   pdeathsig                prctl(PR_GET_PDEATHSIG)
//   sigblk, sigign, sigcgt   SigBlk, SigIgn, SigCgt of /proc/self/status (hex masks)
//   fds                      open descriptors above 2, e.g. "3 7" (empty: none)
//   stdin                    where descriptor 0 points (readlink /proc/self/fd/0)
//   cpus                     Cpus_allowed_list of /proc/self/status
//   mempolicy                get_mempolicy(2): "default", "bind:<nodes>", "preferred:<nodes>",
//                            "interleave:<nodes>", "local" or "mode<N>:<nodes>"
//   env.<NAME>               the value of every NAME given as an argument ("<unset>" if unset)
//
// Usage: cpprun_launcher_probe [NAME...] [--hold]
// --hold: after printing (and closing stdout), pause() until killed.
// Exit status 0; 1 when something could not be read.
#include <dirent.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

std::string statusField(const std::string& name) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, name.size() + 1, name + ":") == 0) {
      size_t v = line.find_first_not_of(" \t", name.size() + 1);
      return v == std::string::npos ? "" : line.substr(v);
    }
  }
  return "?";
}

std::string openFdsAbove2() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return "?";
  const int own = ::dirfd(dir);
  std::string out;
  while (dirent* e = ::readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const int fd = std::atoi(e->d_name);
    if (fd <= 2 || fd == own) continue;
    out += (out.empty() ? "" : " ") + std::to_string(fd);
  }
  ::closedir(dir);
  return out;
}

std::string linkOf(const char* path) {
  char buf[PATH_MAX];
  ssize_t n = ::readlink(path, buf, sizeof buf - 1);
  return n < 0 ? "?" : std::string(buf, static_cast<size_t>(n));
}

std::string memPolicy() {
  int mode = -1;
  unsigned long mask[16] = {};
  const unsigned long maxnode = sizeof(mask) * 8;
  if (::syscall(SYS_get_mempolicy, &mode, mask, maxnode, nullptr, 0UL) != 0) {
    return std::string("? (") + std::strerror(errno) + ")";
  }
  std::string nodes;
  for (unsigned long bit = 0; bit < maxnode; ++bit) {
    if ((mask[bit / 64] >> (bit % 64)) & 1UL) {
      nodes += (nodes.empty() ? "" : ",") + std::to_string(bit);
    }
  }
  switch (mode) {  // linux/mempolicy.h
    case 0:
      return "default";
    case 1:
      return "preferred:" + nodes;
    case 2:
      return "bind:" + nodes;
    case 3:
      return "interleave:" + nodes;
    case 4:
      return "local";
    default:
      return "mode" + std::to_string(mode) + ":" + nodes;
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool hold = false;
  std::vector<std::string> names;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--hold") == 0) {
      hold = true;
    } else {
      names.emplace_back(argv[i]);
    }
  }
  std::string out;
  auto put = [&](const std::string& k, const std::string& v) { out += k + "=" + v + "\n"; };
  int pdeathsig = -1;
  ::prctl(PR_GET_PDEATHSIG, &pdeathsig);
  put("pid", std::to_string(::getpid()));
  put("pgid", std::to_string(::getpgid(0)));
  put("ppid", std::to_string(::getppid()));
  put("sid", std::to_string(::getsid(0)));
  put("stdin_foreground", std::to_string(::tcgetpgrp(0)));
  put("pdeathsig", std::to_string(pdeathsig));
  put("sigblk", statusField("SigBlk"));
  put("sigign", statusField("SigIgn"));
  put("sigcgt", statusField("SigCgt"));
  put("fds", openFdsAbove2());
  put("stdin", linkOf("/proc/self/fd/0"));
  put("cpus", statusField("Cpus_allowed_list"));
  put("mempolicy", memPolicy());
  for (const std::string& name : names) {
    const char* v = std::getenv(name.c_str());
    put("env." + name, v != nullptr ? v : "<unset>");
  }
  put("end", "1");
  if (std::fwrite(out.data(), 1, out.size(), stdout) != out.size() || std::fflush(stdout) != 0) {
    return 1;
  }
  if (hold) {
    std::fclose(stdout);
    for (;;) ::pause();
  }
  return 0;
}
