// numeric_getnameinfo: an LD_PRELOAD shim that makes getnameinfo() answer with the numeric
// address instead of asking the resolver (NI_NUMERICHOST added to every call).
//
// For tests/bench/store_scale_bench.py only: torch's libuv TCPStore server names every
// accepted client with a blocking getnameinfo() on its only loop thread. Behind this machine's
// resolver a name lookup for ::ffff:127.0.1.x takes seconds, so the as-is server measures the
// resolver, not the store (1,024 ranks: 96 s). With the shim it measures the store; it changes
// nothing else in the server (the name is only used in its log lines).
#include <dlfcn.h>
#include <netdb.h>
#include <sys/socket.h>

using GetNameInfo = int (*)(const sockaddr*, socklen_t, char*, socklen_t, char*, socklen_t, int);

extern "C" int getnameinfo(const sockaddr* sa, socklen_t salen, char* host, socklen_t hostlen,
                           char* serv, socklen_t servlen, int flags) {
  static GetNameInfo real = nullptr;
  if (!real) real = reinterpret_cast<GetNameInfo>(dlsym(RTLD_NEXT, "getnameinfo"));
  return real(sa, salen, host, hostlen, serv, servlen, flags | NI_NUMERICHOST);
}
