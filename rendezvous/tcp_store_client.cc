#include "rendezvous/tcp_store_client.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <thread>

#include "common/network_address.h"
#include "rendezvous/store_auth.h"
#include "rendezvous/store_semantics.h"

namespace cpprun::rendezvous {

using wire::Dialect;
using wire::QueryType;
using wire::Request;

namespace {

int remainingMs(std::chrono::steady_clock::time_point deadline) {
  // Round up: poll() must not return before the deadline.
  auto left =
      std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  if (left.count() <= 0) return 0;
  return static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
}

std::string errnoText(int err) { return std::strerror(err); }

// One non-blocking connect attempt to one address, bounded by `deadline`. Returns the fd or -1
// with *err set.
int connectOnce(const ResolvedAddress& a, std::chrono::steady_clock::time_point deadline,
                int* err) {
  int fd = ::socket(a.family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, IPPROTO_TCP);
  if (fd < 0) {
    *err = errno;
    return -1;
  }
  if (::connect(fd, a.sockaddrPtr(), a.length) != 0) {
    if (errno != EINPROGRESS) {
      *err = errno;
      ::close(fd);
      return -1;
    }
    pollfd p{fd, POLLOUT, 0};
    int rc;
    do {
      rc = ::poll(&p, 1, remainingMs(deadline));
    } while (rc < 0 && errno == EINTR);
    if (rc <= 0) {
      *err = rc == 0 ? ETIMEDOUT : errno;
      ::close(fd);
      return -1;
    }
    int so_error = 0;
    socklen_t len = sizeof(so_error);
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len);
    if (so_error != 0) {
      *err = so_error;
      ::close(fd);
      return -1;
    }
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // Blocking from now on; every send and recv is bounded by SO_SNDTIMEO / SO_RCVTIMEO.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

}  // namespace

TcpStoreClient::TcpStoreClient(TcpStoreClientOptions options) : options_(std::move(options)) {
  setTimeout(options_.timeout);
  std::lock_guard<std::mutex> lock(mutex_);
  connectWithRetry();
}

TcpStoreClient::~TcpStoreClient() { closeConnection(); }

void TcpStoreClient::closeConnection() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  in_pos_ = in_end_ = 0;
  recv_timeout_ms_ = send_timeout_ms_ = 0;
}

void TcpStoreClient::fail(const std::string& what) {
  closeConnection();
  throw StoreError("store " + formatHostPort(options_.host, options_.port) + ": " + what);
}

void TcpStoreClient::ensureConnected() {
  if (fd_ < 0) connectWithRetry();
}

void TcpStoreClient::connectWithRetry() {
  auto start = Clock::now();
  auto give_up = start + options_.connect_timeout;
  auto backoff = options_.initial_backoff;
  std::mt19937 rng(static_cast<uint32_t>(::getpid()) ^
                   static_cast<uint32_t>(start.time_since_epoch().count()));
  std::string last_error = "no attempt";
  int attempts = 0;
  while (true) {
    ++attempts;
    auto resolved = resolveTcp(options_.host, options_.port);
    if (!resolved.isOk()) {
      last_error = "cannot resolve host: " + resolved.status().message();
    } else {
      for (const ResolvedAddress& a : resolved.value()) {
        int err = 0;
        // A single attempt may not use up the whole budget: a dropped SYN must be retried.
        auto attempt_deadline = std::min(give_up, Clock::now() + std::chrono::seconds(5));
        fd_ = connectOnce(a, attempt_deadline, &err);
        if (fd_ < 0) last_error = errnoText(err);
        if (fd_ >= 0) break;
      }
    }
    if (fd_ >= 0) {
      try {
        handshake(std::min(Clock::now() + timeout(), Clock::now() + options_.connect_timeout));
        return;
      } catch (const StoreAuthError&) {
        closeConnection();
        throw;
      } catch (const StoreError& e) {
        last_error = e.what();
        closeConnection();
      }
    }
    auto now = Clock::now();
    if (now >= give_up) break;
    // Exponential backoff with jitter in [backoff/2, backoff], never past the deadline.
    std::uniform_int_distribution<int64_t> jitter(backoff.count() / 2, backoff.count());
    auto pause = std::chrono::milliseconds(std::max<int64_t>(1, jitter(rng)));
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(give_up - now);
    std::this_thread::sleep_for(std::min(pause, left));
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
  throw StoreTimeout("cannot connect to store " + formatHostPort(options_.host, options_.port) +
                     " within " + std::to_string(options_.connect_timeout.count()) + " ms (" +
                     std::to_string(attempts) + " attempts): " + last_error);
}

void TcpStoreClient::handshake(Clock::time_point deadline) {
  if (options_.dialect != Dialect::kV2) return;
  Request validate;
  validate.type = QueryType::VALIDATE;
  validate.u32 = wire::kValidationMagic;
  Request ping;
  ping.type = QueryType::PING;
  ping.u32 = static_cast<uint32_t>(::getpid());
  out_.clear();
  wire::encodeRequest(Dialect::kV2, validate, &out_);
  wire::encodeRequest(Dialect::kV2, ping, &out_);
  last_request_ = "the VALIDATE + PING handshake";
  sendAll(out_.data(), out_.size(), deadline);
  uint32_t echo = readReply(QueryType::PING, 0, deadline).u32;
  if (echo != ping.u32) {
    fail("handshake: PING echoed " + std::to_string(echo) + ", expected " +
         std::to_string(ping.u32) + " (not a torch>=2.2-compatible store?)");
  }
  if (!options_.secret.empty()) authenticate(deadline);
}

std::optional<std::string> TcpStoreClient::authStep(const std::string& step,
                                                    const std::string& data,
                                                    Clock::time_point deadline) {
  Request r;
  r.type = QueryType::CPPRUN_AUTH;
  r.keys = {step};
  r.values = {wire::Bytes(data.begin(), data.end())};
  out_.clear();
  wire::encodeRequest(Dialect::kV2, r, &out_);
  last_request_ = "the authentication (CPPRUN_AUTH)";
  try {
    sendAll(out_.data(), out_.size(), deadline);
    const wire::Reply& reply = readReply(QueryType::CPPRUN_AUTH, 1, deadline);
    return reply.values.empty() ? std::string() : toString(reply.values[0]);
  } catch (const StoreTimeout&) {
    throw;
  } catch (const StoreError&) {
    return std::nullopt;  // the server closed the connection on it
  }
}

void TcpStoreClient::authenticate(Clock::time_point deadline) {
  auto refuse = [&](const std::string& why) {
    closeConnection();
    throw StoreAuthError("store " + formatHostPort(options_.host, options_.port) + ": " + why +
                         " (docs/security.md)");
  };
  const std::string client_nonce = randomBytes(kAuthNonceBytes);
  const std::optional<std::string> hello = authStep(kAuthHello, client_nonce, deadline);
  if (!hello)
    refuse("it closed the connection on cpprun's authentication: it is not a cpprun store");
  if (hello->empty()) {
    refuse(
        "it has no job secret, but this agent has one: it is not this job's store, or its "
        "agent was started without the secret");
  }
  if (hello->size() != kAuthNonceBytes + kAuthProofBytes)
    refuse("a malformed authentication reply");
  const std::string server_nonce = hello->substr(0, kAuthNonceBytes);
  if (!proofsEqual(hello->substr(kAuthNonceBytes),
                   serverProof(options_.secret, client_nonce, server_nonce))) {
    refuse("it does not hold this job's secret: it is not this job's store");
  }
  const std::optional<std::string> ok =
      authStep(kAuthProof, clientProof(options_.secret, client_nonce, server_nonce), deadline);
  if (ok != std::string("ok")) refuse("it did not accept this agent's proof");
}

void TcpStoreClient::sendAll(const uint8_t* data, size_t size, Clock::time_point deadline) {
  while (size > 0) {
    int left = remainingMs(deadline);
    if (left == 0) {
      closeConnection();
      throw StoreReplyTimeout("store " + formatHostPort(options_.host, options_.port) +
                              ": send timed out");
    }
    setSocketTimeout(SO_SNDTIMEO, left, &send_timeout_ms_);
    ssize_t n = ::send(fd_, data, size, MSG_NOSIGNAL);
    if (n > 0) {
      data += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    fail(std::string("sending ") + last_request_ + ": " + errnoText(errno));
  }
}

bool TcpStoreClient::fill(size_t need, Clock::time_point deadline, bool allow_timeout) {
  if (in_pos_ == in_end_) in_pos_ = in_end_ = 0;
  while (in_end_ - in_pos_ < need) {
    int left = remainingMs(deadline);
    if (left == 0) {
      if (allow_timeout && in_end_ == in_pos_) return false;
      closeConnection();
      throw StoreReplyTimeout("store " + formatHostPort(options_.host, options_.port) +
                              ": no reply within the " + std::to_string(timeout().count()) +
                              " ms timeout");
    }
    setSocketTimeout(SO_RCVTIMEO, left, &recv_timeout_ms_);
    // in_ is [consumed | unread | free]; in_end_ marks the end of the unread bytes. Its
    // capacity only grows (never zero-filled again per read).
    size_t unread = in_end_ - in_pos_;
    if (in_.size() - in_pos_ < need) {
      std::memmove(in_.data(), in_.data() + in_pos_, unread);
      in_pos_ = 0;
      in_end_ = unread;
      if (in_.size() < need) in_.resize(std::max(need, 2 * in_.size()));
    }
    // A blocking recv bounded by SO_RCVTIMEO: one system call per reply, not poll + recv.
    ssize_t n = ::recv(fd_, in_.data() + in_end_, in_.size() - in_end_, 0);
    if (n > 0) {
      in_end_ += static_cast<size_t>(n);
      continue;
    }
    if (n == 0 || (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) {
      // A server closes the connection on a request it rejects or does not have (torch's
      // legacy server on QUEUE_*, any server on ADD to a non-numeric value).
      fail(std::string(n == 0 ? "connection closed by the server" : "recv: " + errnoText(errno)) +
           " while awaiting the reply to " + last_request_ +
           " (a server closes the connection on a request it rejects or does not support)");
    }
  }
  return true;
}

void TcpStoreClient::setSocketTimeout(int option, int ms, int* current_ms) {
  // Re-arm only when the bound moved by more than 1% (at least 2 ms): a blocking call may end
  // that much past its deadline, and the common case (every call bounded by the same store
  // timeout) costs no extra system call.
  int slack = std::max(2, ms / 100);
  if (*current_ms > 0 && std::abs(*current_ms - ms) <= slack) return;
  timeval tv{};
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  ::setsockopt(fd_, SOL_SOCKET, option, &tv, sizeof(tv));
  *current_ms = ms;
}

wire::Reply& TcpStoreClient::readReply(QueryType type, size_t keys, Clock::time_point deadline) {
  constexpr uint64_t kMaxReplyValue = 1ULL << 32;
  const wire::ReplyShape shape = wire::operation(type).reply;
  while (true) {
    size_t length = 0;
    std::string error;
    switch (wire::parseReply(shape, keys, in_.data() + in_pos_, in_end_ - in_pos_, kMaxReplyValue,
                             &reply_, &length, &error)) {
      case wire::ParseStatus::kRequest:
        in_pos_ += length;
        return reply_;
      case wire::ParseStatus::kNeedMore:
        fill(length, deadline);
        break;
      case wire::ParseStatus::kError:
        fail(std::string(wire::queryTypeName(type)) + " reply: " + error);
    }
  }
}

wire::Reply& TcpStoreClient::call(const Request& r, Clock::time_point deadline) {
  sendRequest(r, deadline);
  return readReply(r.type, r.keys.size(), deadline);
}

void TcpStoreClient::sendRequest(const Request& r, Clock::time_point deadline) {
  ensureConnected();
  out_.clear();
  last_request_ = wire::queryTypeName(r.type);
  if (!wire::encodeRequest(options_.dialect, r, &out_)) {
    throw StoreError(std::string(wire::queryTypeName(r.type)) + " is not available with a " +
                     wire::dialectName(options_.dialect) + " server");
  }
  sendAll(out_.data(), out_.size(), deadline);
}

void TcpStoreClient::requireV2(const char* op) const {
  if (options_.dialect != Dialect::kV2) {
    throw StoreError(std::string(op) + " needs a torch>=2.2 store; this client speaks " +
                     wire::dialectName(options_.dialect));
  }
}

void TcpStoreClient::set(const std::string& key, const Bytes& value) {
  std::lock_guard<std::mutex> lock(mutex_);
  Request r;
  r.type = QueryType::SET;
  r.keys = {key};
  r.values = {value};
  sendRequest(r, deadline());
}

Bytes TcpStoreClient::compareSet(const std::string& key, const Bytes& expected,
                                 const Bytes& desired) {
  std::lock_guard<std::mutex> lock(mutex_);
  Request r;
  r.type = QueryType::COMPARE_SET;
  r.keys = {key};
  r.values = {expected, desired};
  return std::move(call(r, deadline()).values[0]);
}

Bytes TcpStoreClient::getLocked(const std::string& key) {
  waitLocked({key}, timeout());
  Request r;
  r.type = QueryType::GET;
  r.keys = {key};
  return std::move(call(r, deadline()).values[0]);
}

Bytes TcpStoreClient::get(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  return getLocked(key);
}

int64_t TcpStoreClient::add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> lock(mutex_);
  Request r;
  r.type = QueryType::ADD;
  r.keys = {key};
  r.integer = delta;
  return call(r, deadline()).integer;
}

bool TcpStoreClient::deleteKey(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  Request r;
  r.type = QueryType::DELETE_KEY;
  r.keys = {key};
  return call(r, deadline()).integer > 0;
}

bool TcpStoreClient::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  Request r;
  r.type = QueryType::CHECK;
  r.keys = keys;
  uint8_t reply = call(r, deadline()).byte;
  if (reply != wire::kCheckReady && reply != wire::kCheckNotReady) {
    fail("CHECK reply " + std::to_string(reply) + " is neither READY nor NOT_READY");
  }
  return reply == wire::kCheckReady;
}

int64_t TcpStoreClient::numKeys() {
  std::lock_guard<std::mutex> lock(mutex_);
  Request r;
  r.type = QueryType::GETNUMKEYS;
  return call(r, deadline()).integer;
}

void TcpStoreClient::waitLocked(const std::vector<std::string>& keys,
                                std::chrono::milliseconds wait_timeout, QueryType type,
                                const std::string& barrier_key, int64_t world_size) {
  Request r;
  r.type = type;
  if (type == QueryType::BARRIER) {
    r.keys = {barrier_key};
    r.integer = world_size;
  } else {
    r.keys = keys;
  }
  auto d = Clock::now() + wait_timeout;
  sendRequest(r, Clock::now() + timeout());
  if (fill(1, d, /*allow_timeout=*/true)) {
    uint8_t reply = readReply(type, r.keys.size(), d).byte;
    if (reply != wire::kWaitStopWaiting) fail("WAIT reply " + std::to_string(reply));
    return;
  }
  std::string what = std::string(wire::queryTypeName(type)) + " for " +
                     (type == QueryType::BARRIER ? "barrier '" + barrier_key + "'"
                                                 : std::to_string(keys.size()) + " key(s)") +
                     " timed out after " + std::to_string(wait_timeout.count()) + " ms";
  if (options_.dialect == Dialect::kLegacy) {
    // A legacy server answers this wait later; that byte would be read as the next reply.
    closeConnection();
    throw StoreTimeout(what);
  }
  Request cancel;
  cancel.type = QueryType::CANCEL_WAIT;
  auto cd = Clock::now() + timeout();
  // The wait's wake-up may have raced the cancel: its byte comes first.
  uint8_t reply = call(cancel, cd).byte;
  if (reply == wire::kWaitStopWaiting) reply = readReply(QueryType::CANCEL_WAIT, 0, cd).byte;
  if (reply != wire::kWaitCanceled) fail("CANCEL_WAIT reply " + std::to_string(reply));
  throw StoreTimeout(what);
}

void TcpStoreClient::wait(const std::vector<std::string>& keys,
                          std::chrono::milliseconds wait_timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  waitLocked(keys, wait_timeout);
}

std::vector<Bytes> TcpStoreClient::multiGet(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Bytes> values;
  if (options_.dialect == Dialect::kLegacy) {
    for (const auto& k : keys) values.push_back(getLocked(k));
    return values;
  }
  waitLocked(keys, timeout());
  Request r;
  r.type = QueryType::MULTI_GET;
  r.keys = keys;
  return std::move(call(r, deadline()).values);
}

void TcpStoreClient::multiSet(const std::vector<std::string>& keys,
                              const std::vector<Bytes>& values) {
  if (keys.size() != values.size()) {
    throw StoreError("multiSet: " + std::to_string(keys.size()) + " keys but " +
                     std::to_string(values.size()) + " values");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto d = deadline();
  if (options_.dialect == Dialect::kLegacy) {
    for (size_t i = 0; i < keys.size(); ++i) {
      Request r;
      r.type = QueryType::SET;
      r.keys = {keys[i]};
      r.values = {values[i]};
      sendRequest(r, d);
    }
    return;
  }
  Request r;
  r.type = QueryType::MULTI_SET;
  r.keys = keys;
  r.values = values;
  sendRequest(r, d);
}

void TcpStoreClient::append(const std::string& key, const Bytes& value) {
  if (options_.dialect == Dialect::kLegacy) {
    // No APPEND before torch 2.1: an atomic compareSet loop does the same. Start by assuming
    // the key is absent (expected empty creates it); each failed attempt returns the current
    // value to build on. A reply equal to `expected` (not `desired`) means the key is absent.
    if (value.empty()) return;
    Bytes current;
    for (int attempt = 0; attempt < 1000; ++attempt) {
      Bytes desired = current;
      appendInPlace(&desired, value);
      Bytes answer = compareSet(key, current, desired);
      switch (compareSetOutcome(answer, current, desired)) {
        case CompareSetOutcome::kStored:
          return;
        case CompareSetOutcome::kAbsent:
          current.clear();
          break;
        case CompareSetOutcome::kHolds:
          current = std::move(answer);
          break;
      }
    }
    throw StoreError("append to '" + key + "': gave up after 1000 contended attempts");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  Request r;
  r.type = QueryType::APPEND;
  r.keys = {key};
  r.values = {value};
  sendRequest(r, deadline());
}

uint32_t TcpStoreClient::ping(uint32_t nonce) {
  requireV2("PING");
  std::lock_guard<std::mutex> lock(mutex_);
  Request r;
  r.type = QueryType::PING;
  r.u32 = nonce;
  return call(r, deadline()).u32;
}

void TcpStoreClient::queuePush(const std::string& key, const Bytes& value) {
  requireV2("QUEUE_PUSH");
  std::lock_guard<std::mutex> lock(mutex_);
  Request r;
  r.type = QueryType::QUEUE_PUSH;
  r.keys = {key};
  r.values = {value};
  sendRequest(r, deadline());
}

Bytes TcpStoreClient::queuePop(const std::string& key) {
  requireV2("QUEUE_POP");
  std::lock_guard<std::mutex> lock(mutex_);
  auto give_up = deadline();
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(give_up - Clock::now());
    waitLocked({key}, std::max(left, std::chrono::milliseconds(0)));
    Request r;
    r.type = QueryType::QUEUE_POP;
    r.keys = {key};
    wire::Reply& reply = call(r, deadline());
    if (reply.integer > 0) return std::move(reply.values[0]);
    // Another client popped the item between our wake-up and our pop: wait again.
  }
}

int64_t TcpStoreClient::queueLength(const std::string& key) {
  requireV2("QUEUE_LEN");
  std::lock_guard<std::mutex> lock(mutex_);
  Request r;
  r.type = QueryType::QUEUE_LEN;
  r.keys = {key};
  return call(r, deadline()).integer;
}

std::vector<std::string> TcpStoreClient::listKeys() {
  requireV2("LIST_KEYS");
  std::lock_guard<std::mutex> lock(mutex_);
  Request r;
  r.type = QueryType::LIST_KEYS;
  std::vector<std::string> keys;
  for (const Bytes& k : call(r, deadline()).values) keys.push_back(toString(k));
  return keys;
}

void TcpStoreClient::barrier(const std::string& key, int64_t world_size,
                             std::chrono::milliseconds barrier_timeout) {
  requireV2("BARRIER");
  std::lock_guard<std::mutex> lock(mutex_);
  waitLocked({}, barrier_timeout, QueryType::BARRIER, key, world_size);
}

}  // namespace cpprun::rendezvous
