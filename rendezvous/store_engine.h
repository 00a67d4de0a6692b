// StoreEngine: the key-value state and the semantics of every TCPStore request, without I/O.
//
// The TCP server decodes requests and hands them here together with the id of the connection
// they came from; the engine answers through the Outbox, which may address any connection
// (a SET wakes other connections' WAITs, a legacy WATCH_KEY gets change notifications).
// Keeping this free of sockets lets the semantics be tested byte for byte without a network.
//
// Semantics follow torch (see docs/protocol.md): ADD stores decimal text; COMPARE_SET's
// "missing key, non-empty expected" returns expected; a legacy client's GET of a missing key
// or ADD on a non-numeric value closes its connection, a V2 client's GET of a missing key gets
// an empty value (as torch's libuv server does). WAIT registers on the keys missing now and is
// answered when the last of them is written; a closed connection or CANCEL_WAIT forgets it.
// One deliberate improvement over the legacy server: a COMPARE_SET that leaves the key present
// wakes its waiters, as the libuv server does, so no waiter sleeps on a key that exists.
//
// Layout: handle() is a short dispatcher to one method per operation (onSet, onGet, ...). The
// key map and the rules of ADD, COMPARE_SET and APPEND are KeyValueMap's (store_semantics.h,
// shared with MemoryStore); the methods add what only a server has (waits, watches, queues,
// barriers) and encode the reply in the shape the wire table gives the operation.
//
// Thread safety: none. One event-loop thread owns an engine.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "rendezvous/store_semantics.h"
#include "rendezvous/wire.h"

namespace cpprun::rendezvous {

using ClientId = uint64_t;

// Where the engine's replies go. send() appends bytes to a connection's output in order.
class Outbox {
 public:
  virtual ~Outbox() = default;
  virtual void send(ClientId client, const uint8_t* data, size_t size) = 0;
  // Asked before a reply whose size depends on the request (MULTI_GET, LIST_KEYS) is built:
  // false when `size` more bytes do not fit the client's output budget. The engine then
  // builds and sends nothing; the outbox is expected to close that connection.
  virtual bool roomFor(ClientId client, size_t size) {
    (void)client;
    (void)size;
    return true;
  }
  void send(ClientId client, const wire::Bytes& bytes) { send(client, bytes.data(), bytes.size()); }
};

struct EngineCounters {
  uint64_t requests = 0;
  uint64_t waits_deferred = 0;
  uint64_t waits_woken = 0;
};

class StoreEngine {
 public:
  explicit StoreEngine(Outbox* outbox) : outbox_(outbox) {}
  StoreEngine(const StoreEngine&) = delete;
  StoreEngine& operator=(const StoreEngine&) = delete;

  // Applies one request from `client`. Returns false when the connection must be closed (the
  // request is one torch's server answers by dropping the client); *error then says why.
  bool handle(ClientId client, wire::Dialect dialect, const wire::Request& request,
              std::string* error);

  // Forgets everything the connection registered (waits, watches, barrier waits, its
  // authentication).
  void disconnect(ClientId client);

  // From now on, writes of keys under kProtectedPrefix take a connection that proved it holds
  // `secret` (CPPRUN_AUTH, store_auth.h); sets kAuthRequiredKey. REQUIRES: before any client.
  void requireAuthentication(std::string secret);
  bool requiresAuthentication() const { return !secret_.empty(); }
  // Connections closed for a protected write without authentication or for a wrong proof.
  uint64_t refusedUnauthenticated() const { return refused_unauthenticated_; }

  // Local operations for the process that owns the engine (the agent): a SET that wakes
  // waiters like a client's, and removal of every key outside `keep_prefix` (and every queue),
  // so one attempt's workers never see the keys of the attempt before. Returns keys removed.
  void localSet(const std::string& key, wire::Bytes value);
  size_t eraseKeysExcept(const std::string& keep_prefix);
  // Removes every key under `prefix` (a past attempt's job keys); waits on them wait on.
  size_t eraseKeysWithPrefix(const std::string& prefix) { return data_.erasePrefix(prefix); }

  size_t numKeys() const { return data_.size(); }
  // The value of `key`, or nullptr (valid until the next request).
  const wire::Bytes* find(const std::string& key) const { return data_.find(key); }
  size_t pendingWaits() const { return waits_.size(); }
  const EngineCounters& counters() const { return counters_; }

 private:
  struct PendingWait {
    ClientId client;
    size_t missing;                 // keys still absent; the reply goes out at 0
    std::vector<std::string> keys;  // the keys it was registered on, for cancelling
  };
  using WaitId = uint64_t;
  // One request being handled.
  struct Call {
    ClientId client;
    wire::Dialect dialect;
    const wire::Request& r;
    std::string* error;  // set when the method returns false (close the connection)
  };

  // One method per operation (wire.h's table); each returns false to close the connection.
  bool onValidate(const Call& c);
  bool onPing(const Call& c);
  bool onSet(const Call& c);
  bool onMultiSet(const Call& c);
  bool onAppend(const Call& c);
  bool onCompareSet(const Call& c);
  bool onGet(const Call& c);
  bool onMultiGet(const Call& c);
  bool onAdd(const Call& c);
  bool onCheck(const Call& c);
  bool onWait(const Call& c);
  bool onCancelWait(const Call& c);
  bool onGetNumKeys(const Call& c);
  bool onDeleteKey(const Call& c);
  bool onWatchKey(const Call& c);
  bool onQueuePush(const Call& c);
  bool onQueuePop(const Call& c);
  bool onQueueLen(const Call& c);
  bool onListKeys(const Call& c);
  bool onBarrier(const Call& c);
  bool onCpprunAuth(const Call& c);

  bool exists(const std::string& key) const;
  // set + notify watchers + wake; the const& one copies into the old value's storage.
  template <typename V>
  void store(const std::string& key, V&& value);
  // Around every write of a key: watchers (legacy WATCH_KEY) see the old and the new value,
  // then waiters wake. The old value is copied only when the key is watched.
  struct Prior {
    bool watched = false;
    bool existed = false;
    wire::Bytes value;
  };
  Prior beforeWrite(const std::string& key) const;
  void afterWrite(const std::string& key, const Prior& prior);
  void wake(const std::string& key, bool one_only = false);
  void notifyWatchers(const std::string& key, uint8_t event, const wire::Bytes& old_value,
                      const wire::Bytes& new_value);
  void registerWait(ClientId client, const std::vector<std::string>& keys);
  void cancelWaits(ClientId client);

  // Replies, encoded by wire::encodeReply in the shape the wire table gives the operation
  // (the same column drives the client's parseReply). answer: the reply to the request being
  // handled; answerSized: the same, unless it does not fit the client's output budget
  // (Outbox::roomFor); answerLater: a deferred reply to an earlier request of `type` (WAIT,
  // BARRIER) of another or the same client.
  void answer(const Call& c, const wire::ReplyFields& fields) {
    answerLater(c.client, c.r.type, fields);
  }
  void answerSized(const Call& c, const wire::ReplyFields& fields);
  void answerLater(ClientId client, wire::QueryType type, const wire::ReplyFields& fields);

  Outbox* outbox_;
  KeyValueMap data_;
  std::unordered_map<std::string, std::deque<wire::Bytes>> queues_;
  // Waits: each key lists the waits that need it; each client lists its waits for cleanup.
  std::unordered_map<WaitId, PendingWait> waits_;
  std::unordered_map<std::string, std::vector<WaitId>> waiters_by_key_;
  std::unordered_map<ClientId, std::vector<WaitId>> waits_by_client_;
  WaitId next_wait_id_ = 1;
  // Legacy WATCH_KEY registrations.
  std::unordered_map<std::string, std::vector<ClientId>> watchers_by_key_;
  std::unordered_map<ClientId, std::vector<std::string>> watches_by_client_;
  // BARRIER waiters per barrier key.
  std::unordered_map<std::string, std::vector<ClientId>> barrier_waiters_;
  // Authentication (store_auth.h): the secret (empty: none), each connection's nonces after its
  // hello, and the connections that proved the secret.
  std::string secret_;
  std::unordered_map<ClientId, std::pair<std::string, std::string>> auth_nonces_;
  std::unordered_set<ClientId> authenticated_;
  uint64_t refused_unauthenticated_ = 0;
  EngineCounters counters_;
  wire::Bytes scratch_;                // a reply being encoded
  std::vector<wire::ByteView> items_;  // MULTI_GET's values, LIST_KEYS' keys
};

}  // namespace cpprun::rendezvous
