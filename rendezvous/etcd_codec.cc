#include "rendezvous/etcd_codec.h"

#include <algorithm>
#include <charconv>

namespace cpprun::rendezvous {

// The request model's constructors (etcd_client.h).

EtcdCompare EtcdCompare::versionIs(std::string key, int64_t version) {
  EtcdCompare c;
  c.key = std::move(key);
  c.target = Target::kVersion;
  c.number = version;
  return c;
}

EtcdCompare EtcdCompare::modRevisionIs(std::string key, int64_t revision) {
  EtcdCompare c;
  c.key = std::move(key);
  c.target = Target::kModRevision;
  c.number = revision;
  return c;
}

EtcdCompare EtcdCompare::valueIs(std::string key, std::string value) {
  EtcdCompare c;
  c.key = std::move(key);
  c.target = Target::kValue;
  c.value = std::move(value);
  return c;
}

EtcdOp EtcdOp::put(std::string key, std::string value, int64_t lease) {
  EtcdOp op;
  op.kind = Kind::kPut;
  op.key = std::move(key);
  op.value = std::move(value);
  op.lease = lease;
  return op;
}

EtcdOp EtcdOp::remove(std::string key, bool prefix) {
  EtcdOp op;
  op.kind = Kind::kDelete;
  op.key = std::move(key);
  op.prefix = prefix;
  return op;
}

EtcdOp EtcdOp::range(std::string key, bool prefix) {
  EtcdOp op;
  op.kind = Kind::kRange;
  op.key = std::move(key);
  op.prefix = prefix;
  return op;
}

namespace etcd {

// ---- base64 ----

namespace {
constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
}  // namespace

std::string base64Encode(const std::string& in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += kB64[v & 63];
  }
  if (i + 1 == in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

std::optional<std::string> base64Decode(const std::string& in) {
  std::string out;
  out.reserve(in.size() / 4 * 3);
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    int v;
    if (c >= 'A' && c <= 'Z') {
      v = c - 'A';
    } else if (c >= 'a' && c <= 'z') {
      v = c - 'a' + 26;
    } else if (c >= '0' && c <= '9') {
      v = c - '0' + 52;
    } else if (c == '+' || c == '-') {
      v = 62;
    } else if (c == '/' || c == '_') {
      v = 63;
    } else if (c == '=') {
      break;
    } else {
      return std::nullopt;
    }
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  return out;
}

std::string prefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    auto last = static_cast<uint8_t>(end.back());
    if (last < 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

// ---- reply fields ----

int64_t int64Field(const Json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    int64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc() && p == s.data() + s.size()) return v;
  }
  return 0;
}

bool boolField(const Json& j, const char* name) {
  auto it = j.find(name);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

std::string bytesField(const Json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || !it->is_string()) return {};
  return base64Decode(it->get<std::string>()).value_or(std::string());
}

EtcdKeyValue keyValueFrom(const Json& j) {
  EtcdKeyValue kv;
  kv.key = bytesField(j, "key");
  kv.value = bytesField(j, "value");
  kv.create_revision = int64Field(j, "create_revision");
  kv.mod_revision = int64Field(j, "mod_revision");
  kv.version = int64Field(j, "version");
  kv.lease = int64Field(j, "lease");
  return kv;
}

std::vector<EtcdKeyValue> kvsFrom(const Json& j) {
  std::vector<EtcdKeyValue> out;
  auto it = j.find("kvs");
  if (it != j.end() && it->is_array()) {
    for (const auto& kv : *it) out.push_back(keyValueFrom(kv));
  }
  return out;
}

int64_t headerRevision(const Json& j) {
  auto it = j.find("header");
  return it == j.end() ? 0 : int64Field(*it, "revision");
}

// ---- request bodies ----

Json rangeRequest(const std::string& key, bool prefix, bool count_only, bool keys_only) {
  Json r = {{"key", base64Encode(key)}};
  if (prefix) r["range_end"] = base64Encode(prefixEnd(key));
  if (count_only) r["count_only"] = true;
  if (keys_only) r["keys_only"] = true;
  return r;
}

Json putRequest(const std::string& key, const std::string& value, int64_t lease) {
  Json r = {{"key", base64Encode(key)}, {"value", base64Encode(value)}};
  if (lease != 0) r["lease"] = std::to_string(lease);
  return r;
}

Json deleteRequest(const std::string& key, bool prefix) { return rangeRequest(key, prefix); }

Json opRequest(const EtcdOp& op) {
  switch (op.kind) {
    case EtcdOp::Kind::kPut:
      return {{"request_put", putRequest(op.key, op.value, op.lease)}};
    case EtcdOp::Kind::kDelete:
      return {{"request_delete_range", deleteRequest(op.key, op.prefix)}};
    case EtcdOp::Kind::kRange:
      return {{"request_range", rangeRequest(op.key, op.prefix)}};
  }
  return {};
}

Json compareRequest(const EtcdCompare& c) {
  static const char* kResult[] = {"EQUAL", "GREATER", "LESS", "NOT_EQUAL"};
  Json r = {{"key", base64Encode(c.key)}, {"result", kResult[static_cast<int>(c.op)]}};
  switch (c.target) {
    case EtcdCompare::Target::kVersion:
      r["target"] = "VERSION";
      r["version"] = std::to_string(c.number);
      break;
    case EtcdCompare::Target::kCreateRevision:
      r["target"] = "CREATE";
      r["create_revision"] = std::to_string(c.number);
      break;
    case EtcdCompare::Target::kModRevision:
      r["target"] = "MOD";
      r["mod_revision"] = std::to_string(c.number);
      break;
    case EtcdCompare::Target::kValue:
      r["target"] = "VALUE";
      r["value"] = base64Encode(c.value);
      break;
    case EtcdCompare::Target::kLease:
      r["target"] = "LEASE";
      r["lease"] = std::to_string(c.number);
      break;
  }
  return r;
}

Json txnRequest(const EtcdTxn& txn) {
  Json body = {{"compare", Json::array()}, {"success", Json::array()}, {"failure", Json::array()}};
  for (const auto& c : txn.compare) body["compare"].push_back(compareRequest(c));
  for (const auto& op : txn.success) body["success"].push_back(opRequest(op));
  for (const auto& op : txn.failure) body["failure"].push_back(opRequest(op));
  return body;
}

EtcdTxnResult txnResultFrom(const Json& j, const EtcdTxn& txn) {
  EtcdTxnResult out;
  out.succeeded = boolField(j, "succeeded");
  out.revision = headerRevision(j);
  const auto& ops = out.succeeded ? txn.success : txn.failure;
  auto responses = j.find("responses");
  for (size_t i = 0; i < ops.size(); ++i) {
    EtcdOpResult op;
    op.kind = ops[i].kind;
    if (responses != j.end() && responses->is_array() && i < responses->size()) {
      const Json& resp = (*responses)[i];
      if (resp.contains("response_range")) op.kvs = kvsFrom(resp["response_range"]);
      if (resp.contains("response_delete_range")) {
        op.deleted = int64Field(resp["response_delete_range"], "deleted");
      }
    }
    out.responses.push_back(std::move(op));
  }
  return out;
}

// ---- errors ----

bool retriableEtcdError(unsigned http_status, int grpc_code, const std::string& message) {
  if (grpc_code == 14 /*UNAVAILABLE*/ || grpc_code == 4 /*DEADLINE_EXCEEDED*/) return true;
  if (http_status == 503 || http_status == 502 || http_status == 504) return true;
  for (const char* m : {"leader changed", "no leader", "unavailable", "server stopped",
                        "request timed out", "not capable"}) {
    if (message.find(m) != std::string::npos) return true;
  }
  return false;
}

StatusCode codeOfGrpc(int grpc_code) {
  switch (grpc_code) {
    case 3:   // INVALID_ARGUMENT
    case 11:  // OUT_OF_RANGE
      return StatusCode::kInvalidArgument;
    case 5:  // NOT_FOUND
      return StatusCode::kNotFound;
    case 6:  // ALREADY_EXISTS
      return StatusCode::kAlreadyExists;
    case 8:  // RESOURCE_EXHAUSTED
      return StatusCode::kResourceExhausted;
    case 4:  // DEADLINE_EXCEEDED
      return StatusCode::kTimeout;
    case 14:  // UNAVAILABLE
      return StatusCode::kUnavailable;
    default:
      return StatusCode::kInternal;
  }
}

void parseErrorBody(const std::string& body, int* code, std::string* message) {
  Json j = Json::parse(body, nullptr, false);
  *code = 2;  // UNKNOWN
  *message = body.substr(0, 300);
  if (j.is_discarded() || !j.is_object()) return;
  const Json& e = j.contains("error") && j["error"].is_object() ? j["error"] : j;
  if (e.contains("code") && e["code"].is_number_integer()) *code = e["code"].get<int>();
  if (e.contains("message") && e["message"].is_string()) {
    *message = e["message"].get<std::string>();
  } else if (e.contains("error") && e["error"].is_string()) {
    *message = e["error"].get<std::string>();
  }
}

std::string joinNames(const std::vector<std::string>& names) {
  std::vector<std::string> seen;
  std::string out;
  for (const auto& n : names) {
    if (std::find(seen.begin(), seen.end(), n) != seen.end()) continue;
    seen.push_back(n);
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

// ---- watch ----

std::string watchCreateRequest(const std::string& key, bool prefix, int64_t from_revision,
                               bool deletes_only) {
  Json create = rangeRequest(key, prefix);
  if (from_revision > 0) create["start_revision"] = std::to_string(from_revision);
  if (deletes_only) create["filters"] = Json::array({"NOPUT"});
  return Json{{"create_request", create}}.dump();
}

WatchMessage parseWatchMessage(const std::string& line) {
  WatchMessage m;
  if (line.empty()) return m;
  Json j = Json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    m.kind = WatchMessage::Kind::kNotJson;
    return m;
  }
  if (j.contains("error")) {
    m.kind = WatchMessage::Kind::kError;
    parseErrorBody(line, &m.error_code, &m.error_message);
    return m;
  }
  const Json& r = j.contains("result") ? j["result"] : j;
  if (boolField(r, "canceled")) {
    m.kind = WatchMessage::Kind::kCanceled;
    m.compact_revision = int64Field(r, "compact_revision");
    if (m.compact_revision <= 0) {
      m.cancel_reason = r.value("cancel_reason", std::string("no reason given"));
    }
    return m;
  }
  m.kind = WatchMessage::Kind::kUpdate;
  m.created = boolField(r, "created");
  auto events = r.find("events");
  if (events == r.end() || !events->is_array()) return m;
  for (const auto& e : *events) {
    EtcdEvent ev;
    ev.type = e.value("type", std::string("PUT")) == "DELETE" ? EtcdEvent::Type::kDelete
                                                              : EtcdEvent::Type::kPut;
    if (e.contains("kv")) ev.kv = keyValueFrom(e["kv"]);
    m.events.push_back(std::move(ev));
  }
  return m;
}

}  // namespace etcd
}  // namespace cpprun::rendezvous
