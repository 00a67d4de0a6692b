// EtcdClient: a blocking client of etcd v3 through its HTTP/JSON gateway (/v3/kv/range,
// /v3/kv/put, /v3/kv/txn, /v3/lease/*, /v3/watch), plain or TLS with client certificates.
//
// Keys and values are bytes (std::string holds them; the gateway's base64 is handled here).
// Every call is bounded: one attempt on one endpoint by request_timeout, and the whole call,
// with failover, by request_timeout x number of endpoints. A connection error, a timeout, or
// etcd saying "leader changed" / "no leader" / unavailable moves the client to the next
// endpoint; an error that survives names the endpoints tried and the last error. A txn whose
// request was written but whose reply never came is not retried (its outcome is unknown): it
// fails with kUnavailable and says so.
// Errors are values (Status / Result); nothing here throws. EtcdStore turns them into
// StoreError / StoreTimeout.
// Thread safety: every method may be called from several threads; requests are serialised on
// one keep-alive connection (a mutex), while each watch() opens its own connection and so runs
// in parallel with other calls.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace cpprun::rendezvous {

struct EtcdTls {
  std::string ca_file;    // PEM CA bundle that signed the servers' certificates
  std::string cert_file;  // PEM client certificate (may be empty: no client certificate)
  std::string key_file;   // PEM private key of cert_file
};

struct EtcdClientOptions {
  std::vector<std::string> endpoints;  // "host:port", see parseEtcdEndpoints()
  bool tls = false;
  EtcdTls tls_files;
  // Bound of opening one connection (TCP + TLS handshake) to one endpoint.
  std::chrono::milliseconds connect_timeout{2000};
  // Bound of one request on one endpoint; a call may try every endpoint once more in turn.
  std::chrono::milliseconds request_timeout{5000};
};

// Parses "host:port[,host:port...]"; entries may carry "http://" or "https://" (dropped; TLS is
// EtcdClientOptions::tls) and a trailing "/". IPv6 hosts go in brackets: "[::1]:2379".
// The error names the bad entry: empty, no port, port out of range.
Result<std::vector<std::string>> parseEtcdEndpoints(const std::string& text);

struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;  // 1 on creation, +1 per put
  int64_t lease = 0;    // 0: no lease
};

// One comparison of a transaction: `target` of `key` <op> `number` (or `value` for kValue).
struct EtcdCompare {
  enum class Target { kVersion, kCreateRevision, kModRevision, kValue, kLease };
  enum class Op { kEqual, kGreater, kLess, kNotEqual };
  std::string key;
  Target target = Target::kVersion;
  Op op = Op::kEqual;
  int64_t number = 0;  // for every target but kValue
  std::string value;   // for kValue

  static EtcdCompare versionIs(std::string key, int64_t version);
  static EtcdCompare modRevisionIs(std::string key, int64_t revision);
  static EtcdCompare valueIs(std::string key, std::string value);
};

// One operation of a transaction.
struct EtcdOp {
  enum class Kind { kPut, kDelete, kRange };
  Kind kind = Kind::kRange;
  std::string key;
  std::string value;    // kPut
  int64_t lease = 0;    // kPut
  bool prefix = false;  // kDelete, kRange: every key starting with `key`

  static EtcdOp put(std::string key, std::string value, int64_t lease = 0);
  static EtcdOp remove(std::string key, bool prefix = false);
  static EtcdOp range(std::string key, bool prefix = false);
};

struct EtcdTxn {
  std::vector<EtcdCompare> compare;  // all must hold for `success` to run
  std::vector<EtcdOp> success;
  std::vector<EtcdOp> failure;
};

struct EtcdOpResult {
  EtcdOp::Kind kind = EtcdOp::Kind::kRange;
  std::vector<EtcdKeyValue> kvs;  // kRange
  int64_t deleted = 0;            // kDelete
};

struct EtcdTxnResult {
  bool succeeded = false;
  int64_t revision = 0;                 // the store's revision after the txn
  std::vector<EtcdOpResult> responses;  // one per op of the branch that ran, in order
};

struct EtcdEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  EtcdKeyValue kv;  // for kDelete: key and mod_revision only
};

class EtcdClient {
 public:
  // Validates the options, loads the TLS files, and opens a connection to the first endpoint
  // that answers (GET /version). The error names each endpoint tried and why it failed:
  // kInvalidArgument for bad options or files, and when every endpoint refused the TLS
  // handshake (an untrusted client certificate, a server the CA did not sign: retrying cannot
  // mend it); kUnavailable when no endpoint answered (yet).
  static Result<std::unique_ptr<EtcdClient>> connect(EtcdClientOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // The key's entry, or nullopt when absent. *revision (optional) gets the store's revision at
  // the read: a watch from revision + 1 sees every later change.
  Result<std::optional<EtcdKeyValue>> get(const std::string& key, int64_t* revision = nullptr);
  // Every entry whose key starts with `prefix`, in key order. `keys_only`: etcd leaves the
  // values out (each entry's value is empty), so reading many keys to learn which exist costs
  // their names only.
  Result<std::vector<EtcdKeyValue>> getPrefix(const std::string& prefix,
                                              int64_t* revision = nullptr, bool keys_only = false);
  // How many keys start with `prefix` (without reading their values).
  Result<int64_t> countPrefix(const std::string& prefix);
  // Returns the store's revision after the put. lease 0: no lease.
  Result<int64_t> put(const std::string& key, const std::string& value, int64_t lease = 0);
  // Returns how many keys were deleted (0 or 1).
  Result<int64_t> deleteKey(const std::string& key);
  Result<EtcdTxnResult> txn(const EtcdTxn& txn);

  // Returns the new lease's id; *granted (optional) gets the TTL etcd granted (it raises one
  // below its minimum, 1.5 x its election timeout).
  Result<int64_t> grantLease(std::chrono::seconds ttl, std::chrono::seconds* granted = nullptr);
  // Renews the lease once; returns its TTL. kNotFound when it expired or was revoked.
  Result<std::chrono::seconds> keepAlive(int64_t lease);
  Status revokeLease(int64_t lease);

  // Blocks until an event on `key` (or every key under it when `prefix`) at or after
  // `from_revision` (0: from now), or until `timeout`; returns the events of the first reply
  // that carries any (empty on timeout). A real watch: one streamed POST /v3/watch on its own
  // connection, closed on return. kNotFound when from_revision was compacted away.
  // `on_created` (optional) runs once, on the calling thread, when etcd has confirmed the watch:
  // any change made after it starts is seen even with from_revision 0. `deletes_only`: etcd
  // leaves the puts out (its NOPUT filter), so a watch of many keys' deaths is not woken by
  // their writes.
  Result<std::vector<EtcdEvent>> watch(const std::string& key, bool prefix, int64_t from_revision,
                                       std::chrono::milliseconds timeout,
                                       const std::function<void()>& on_created = {},
                                       bool deletes_only = false);

  // How many requests this client has made: each call (get, put, txn, lease, ...) counts once
  // however many endpoints it tried, and each watch() once. For tests and benchmarks that count
  // round trips.
  uint64_t requestsMade() const;

  // The endpoint the next request goes to ("host:port").
  std::string currentEndpoint() const;
  const EtcdClientOptions& options() const;

  class Impl;

 private:
  explicit EtcdClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cpprun::rendezvous
