// CountingStore: a rendezvous::Store decorator that counts what one connection asks of the store
// — requests, and payload bytes (keys and values sent, values and counters received; no framing)
// — into a StoreCounters the caller owns. The rendezvous simulation (rdzv_sim_bench.cc) gives
// every simulated agent one StoreCounters for all its connections, so the store load of the job
// protocol can be read per agent and per phase, over any backend (cpprun's TCP store, etcd).
//
// What it cannot see: traffic a backend makes outside the Store interface (etcd's lease
// keep-alives and watches of LeaseLiveness run on clients of their own).
//
// Thread safety: StoreCounters is atomics, read and bumped from any thread. A CountingStore is
// as thread-safe as the store it wraps (the coordinator uses each connection from one thread).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "rendezvous/store.h"

namespace cpprun::bench {

struct StoreCounters {
  std::atomic<uint64_t> ops{0};
  std::atomic<uint64_t> bytes_out{0};  // keys and values sent
  std::atomic<uint64_t> bytes_in{0};   // values and counters received
};

// A plain copy of StoreCounters at one moment.
struct CountSnapshot {
  uint64_t ops = 0;
  uint64_t bytes_out = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes() const { return bytes_out + bytes_in; }
};

inline CountSnapshot snapshotOf(const StoreCounters& c) {
  return {c.ops.load(), c.bytes_out.load(), c.bytes_in.load()};
}

inline CountSnapshot operator-(const CountSnapshot& a, const CountSnapshot& b) {
  return {a.ops - b.ops, a.bytes_out - b.bytes_out, a.bytes_in - b.bytes_in};
}

class CountingStore : public rendezvous::Store {
 public:
  using Store::set;
  using Store::wait;
  using Bytes = rendezvous::Bytes;

  // REQUIRES: inner != nullptr; `counters` outlives this store.
  CountingStore(std::unique_ptr<rendezvous::Store> inner, StoreCounters& counters)
      : inner_(std::move(inner)), c_(counters) {
    setTimeout(inner_->timeout());
  }

  void set(const std::string& key, const Bytes& value) override {
    count(key.size() + value.size(), 0);
    inner_->set(key, value);
  }
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    Bytes stored = inner_->compareSet(key, expected, desired);
    count(key.size() + expected.size() + desired.size(), stored.size());
    return stored;
  }
  Bytes get(const std::string& key) override {
    Bytes value = inner_->get(key);
    count(key.size(), value.size());
    return value;
  }
  int64_t add(const std::string& key, int64_t delta) override {
    count(key.size() + 8, 8);
    return inner_->add(key, delta);
  }
  bool deleteKey(const std::string& key) override {
    count(key.size(), 1);
    return inner_->deleteKey(key);
  }
  bool check(const std::vector<std::string>& keys) override {
    count(keysSize(keys), 1);
    return inner_->check(keys);
  }
  int64_t numKeys() override {
    count(0, 8);
    return inner_->numKeys();
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    count(keysSize(keys), 0);
    inner_->wait(keys, timeout);
  }
  std::vector<Bytes> multiGet(const std::vector<std::string>& keys) override {
    std::vector<Bytes> values = inner_->multiGet(keys);
    uint64_t in = 0;
    for (const Bytes& v : values) in += v.size();
    count(keysSize(keys), in);
    return values;
  }
  void multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override {
    uint64_t out = keysSize(keys);
    for (const Bytes& v : values) out += v.size();
    count(out, 0);
    inner_->multiSet(keys, values);
  }
  void append(const std::string& key, const Bytes& value) override {
    count(key.size() + value.size(), 0);
    inner_->append(key, value);
  }
  int64_t takeTicket(const std::string& key) override {
    count(key.size(), 8);
    return inner_->takeTicket(key);
  }
  int64_t tickets(const std::string& key) override {
    count(key.size(), 8);
    return inner_->tickets(key);
  }

 private:
  static uint64_t keysSize(const std::vector<std::string>& keys) {
    uint64_t n = 0;
    for (const std::string& k : keys) n += k.size();
    return n;
  }
  void count(uint64_t out, uint64_t in) {
    c_.ops.fetch_add(1, std::memory_order_relaxed);
    c_.bytes_out.fetch_add(out, std::memory_order_relaxed);
    c_.bytes_in.fetch_add(in, std::memory_order_relaxed);
  }

  std::unique_ptr<rendezvous::Store> inner_;
  StoreCounters& c_;
};

}  // namespace cpprun::bench
