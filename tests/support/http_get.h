// httpGetRaw / httpRequestRaw: one blocking HTTP/1.1 GET (or other method, no body) to 127.0.0.1
// with "Connection: close", for the tests and the benchmark of the agent's metrics endpoint.
// Header-only and free of any test framework, so the benchmark (which does not link the test
// support library) shares it. Thread safety: none needed; every call has its own socket.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace cpprun::testing {

// The raw response (status line, headers and body), read until the server closes, each read
// bounded by `timeout`. nullopt when nothing listens or the request cannot be sent. `headers`
// (each line ending in "\r\n") replace the default Host (curl's, for 127.0.0.1: the agent
// checks it) and may add others (Origin, Authorization).
inline std::optional<std::string> httpRequestRaw(
    int port, const std::string& method, const std::string& target, std::chrono::seconds timeout,
    const std::string& headers = "Host: localhost\r\n") {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  timeval tv{static_cast<time_t>(timeout.count()), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const std::string request = method + " " + target + " HTTP/1.1\r\n" + headers +
                              "Content-Length: 0\r\nConnection: close\r\n\r\n";
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
          static_cast<ssize_t>(request.size())) {
    ::close(fd);
    return std::nullopt;
  }
  std::string raw;
  char buf[65536];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;)
    raw.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return raw;
}

inline std::optional<std::string> httpGetRaw(int port, const std::string& target,
                                             std::chrono::seconds timeout) {
  return httpRequestRaw(port, "GET", target, timeout);
}

}  // namespace cpprun::testing
