// MemoryStore: a Store inside one process, for tests and for components that share a process.
// Same semantics as the TCP store: the key map and the rules of ADD, compareSet and append are
// KeyValueMap's (store_semantics.h), which the TCP server's StoreEngine uses too.
// Thread safety: all methods may be called concurrently; waits block on a condition variable.
#pragma once

#include <condition_variable>
#include <mutex>

#include "rendezvous/store.h"
#include "rendezvous/store_semantics.h"

namespace cpprun::rendezvous {

class MemoryStore : public Store {
 public:
  using Store::set;
  using Store::wait;

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
  int64_t deletePrefix(const std::string& prefix) override;

 private:
  // REQUIRES: mutex_ held.
  void waitLocked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                  std::chrono::milliseconds timeout);

  std::mutex mutex_;
  std::condition_variable changed_;
  KeyValueMap data_;
};

}  // namespace cpprun::rendezvous
