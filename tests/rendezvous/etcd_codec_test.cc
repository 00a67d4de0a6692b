// The etcd gateway's encoding without etcd: base64 both ways, prefix range ends, the fields of
// replies (int64 as strings), request bodies, error bodies and which errors fail over, and the
// messages of a watch stream.
#include "rendezvous/etcd_codec.h"

#include <catch2/catch.hpp>
#include <string>

namespace {

using namespace cpprun::rendezvous;
using namespace cpprun::rendezvous::etcd;
using cpprun::StatusCode;

TEST_CASE("etcd base64 round-trips every byte and reads the URL-safe alphabet", "[etcd][unit]") {
  CHECK(base64Encode("") == "");
  CHECK(base64Encode("f") == "Zg==");
  CHECK(base64Encode("fo") == "Zm8=");
  CHECK(base64Encode("foo") == "Zm9v");
  CHECK(base64Encode("foob") == "Zm9vYg==");
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  for (size_t n = 0; n <= all.size(); n += 37) {
    const std::string in = all.substr(0, n);
    CHECK(base64Decode(base64Encode(in)) == in);
  }
  CHECK(base64Decode("Zm9vYg") == std::string("foob"));  // without padding
  CHECK(base64Decode("-_8=") == base64Decode("+/8="));   // URL-safe
  CHECK_FALSE(base64Decode("Zm9v!").has_value());
}

TEST_CASE("etcd prefix range ends", "[etcd][unit]") {
  CHECK(prefixEnd("/a/") == "/a0");
  CHECK(prefixEnd(std::string("a\xff", 2)) == "b");
  CHECK(prefixEnd(std::string("\xff\xff", 2)) == std::string(1, '\0'));
  CHECK(prefixEnd("") == std::string(1, '\0'));
}

TEST_CASE("etcd reply fields: int64 as strings, bytes as base64, defaults omitted",
          "[etcd][unit]") {
  const Json j = Json::parse(R"({"header": {"revision": "42"}, "count": 7, "bad": "4x",
    "kvs": [{"key": "L2s=", "value": "dg==", "create_revision": "3", "mod_revision": "5",
             "version": "2", "lease": "99"}], "more": true})");
  CHECK(headerRevision(j) == 42);
  CHECK(int64Field(j, "count") == 7);
  CHECK(int64Field(j, "bad") == 0);
  CHECK(int64Field(j, "absent") == 0);
  CHECK(boolField(j, "more"));
  CHECK_FALSE(boolField(j, "absent"));
  auto kvs = kvsFrom(j);
  REQUIRE(kvs.size() == 1);
  CHECK(kvs[0].key == "/k");
  CHECK(kvs[0].value == "v");
  CHECK(kvs[0].create_revision == 3);
  CHECK(kvs[0].mod_revision == 5);
  CHECK(kvs[0].version == 2);
  CHECK(kvs[0].lease == 99);
  CHECK(kvsFrom(Json::object()).empty());
}

TEST_CASE("etcd request bodies", "[etcd][unit]") {
  CHECK(rangeRequest("/a/", true, true, true).dump() ==
        R"({"count_only":true,"key":"L2Ev","keys_only":true,"range_end":"L2Ew"})");
  CHECK(putRequest("k", "v", 0).dump() == R"({"key":"aw==","value":"dg=="})");
  CHECK(putRequest("k", "v", 7).dump() == R"({"key":"aw==","lease":"7","value":"dg=="})");
  EtcdTxn txn;
  txn.compare = {EtcdCompare::versionIs("k", 0), EtcdCompare::valueIs("k", "v")};
  txn.success = {EtcdOp::put("k", "v")};
  txn.failure = {EtcdOp::range("k"), EtcdOp::remove("p/", true)};
  CHECK(txnRequest(txn).dump() ==
        R"({"compare":[{"key":"aw==","result":"EQUAL","target":"VERSION","version":"0"},)"
        R"({"key":"aw==","result":"EQUAL","target":"VALUE","value":"dg=="}],)"
        R"("failure":[{"request_range":{"key":"aw=="}},)"
        R"({"request_delete_range":{"key":"cC8=","range_end":"cDA="}}],)"
        R"("success":[{"request_put":{"key":"aw==","value":"dg=="}}]})");
  const Json reply = Json::parse(R"({"header": {"revision": "9"}, "responses": [
    {"response_range": {"kvs": [{"key": "aw==", "value": "dw=="}]}},
    {"response_delete_range": {"deleted": "2"}}]})");
  EtcdTxnResult r = txnResultFrom(reply, txn);
  CHECK_FALSE(r.succeeded);
  CHECK(r.revision == 9);
  REQUIRE(r.responses.size() == 2);
  CHECK(r.responses[0].kind == EtcdOp::Kind::kRange);
  REQUIRE(r.responses[0].kvs.size() == 1);
  CHECK(r.responses[0].kvs[0].value == "w");
  CHECK(r.responses[1].deleted == 2);
  CHECK(watchCreateRequest("k", false, 5, true) ==
        R"({"create_request":{"filters":["NOPUT"],"key":"aw==","start_revision":"5"}})");
}

TEST_CASE("etcd error bodies and which of them fail over", "[etcd][unit]") {
  int code = 0;
  std::string message;
  parseErrorBody(R"({"error": "etcdserver: no leader", "code": 14})", &code, &message);
  CHECK(code == 14);
  CHECK(message == "etcdserver: no leader");
  parseErrorBody(R"({"error": {"code": 5, "message": "lease not found"}})", &code, &message);
  CHECK(code == 5);
  CHECK(message == "lease not found");
  parseErrorBody("not json", &code, &message);
  CHECK(code == 2);
  CHECK(message == "not json");
  CHECK(retriableEtcdError(200, 14, ""));
  CHECK(retriableEtcdError(503, 2, ""));
  CHECK(retriableEtcdError(500, 2, "etcdserver: leader changed"));
  CHECK_FALSE(retriableEtcdError(400, 3, "etcdserver: key is not provided"));
  CHECK(codeOfGrpc(5) == StatusCode::kNotFound);
  CHECK(codeOfGrpc(99) == StatusCode::kInternal);
  CHECK(joinNames({"a", "b", "a", "c"}) == "a, b, c");
}

TEST_CASE("etcd watch stream messages", "[etcd][unit]") {
  CHECK(parseWatchMessage("").kind == WatchMessage::Kind::kEmpty);
  CHECK(parseWatchMessage("{oops").kind == WatchMessage::Kind::kNotJson);
  WatchMessage e = parseWatchMessage(R"({"error": {"code": 14, "message": "no leader"}})");
  CHECK(e.kind == WatchMessage::Kind::kError);
  CHECK(e.error_code == 14);
  CHECK(e.error_message == "no leader");
  WatchMessage compacted =
      parseWatchMessage(R"({"result": {"canceled": true, "compact_revision": "17"}})");
  CHECK(compacted.kind == WatchMessage::Kind::kCanceled);
  CHECK(compacted.compact_revision == 17);
  WatchMessage canceled = parseWatchMessage(R"({"result": {"canceled": true}})");
  CHECK(canceled.compact_revision == 0);
  CHECK(canceled.cancel_reason == "no reason given");
  WatchMessage created = parseWatchMessage(R"({"result": {"created": true}})");
  CHECK(created.kind == WatchMessage::Kind::kUpdate);
  CHECK(created.created);
  CHECK(created.events.empty());
  WatchMessage events = parseWatchMessage(
      R"({"result": {"events": [{"kv": {"key": "aw==", "value": "dg==", "mod_revision": "4"}},)"
      R"( {"type": "DELETE", "kv": {"key": "aw=="}}]}})");
  CHECK(events.kind == WatchMessage::Kind::kUpdate);
  CHECK_FALSE(events.created);
  REQUIRE(events.events.size() == 2);
  CHECK(events.events[0].type == EtcdEvent::Type::kPut);
  CHECK(events.events[0].kv.value == "v");
  CHECK(events.events[0].kv.mod_revision == 4);
  CHECK(events.events[1].type == EtcdEvent::Type::kDelete);
  CHECK(events.events[1].kv.key == "k");
}

}  // namespace
