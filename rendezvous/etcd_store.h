// EtcdStore: the c10d Store over etcd v3, every key under one prefix (e.g. "/cpprun/<run>/"),
// so one etcd cluster can serve many jobs.
//
// set -> put; get/wait -> a range, and while a key is missing a watch from the range's
// revision + 1 (no polling; re-armed after the client's request_timeout, so a member that went
// silent does not hold a waiter) until it appears or the timeout passes (StoreTimeout); add and
// append -> a compare-and-swap txn on mod_revision (create when absent), retried on conflict
// after a random pause that doubles per conflict (the lost txn reads the winner's value back);
// add(key, 0) on an existing key is one read;
// compareSet with c10d's semantics (store.h) in one txn: compare (value, or version 0 for an
// empty `expected`), put on success, and a read of the key on failure, which hands the current
// value back without a second request; wait and multiGet of several keys read them all first
// (up to 128 keys per txn, etcd's default --max-txn-ops) and wait only for those missing;
// multiSet writes them in one txn (up to 128 keys; more go in several, so only that many are
// atomic together); numKeys counts the keys under the prefix (not the whole
// etcd). Values are bytes. Client errors (Result/Status) become StoreError here, and only here.
// Ownership: shares the client. Thread safety: every method may be called from several
// threads (the client serialises requests; each waiting get holds its own watch connection).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "rendezvous/etcd_client.h"
#include "rendezvous/store.h"

namespace cpprun::rendezvous {

class EtcdStore : public Store {
 public:
  using Store::set;
  using Store::wait;

  // REQUIRES: client != nullptr. `prefix` is prepended to every key as is (give it a trailing
  // "/" if you want one).
  EtcdStore(std::shared_ptr<EtcdClient> client, std::string prefix);

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
  // One DeleteRange over [prefix, prefixEnd(prefix)): one raft commit, whatever the count.
  int64_t deletePrefix(const std::string& prefix) override;
  // One txn [put(key, ""), range(key)] that no other caller can make fail: the ticket is the
  // key's version after the put (etcd counts every put of a key from 1). tickets(): the
  // version now (a read; 0 when absent).
  int64_t takeTicket(const std::string& key) override;
  int64_t tickets(const std::string& key) override;

  const std::string& prefix() const { return prefix_; }
  EtcdClient& client() { return *client_; }

 private:
  using Clock = std::chrono::steady_clock;
  // etcd's default --max-txn-ops: larger multiGet/multiSet/check go in several txns.
  static constexpr size_t kMaxTxnOps = 128;

  std::string full(const std::string& key) const { return prefix_ + key; }
  // Blocks until `key` (full name) exists or the deadline passes; returns its value.
  Bytes waitFor(const std::string& full_key, Clock::time_point deadline,
                std::chrono::milliseconds timeout);
  // Read-modify-write by compare-and-swap on mod_revision: `update` maps the current value
  // (nullopt: absent) to the new one. Returns the value stored.
  std::string update(const std::string& key, const char* op,
                     const std::function<std::string(const std::optional<std::string>&)>& change);
  // The values of `keys` (nullopt: absent), read kMaxTxnOps keys per txn.
  std::vector<std::optional<std::string>> readAll(const std::vector<std::string>& keys,
                                                  const char* op);
  [[noreturn]] void fail(const char* op, const std::string& key, const Status& status) const;

  std::shared_ptr<EtcdClient> client_;
  std::string prefix_;
};

}  // namespace cpprun::rendezvous
