// The etcd v3 JSON gateway's encoding, as pure functions: base64 of bytes fields, int64 fields
// as strings, the request bodies of /v3/kv/* and /v3/watch, and the reading of their replies
// and error bodies. No I/O; EtcdClient (etcd_client.cc, etcd_watch.cc) sends what these build.
// Internal to cpprun_etcd (and its tests): the header exposes nlohmann::json.
// Thread safety: functions are reentrant.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "rendezvous/etcd_client.h"

namespace cpprun::rendezvous::etcd {

using Json = nlohmann::json;

// ---- base64 (the gateway's encoding of bytes fields) ----

std::string base64Encode(const std::string& in);
// Accepts the standard and the URL-safe alphabet, with or without padding; nullopt on any
// other character.
std::optional<std::string> base64Decode(const std::string& in);

// The range end that selects every key starting with `prefix` (etcd's "prefix + 1"); "\0"
// (every key) when the prefix is empty or all 0xff.
std::string prefixEnd(const std::string& prefix);

// ---- fields of the gateway's replies (int64 as strings, bytes as base64, defaults omitted) ----

int64_t int64Field(const Json& j, const char* name);  // 0 when absent or not a number
bool boolField(const Json& j, const char* name);      // false when absent
std::string bytesField(const Json& j, const char* name);
EtcdKeyValue keyValueFrom(const Json& j);
std::vector<EtcdKeyValue> kvsFrom(const Json& j);  // the "kvs" array
int64_t headerRevision(const Json& j);

// ---- request bodies ----

Json rangeRequest(const std::string& key, bool prefix, bool count_only = false,
                  bool keys_only = false);
Json putRequest(const std::string& key, const std::string& value, int64_t lease);
Json deleteRequest(const std::string& key, bool prefix);
Json opRequest(const EtcdOp& op);
Json compareRequest(const EtcdCompare& c);
Json txnRequest(const EtcdTxn& txn);
// The reply of /v3/kv/txn, read against the txn that was sent (one result per op of the branch
// that ran).
EtcdTxnResult txnResultFrom(const Json& j, const EtcdTxn& txn);

// ---- errors ----

// Whether etcd's answer means "try another member": the member has no leader, lost it, is
// stopping, or timed out waiting for raft.
bool retriableEtcdError(unsigned http_status, int grpc_code, const std::string& message);
StatusCode codeOfGrpc(int grpc_code);
// The gateway's error body: {"error": "...", "message": "...", "code": N}. *code is 2 (UNKNOWN)
// and *message the body's first 300 bytes when the body is not one.
void parseErrorBody(const std::string& body, int* code, std::string* message);
// Each name once, in first-seen order, joined by ", ".
std::string joinNames(const std::vector<std::string>& names);

// ---- watch ----

// The body of POST /v3/watch: a create_request for `key` (or every key under it), from
// `from_revision` (0: now), without puts when `deletes_only` (etcd's NOPUT filter).
std::string watchCreateRequest(const std::string& key, bool prefix, int64_t from_revision,
                               bool deletes_only);

// One newline-delimited message of a watch stream.
struct WatchMessage {
  enum class Kind {
    kEmpty,     // an empty line: nothing
    kNotJson,   // not a JSON object
    kError,     // an error body: error_code, error_message
    kCanceled,  // etcd canceled the watch: compact_revision (> 0: compacted), cancel_reason
    kUpdate,    // created (the watch is confirmed) and/or events (may be empty)
  };
  Kind kind = Kind::kEmpty;
  int error_code = 0;
  std::string error_message;
  int64_t compact_revision = 0;
  std::string cancel_reason;
  bool created = false;
  std::vector<EtcdEvent> events;
};
WatchMessage parseWatchMessage(const std::string& line);

}  // namespace cpprun::rendezvous::etcd
