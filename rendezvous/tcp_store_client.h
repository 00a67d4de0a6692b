// TcpStoreClient: the blocking client of a TCPStore server (ours or PyTorch's).
//
// Speaks the torch >= 2.2 dialect by default (VALIDATE + PING handshake, CANCEL_WAIT on wait
// timeouts); Dialect::kLegacy talks to torch <= 2.0 servers, emulating the operations they lack
// (multiGet/multiSet by single requests, append by a compareSet loop applying the store's
// append rule, store_semantics.h) and dropping the
// connection after a timed-out wait, because a legacy server answers that wait later and would
// desynchronise the stream.
//
// Every call is bounded: connecting retries with exponential backoff and jitter until
// connect_timeout; each request must complete within timeout() (waits: their own timeout).
// A broken connection throws StoreError and is re-established on the next call.
// Thread safety: all methods may be called from several threads; one request is in flight at a
// time per client (a mutex serialises them), as the protocol requires.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "rendezvous/store.h"
#include "rendezvous/wire.h"

namespace cpprun::rendezvous {

struct TcpStoreClientOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  wire::Dialect dialect = wire::Dialect::kV2;
  // How long connecting may keep retrying (the server may not be up yet).
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(60)};
  // Default bound of every call; Store::setTimeout() changes it later.
  std::chrono::milliseconds timeout{Store::kDefaultTimeout};
  std::chrono::milliseconds initial_backoff{10};
  std::chrono::milliseconds max_backoff{1000};
  // The job's secret (store_auth.h). When set (kV2 only), every connection proves it after the
  // handshake and the server must prove it too: a store without the secret, or one that fails
  // its proof, is refused with StoreAuthError (not retried).
  std::string secret;
};

class TcpStoreClient : public Store {
 public:
  using Store::set;
  using Store::wait;

  // Connects (with retries) and, for kV2, performs the VALIDATE + PING handshake.
  // Throws StoreError / StoreTimeout when the server cannot be reached in connect_timeout.
  explicit TcpStoreClient(TcpStoreClientOptions options);
  ~TcpStoreClient() override;
  TcpStoreClient(const TcpStoreClient&) = delete;
  TcpStoreClient& operator=(const TcpStoreClient&) = delete;

  void set(const std::string& key, const Bytes& value) override;
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t numKeys() override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  std::vector<Bytes> multiGet(const std::vector<std::string>& keys) override;
  void multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;
  void append(const std::string& key, const Bytes& value) override;

  // torch >= 2.2 extras (StoreError on a legacy connection).
  // Round trip with a nonce; returns the echoed nonce.
  uint32_t ping(uint32_t nonce);
  void queuePush(const std::string& key, const Bytes& value);
  // Waits up to timeout() for an item, then pops it.
  Bytes queuePop(const std::string& key);
  int64_t queueLength(const std::string& key);
  std::vector<std::string> listKeys();
  // Counts this caller in and waits until `world_size` callers arrived under `key`.
  void barrier(const std::string& key, int64_t world_size, std::chrono::milliseconds timeout);

  // Drops the connection without saying goodbye (tests, and after a fork).
  void closeConnection();
  const TcpStoreClientOptions& options() const { return options_; }

 private:
  using Clock = std::chrono::steady_clock;

  // All REQUIRES: mutex_ held.
  void ensureConnected();
  void connectWithRetry();
  void handshake(Clock::time_point deadline);
  // CPPRUN_AUTH hello + proof (store_auth.h); StoreAuthError when the store is not the job's.
  void authenticate(Clock::time_point deadline);
  // One CPPRUN_AUTH request and its reply; nullopt when the server closed the connection on it.
  std::optional<std::string> authStep(const std::string& step, const std::string& data,
                                      Clock::time_point deadline);
  void sendRequest(const wire::Request& r, Clock::time_point deadline);
  void sendAll(const uint8_t* data, size_t size, Clock::time_point deadline);
  // Returns false when the deadline passed before any byte arrived (only when allow_timeout).
  bool fill(size_t need, Clock::time_point deadline, bool allow_timeout = false);
  // Reads the reply to a request of `type` naming `keys` keys, decoded in the shape the wire
  // table gives it (wire::parseReply). The result lives until the next read.
  // The caller may move its values out.
  wire::Reply& readReply(wire::QueryType type, size_t keys, Clock::time_point deadline);
  // sendRequest + readReply.
  wire::Reply& call(const wire::Request& r, Clock::time_point deadline);
  void waitLocked(const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                  wire::QueryType type = wire::QueryType::WAIT, const std::string& barrier_key = {},
                  int64_t world_size = 0);
  Bytes getLocked(const std::string& key);
  // Sets SO_RCVTIMEO / SO_SNDTIMEO to `ms` unless *current_ms is already close to it.
  void setSocketTimeout(int option, int ms, int* current_ms);
  void requireV2(const char* op) const;
  [[noreturn]] void fail(const std::string& what);
  Clock::time_point deadline() const { return Clock::now() + timeout(); }

  TcpStoreClientOptions options_;
  std::mutex mutex_;
  int fd_ = -1;
  Bytes out_;
  Bytes in_ = Bytes(64 * 1024);  // received bytes: [in_pos_, in_end_) are unread
  size_t in_pos_ = 0;
  size_t in_end_ = 0;
  wire::Reply reply_;  // the last reply read (its buffers are reused)
  // The request whose bytes were sent last (named in errors: a server that rejects or lacks a
  // request closes the connection, and that is all the client sees).
  const char* last_request_ = "handshake";
  int recv_timeout_ms_ = 0;  // what SO_RCVTIMEO is set to (0: not set)
  int send_timeout_ms_ = 0;
};

}  // namespace cpprun::rendezvous
