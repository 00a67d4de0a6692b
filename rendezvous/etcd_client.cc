// EtcdClient's connect, KV and lease calls: each builds its request body (etcd_codec), sends it
// through the failover of etcd_failover, and reads the reply. The watch is in etcd_watch.cc.
#include "rendezvous/etcd_client.h"

#include "rendezvous/etcd_codec.h"
#include "rendezvous/etcd_failover.h"

namespace cpprun::rendezvous {

using etcd::codeOfGrpc;
using etcd::deleteRequest;
using etcd::headerRevision;
using etcd::int64Field;
using etcd::Json;
using etcd::kvsFrom;
using etcd::parseErrorBody;
using etcd::putRequest;
using etcd::rangeRequest;
using etcd::txnRequest;
using etcd::txnResultFrom;

Result<std::unique_ptr<EtcdClient>> EtcdClient::connect(EtcdClientOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  Status s = impl->init();
  if (!s.isOk()) return s;
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(impl)));
}

EtcdClient::EtcdClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EtcdClient::~EtcdClient() = default;

std::string EtcdClient::currentEndpoint() const { return impl_->currentEndpoint(); }
const EtcdClientOptions& EtcdClient::options() const { return impl_->options(); }
uint64_t EtcdClient::requestsMade() const { return impl_->requestsMade(); }

Result<std::optional<EtcdKeyValue>> EtcdClient::get(const std::string& key, int64_t* revision) {
  auto r = impl_->call("/v3/kv/range", rangeRequest(key, false), true);
  if (!r.isOk()) return r.status();
  if (revision != nullptr) *revision = headerRevision(r.value());
  auto kvs = kvsFrom(r.value());
  if (kvs.empty()) return std::optional<EtcdKeyValue>();
  return std::optional<EtcdKeyValue>(std::move(kvs.front()));
}

Result<std::vector<EtcdKeyValue>> EtcdClient::getPrefix(const std::string& prefix,
                                                        int64_t* revision, bool keys_only) {
  auto r = impl_->call("/v3/kv/range", rangeRequest(prefix, true, false, keys_only), true);
  if (!r.isOk()) return r.status();
  if (revision != nullptr) *revision = headerRevision(r.value());
  return kvsFrom(r.value());
}

Result<int64_t> EtcdClient::countPrefix(const std::string& prefix) {
  auto r = impl_->call("/v3/kv/range", rangeRequest(prefix, true, true), true);
  if (!r.isOk()) return r.status();
  return int64Field(r.value(), "count");
}

Result<int64_t> EtcdClient::put(const std::string& key, const std::string& value, int64_t lease) {
  auto r = impl_->call("/v3/kv/put", putRequest(key, value, lease), true);
  if (!r.isOk()) return r.status();
  return headerRevision(r.value());
}

Result<int64_t> EtcdClient::deleteKey(const std::string& key) {
  auto r = impl_->call("/v3/kv/deleterange", deleteRequest(key, false), true);
  if (!r.isOk()) return r.status();
  return int64Field(r.value(), "deleted");
}

Result<EtcdTxnResult> EtcdClient::txn(const EtcdTxn& txn) {
  auto r = impl_->call("/v3/kv/txn", txnRequest(txn), false);
  if (!r.isOk()) return r.status();
  return txnResultFrom(r.value(), txn);
}

Result<int64_t> EtcdClient::grantLease(std::chrono::seconds ttl, std::chrono::seconds* granted) {
  if (ttl.count() <= 0) {
    return invalidArgument("etcd lease TTL must be positive, got " + std::to_string(ttl.count()));
  }
  auto r = impl_->call("/v3/lease/grant", Json{{"TTL", std::to_string(ttl.count())}}, true);
  if (!r.isOk()) return r.status();
  if (r.value().contains("error") && r.value()["error"].is_string() &&
      !r.value()["error"].get<std::string>().empty()) {
    return internalError("etcd lease grant: " + r.value()["error"].get<std::string>());
  }
  int64_t id = int64Field(r.value(), "ID");
  if (id == 0) return Status(StatusCode::kProtocolError, "etcd lease grant: no lease ID in reply");
  if (granted != nullptr) *granted = std::chrono::seconds(int64Field(r.value(), "TTL"));
  return id;
}

Result<std::chrono::seconds> EtcdClient::keepAlive(int64_t lease) {
  auto r = impl_->call("/v3/lease/keepalive", Json{{"ID", std::to_string(lease)}}, true);
  if (!r.isOk()) return r.status();
  const Json& j = r.value();
  if (j.contains("error")) {
    int code = 0;
    std::string message;
    parseErrorBody(j.dump(), &code, &message);
    return Status(codeOfGrpc(code),
                  "etcd lease keepalive " + std::to_string(lease) + ": " + message);
  }
  const Json& res = j.contains("result") ? j["result"] : j;
  int64_t ttl = int64Field(res, "TTL");
  if (ttl <= 0) {
    return Status(StatusCode::kNotFound,
                  "etcd lease " + std::to_string(lease) + " has expired or was revoked");
  }
  return std::chrono::seconds(ttl);
}

Status EtcdClient::revokeLease(int64_t lease) {
  auto r = impl_->call("/v3/lease/revoke", Json{{"ID", std::to_string(lease)}}, true);
  return r.isOk() ? Status::ok() : r.status();
}

}  // namespace cpprun::rendezvous
