// Store: the key-value store that agents rendezvous through and workers bootstrap from, with
// c10d's operations and names. Implemented by TcpStoreClient (the network), MemoryStore (one
// process) and PrefixStore (a namespace over another store).
//
// Values are bytes. Keys are opaque bytes too; PrefixStore joins with "/" as c10d does.
// get() and wait() block until the keys exist or the timeout passes (StoreTimeout); every other
// failure is a StoreError. Exceptions are the error channel of this blocking API only; the
// agent catches them at its boundary.
// Thread safety: every implementation may be called from several threads at once.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace cpprun::rendezvous {

using Bytes = std::vector<uint8_t>;

// A store operation failed: connection lost, protocol violated, operation unsupported.
class StoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The store and this client do not share the job's secret (store_auth.h): retrying cannot help.
class StoreAuthError : public StoreError {
 public:
  using StoreError::StoreError;
};

// A bounded wait ran out.
class StoreTimeout : public StoreError {
 public:
  using StoreError::StoreError;
};

// The store did not take a request or answer it within the reply timeout (not a wait that ran
// out): it is silent. TcpStoreClient closes the connection first.
class StoreReplyTimeout : public StoreTimeout {
 public:
  using StoreTimeout::StoreTimeout;
};

inline Bytes toBytes(const std::string& s) { return Bytes(s.begin(), s.end()); }
inline std::string toString(const Bytes& b) { return std::string(b.begin(), b.end()); }

class Store {
 public:
  static constexpr std::chrono::milliseconds kDefaultTimeout{std::chrono::minutes(5)};

  virtual ~Store() = default;

  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Atomically: if the key holds `expected` (or is missing and `expected` is empty), store
  // `desired`. Returns the value now stored; for a missing key with a non-empty `expected`,
  // returns `expected` and stores nothing (c10d's behaviour). Success = result == desired.
  virtual Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) = 0;
  // Waits up to timeout() for the key, then returns its value.
  virtual Bytes get(const std::string& key) = 0;
  // Adds to a decimal counter (created at 0) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // True when the key existed.
  virtual bool deleteKey(const std::string& key) = 0;
  // True when every key exists now. Does not wait.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Every key in the store (all prefixes).
  virtual int64_t numKeys() = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  // Waits up to timeout() for all keys, then returns their values in order.
  virtual std::vector<Bytes> multiGet(const std::vector<std::string>& keys) = 0;
  // REQUIRES: keys.size() == values.size().
  virtual void multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) = 0;
  // Appends to the value, creating it when absent.
  virtual void append(const std::string& key, const Bytes& value) = 0;
  // Not c10d's: removes every key that starts with `prefix` and returns how many, or -1 when
  // the backend has no such request (the TCPStore protocol has none: TcpStoreClient).
  virtual int64_t deletePrefix(const std::string& prefix) {
    (void)prefix;
    return -1;
  }
  // A ticket counter (not c10d's; cpprun's job protocol): takeTicket() gives its callers 1, 2,
  // 3, ... in the order the store serialises them, each number once, and tickets() says how many
  // were taken. By default add(key, 1) and add(key, 0); a backend whose add() must retry under
  // contention (etcd: compare-and-swap, one raft commit per try) hands each caller its number in
  // one write instead. A key used as a ticket counter is used only through these two.
  virtual int64_t takeTicket(const std::string& key) { return add(key, 1); }
  virtual int64_t tickets(const std::string& key) { return add(key, 0); }

  // Convenience for text values.
  void set(const std::string& key, const std::string& value) { set(key, toBytes(value)); }

  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(timeout_ms_.load());
  }
  void setTimeout(std::chrono::milliseconds t) { timeout_ms_.store(t.count()); }

 private:
  std::atomic<int64_t> timeout_ms_{kDefaultTimeout.count()};
};

}  // namespace cpprun::rendezvous
