// StoreEngine semantics without sockets: what each request answers, to whom, and when.
#include "rendezvous/store_engine.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <map>

#include "tests/support/test_support.h"

namespace {

using namespace cpprun::rendezvous;
using namespace cpprun::rendezvous::wire;
using cpprun::testing::makeRequest;
using cpprun::testing::toHex;

class RecordingOutbox : public Outbox {
 public:
  void send(ClientId client, const uint8_t* data, size_t size) override {
    auto& q = sent[client];
    q.insert(q.end(), data, data + size);
  }
  // Everything sent to `client` since the last take, as hex.
  std::string take(ClientId client) {
    std::string hex = toHex(sent[client]);
    sent[client].clear();
    return hex;
  }
  // Every client's output budget; roomFor records what was asked.
  bool roomFor(ClientId client, size_t size) override {
    asked[client] = size;
    return size <= budget;
  }
  std::map<ClientId, Bytes> sent;
  size_t budget = SIZE_MAX;
  std::map<ClientId, size_t> asked;
};

Bytes b(const std::string& s) { return cpprun::testing::bytesOf(s); }

struct Fixture {
  RecordingOutbox out;
  StoreEngine engine{&out};

  bool run(ClientId c, Dialect d, QueryType t, std::vector<std::string> keys = {},
           std::vector<Bytes> values = {}, int64_t integer = 0, uint32_t u32 = 0) {
    std::string error;
    return engine.handle(c, d, makeRequest(t, std::move(keys), std::move(values), integer, u32),
                         &error);
  }
  bool legacy(ClientId c, QueryType t, std::vector<std::string> keys = {},
              std::vector<Bytes> values = {}, int64_t integer = 0) {
    return run(c, Dialect::kLegacy, t, std::move(keys), std::move(values), integer);
  }
  bool v2(ClientId c, QueryType t, std::vector<std::string> keys = {},
          std::vector<Bytes> values = {}, int64_t integer = 0, uint32_t u32 = 0) {
    return run(c, Dialect::kV2, t, std::move(keys), std::move(values), integer, u32);
  }
};

}  // namespace

TEST_CASE_METHOD(Fixture, "ADD keeps a decimal text counter", "[unit]") {
  REQUIRE(legacy(1, QueryType::ADD, {"/c"}, {}, 5));
  CHECK(out.take(1) == "0500000000000000");
  REQUIRE(legacy(1, QueryType::ADD, {"/c"}, {}, -2));
  CHECK(out.take(1) == "0300000000000000");
  REQUIRE(legacy(1, QueryType::GET, {"/c"}));
  CHECK(out.take(1) == "010000000000000033");  // b"3"
  REQUIRE(legacy(1, QueryType::SET, {"/t"}, {b("abc")}));
  CHECK_FALSE(legacy(1, QueryType::ADD, {"/t"}, {}, 1));  // non-numeric: drop the client
}

TEST_CASE_METHOD(Fixture, "COMPARE_SET follows c10d including its 'lie'", "[unit]") {
  REQUIRE(legacy(1, QueryType::COMPARE_SET, {"/k"}, {b(""), b("first")}));
  CHECK(out.take(1) == toHex(Bytes{5, 0, 0, 0, 0, 0, 0, 0, 'f', 'i', 'r', 's', 't'}));
  REQUIRE(legacy(1, QueryType::COMPARE_SET, {"/missing"}, {b("x"), b("y")}));
  CHECK(out.take(1) == "010000000000000078");  // returns expected, stores nothing
  CHECK(engine.numKeys() == 1);
  REQUIRE(legacy(1, QueryType::COMPARE_SET, {"/k"}, {b("first"), b("2")}));
  CHECK(out.take(1) == "010000000000000032");
  REQUIRE(legacy(1, QueryType::COMPARE_SET, {"/k"}, {b("nomatch"), b("3")}));
  CHECK(out.take(1) == "010000000000000032");  // current value
}

TEST_CASE_METHOD(Fixture, "GET of a missing key - legacy drops and V2 answers empty", "[unit]") {
  CHECK_FALSE(legacy(1, QueryType::GET, {"/nope"}));
  CHECK(out.take(1).empty());
  CHECK(v2(2, QueryType::GET, {"/nope"}));
  CHECK(out.take(2) == "0000000000000000");
}

TEST_CASE_METHOD(Fixture, "WAIT is answered when the last missing key is written", "[unit]") {
  REQUIRE(legacy(1, QueryType::SET, {"/a"}, {b("1")}));
  REQUIRE(legacy(1, QueryType::WAIT, {"/a"}));
  CHECK(out.take(1) == "00");  // present: at once
  REQUIRE(legacy(1, QueryType::WAIT, {"/a", "/b", "/c"}));
  CHECK(out.take(1).empty());
  CHECK(engine.pendingWaits() == 1);
  REQUIRE(legacy(2, QueryType::SET, {"/b"}, {b("x")}));
  CHECK(out.take(1).empty());
  REQUIRE(legacy(2, QueryType::DELETE_KEY, {"/a"}));  // deleting wakes nobody
  CHECK(out.take(1).empty());
  REQUIRE(legacy(2, QueryType::ADD, {"/c"}, {}, 1));
  CHECK(out.take(1) == "00");
  CHECK(out.take(2) == "01000000000000000100000000000000");  // DELETE_KEY 1, ADD 1
  CHECK(engine.pendingWaits() == 0);
}

TEST_CASE_METHOD(Fixture, "APPEND and MULTI_SET and COMPARE_SET wake waiters", "[unit]") {
  REQUIRE(v2(1, QueryType::WAIT, {"/x", "/y", "/z"}));
  REQUIRE(v2(2, QueryType::APPEND, {"/x"}, {b("a")}));
  REQUIRE(v2(2, QueryType::MULTI_SET, {"/y"}, {b("b")}));
  CHECK(out.take(1).empty());
  REQUIRE(v2(2, QueryType::COMPARE_SET, {"/z"}, {b(""), b("c")}));
  CHECK(out.take(1) == "00");
}

TEST_CASE_METHOD(Fixture, "CANCEL_WAIT forgets the wait and answers 01", "[unit]") {
  REQUIRE(v2(1, QueryType::WAIT, {"/late"}));
  REQUIRE(v2(1, QueryType::CANCEL_WAIT));
  CHECK(out.take(1) == "01");
  REQUIRE(v2(2, QueryType::SET, {"/late"}, {b("v")}));
  CHECK(out.take(1).empty());              // nothing stale after the cancel
  REQUIRE(v2(1, QueryType::CANCEL_WAIT));  // nothing pending: still 01
  CHECK(out.take(1) == "01");
}

TEST_CASE_METHOD(Fixture, "a disconnected client's waits are forgotten", "[unit]") {
  REQUIRE(legacy(1, QueryType::WAIT, {"/k"}));
  REQUIRE(legacy(2, QueryType::WAIT, {"/k"}));
  engine.disconnect(1);
  REQUIRE(legacy(3, QueryType::SET, {"/k"}, {b("v")}));
  CHECK(out.take(1).empty());
  CHECK(out.take(2) == "00");
  CHECK(engine.pendingWaits() == 0);
}

TEST_CASE_METHOD(Fixture, "WATCH_KEY pushes created and updated and deleted events", "[unit]") {
  REQUIRE(legacy(1, QueryType::WATCH_KEY, {"/w"}));
  CHECK(out.take(1) == "03");
  REQUIRE(legacy(2, QueryType::SET, {"/w"}, {b("v1")}));
  CHECK(out.take(1) == "0102000000000000002f77000000000000000002000000000000007631");
  REQUIRE(legacy(2, QueryType::SET, {"/w"}, {b("v2")}));
  CHECK(out.take(1) ==
        "0002000000000000002f7702000000000000007631020000000000000076"
        "32");
  REQUIRE(legacy(2, QueryType::DELETE_KEY, {"/w"}));
  CHECK(out.take(1) == "0202000000000000002f77020000000000000076320000000000000000");
  engine.disconnect(1);
  REQUIRE(legacy(2, QueryType::SET, {"/w"}, {b("v3")}));
  CHECK(out.take(1).empty());
}

TEST_CASE_METHOD(Fixture, "GETNUMKEYS DELETE_KEY CHECK MULTI_GET LIST_KEYS", "[unit]") {
  REQUIRE(v2(1, QueryType::MULTI_SET, {"/a", "/b"}, {b("1"), b("22")}));
  REQUIRE(v2(1, QueryType::GETNUMKEYS));
  CHECK(out.take(1) == "0200000000000000");
  REQUIRE(v2(1, QueryType::CHECK, {"/a", "/b"}));
  REQUIRE(v2(1, QueryType::CHECK, {"/a", "/zz"}));
  CHECK(out.take(1) == "0001");
  REQUIRE(v2(1, QueryType::MULTI_GET, {"/b", "/a"}));
  CHECK(out.take(1) ==
        "020000000000000032320100000000000000"
        "31");
  REQUIRE(v2(1, QueryType::LIST_KEYS));
  std::string listed = out.take(1);
  CHECK(listed.substr(0, 16) == "0200000000000000");
  CHECK(listed.size() == 2 * (8 + 2 * (8 + 2)));
  REQUIRE(v2(1, QueryType::DELETE_KEY, {"/a"}));
  REQUIRE(v2(1, QueryType::DELETE_KEY, {"/a"}));
  CHECK(out.take(1) == "01000000000000000000000000000000");
}

TEST_CASE_METHOD(Fixture, "PING echoes and VALIDATE with a wrong magic drops", "[unit]") {
  REQUIRE(v2(1, QueryType::VALIDATE, {}, {}, 0, kValidationMagic));
  CHECK(out.take(1).empty());
  REQUIRE(v2(1, QueryType::PING, {}, {}, 0, 0xdeadbeef));
  CHECK(out.take(1) == "efbeadde");
  CHECK_FALSE(v2(1, QueryType::VALIDATE, {}, {}, 0, 0x12345678));
}

TEST_CASE_METHOD(Fixture, "queues - push pop length and a push wakes one waiter", "[unit]") {
  REQUIRE(v2(1, QueryType::QUEUE_POP, {"/q"}));
  CHECK(out.take(1) == "0000000000000000");
  REQUIRE(v2(2, QueryType::WAIT, {"/q"}));
  REQUIRE(v2(3, QueryType::WAIT, {"/q"}));
  REQUIRE(v2(1, QueryType::QUEUE_PUSH, {"/q"}, {b("i1")}));
  CHECK(out.take(2) == "00");
  CHECK(out.take(3).empty());
  REQUIRE(v2(1, QueryType::QUEUE_PUSH, {"/q"}, {b("i2")}));
  CHECK(out.take(3) == "00");
  REQUIRE(v2(1, QueryType::QUEUE_LEN, {"/q"}));
  CHECK(out.take(1) == "0200000000000000");
  REQUIRE(v2(1, QueryType::QUEUE_POP, {"/q"}));
  CHECK(out.take(1) ==
        "0200000000000000"
        "02000000000000006931");
  REQUIRE(v2(1, QueryType::CHECK, {"/q"}));  // non-empty queue counts as present
  CHECK(out.take(1) == "00");
  CHECK(engine.numKeys() == 0);  // queues are not keys
}

TEST_CASE_METHOD(Fixture, "BARRIER releases everyone when the count is reached", "[unit]") {
  REQUIRE(v2(1, QueryType::BARRIER, {"/bar"}, {}, 3));
  REQUIRE(v2(2, QueryType::BARRIER, {"/bar"}, {}, 3));
  CHECK(out.take(1).empty());
  CHECK(out.take(2).empty());
  REQUIRE(v2(3, QueryType::BARRIER, {"/bar"}, {}, 3));
  CHECK(out.take(1) == "00");
  CHECK(out.take(2) == "00");
  CHECK(out.take(3) == "00");
}

TEST_CASE_METHOD(Fixture, "WAIT counts a repeated key once, in short and long key lists",
                 "[unit]") {
  REQUIRE(legacy(1, QueryType::WAIT, {"/a", "/a", "/b"}));
  std::vector<std::string> many;
  for (int i = 0; i < 40; ++i) many.push_back("/k" + std::to_string(i % 20));  // 20 distinct
  REQUIRE(legacy(2, QueryType::WAIT, many));
  REQUIRE(legacy(3, QueryType::SET, {"/a"}, {b("1")}));
  REQUIRE(legacy(3, QueryType::SET, {"/b"}, {b("1")}));
  CHECK(out.take(1) == "00");
  for (int i = 0; i < 19; ++i)
    REQUIRE(legacy(3, QueryType::SET, {"/k" + std::to_string(i)}, {b("v")}));
  CHECK(out.take(2).empty());
  REQUIRE(legacy(3, QueryType::SET, {"/k19"}, {b("v")}));
  CHECK(out.take(2) == "00");
  CHECK(engine.pendingWaits() == 0);
}

TEST_CASE_METHOD(Fixture, "a cancelled wait leaves no registration behind", "[unit]") {
  REQUIRE(v2(1, QueryType::WAIT, {"/x", "/y"}));
  REQUIRE(v2(2, QueryType::WAIT, {"/x"}));
  REQUIRE(v2(1, QueryType::CANCEL_WAIT));
  CHECK(out.take(1) == "01");
  REQUIRE(v2(3, QueryType::QUEUE_PUSH, {"/x"}, {b("item")}));  // wakes one: must be client 2
  CHECK(out.take(2) == "00");
  CHECK(out.take(1).empty());
  CHECK(engine.pendingWaits() == 0);
}

TEST_CASE_METHOD(Fixture, "the owner's local set wakes waiters and erase keeps only its prefix",
                 "[unit]") {
  REQUIRE(v2(1, QueryType::SET, {"/worker/attempt_0/k"}, {b("v")}));
  REQUIRE(v2(1, QueryType::SET, {"init/"}, {b("2")}));
  REQUIRE(v2(1, QueryType::QUEUE_PUSH, {"q"}, {b("x")}));
  out.take(1);
  engine.localSet("cpprun/nccl_unique_id", b("abcd"));
  CHECK(engine.numKeys() == 3);
  // queues count as keys removed too.
  CHECK(engine.eraseKeysExcept("cpprun/") == 3);
  CHECK(engine.numKeys() == 1);
  REQUIRE(v2(1, QueryType::CHECK, {"init/"}));
  CHECK(out.take(1) == "01");  // NOT_READY
  REQUIRE(v2(1, QueryType::GET, {"cpprun/nccl_unique_id"}));
  CHECK(out.take(1) ==
        "0400000000000000"
        "61626364");
  // A local set answers a client's pending WAIT.
  REQUIRE(v2(2, QueryType::WAIT, {"cpprun/ready"}));
  CHECK(out.take(2).empty());
  engine.localSet("cpprun/ready", b("1"));
  CHECK(out.take(2) == "00");
}

TEST_CASE_METHOD(Fixture, "a MULTI_GET or LIST_KEYS reply over the output budget is never built",
                 "[unit]") {
  REQUIRE(v2(1, QueryType::SET, {"/big"}, {Bytes(1000, 'x')}));
  out.budget = 4096;
  // 131,072 copies of an 8 MiB value would be a 1 TiB reply: sized first, then refused.
  std::vector<std::string> many(100, "/big");
  many.push_back("/missing");
  REQUIRE(v2(1, QueryType::MULTI_GET, many));
  CHECK(out.asked[1] == 100 * (8 + 1000) + 8);
  CHECK(out.take(1).empty());
  // Within the budget: built and sent as always.
  REQUIRE(v2(1, QueryType::MULTI_GET, {"/big", "/missing"}));
  CHECK(out.asked[1] == 8 + 1000 + 8);
  CHECK(out.sent[1].size() == 8 + 1000 + 8);
  out.take(1);
  out.budget = 8;
  REQUIRE(v2(1, QueryType::LIST_KEYS));
  CHECK(out.asked[1] == 8 + 8 + 4);
  CHECK(out.take(1).empty());
}

TEST_CASE_METHOD(Fixture, "repeated APPEND grows the value in place, moving O(N) bytes", "[unit]") {
  // The engine once copied the whole old value per APPEND (N appends of one byte: N^2/2 bytes).
  // In place with geometric growth, the bytes moved are those present at each reallocation.
  constexpr size_t kAppends = 20000;
  const Request append = makeRequest(QueryType::APPEND, {"/log"}, {b("x")});
  std::string error;
  size_t reallocations = 0;
  size_t bytes_moved = 0;
  size_t capacity = 0;
  for (size_t i = 0; i < kAppends; ++i) {
    REQUIRE(engine.handle(1, Dialect::kV2, append, &error));
    const Bytes* value = engine.find("/log");
    REQUIRE(value != nullptr);
    if (value->capacity() != capacity) {
      ++reallocations;
      bytes_moved += i;  // what the old storage held
      capacity = value->capacity();
    }
  }
  REQUIRE(engine.find("/log")->size() == kAppends);
  CHECK(bytes_moved <= 2 * kAppends);
  CHECK(reallocations <= 20);  // log2(20000) + 1 = 15.3
  CHECK(out.take(1).empty());  // APPEND has no reply
}

TEST_CASE_METHOD(Fixture, "APPEND to a watched key reports the old and the new value", "[unit]") {
  REQUIRE(legacy(2, QueryType::WATCH_KEY, {"/w"}));
  CHECK(out.take(2) == "03");
  REQUIRE(v2(1, QueryType::APPEND, {"/w"}, {b("ab")}));
  // created: event 01, key, old "", new "ab"
  CHECK(out.take(2) ==
        "01"
        "0200000000000000"
        "2f77"
        "0000000000000000"
        "0200000000000000"
        "6162");
  REQUIRE(v2(1, QueryType::APPEND, {"/w"}, {b("c")}));
  CHECK(out.take(2) ==
        "00"
        "0200000000000000"
        "2f77"
        "0200000000000000"
        "6162"
        "0300000000000000"
        "616263");
}
