// Replays every scenario captured from real torch (tests/rendezvous/data/torch-1.13.json,
// torch-2.1.json, torch-2.15.json; see the README there) against our server over real TCP and
// compares the bytes it answers with the recorded ones.
//
// The captures' servers also had clients whose traffic is not in the files (the capture
// script's own client set keys that blocked WAITs were waiting for; rank 0 used the store it
// hosted). The 2.x files list those as `hidden_actions`; for the 1.13 file they are written
// out below from each scenario's api_calls. A side connection performs them at the point the
// recording shows. Because the requests are replayed verbatim, even the run-specific values
// (gloo addresses, host names, pids in PING) come back identical, so every reply is compared
// byte for byte.
//
// Where torch's servers disagree with each other (libuv vs legacy) we can match only one; where
// we differ from a torch server on purpose, the scenario is listed in ourDifferences() with the
// reason and a check of what our server does instead.
#include <algorithm>
#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "rendezvous/tcp_store_client.h"
#include "rendezvous/tcp_store_server.h"
#include "rendezvous/wire.h"
#include "tests/support/test_support.h"

namespace {

using namespace cpprun::rendezvous;
using namespace cpprun::testing;
using nlohmann::json;

json loadVectors(const std::string& file = "torch-1.13.json") {
  std::ifstream in(sourcePath("tests/rendezvous/data/" + file));
  REQUIRE(in.good());
  return json::parse(in);
}

// The value carried by a recorded GET reply (u64 length + bytes).
Bytes recordedValue(const json& exchanges, size_t index) {
  Bytes reply = fromHex(exchanges.at(index)["hex"]);
  return Bytes(reply.begin() + 8, reply.end());
}

// Actions of clients the capture did not show, keyed by the index of the exchange before which
// they happened.
using HiddenAction = std::function<void(TcpStoreClient&, const json& exchanges)>;
using HiddenActions = std::map<size_t, std::vector<HiddenAction>>;

// The 2.x files record them: {before, op, key, value_hex | delta}.
HiddenActions recordedHiddenActions(const json& scenario) {
  HiddenActions out;
  for (const auto& h : scenario.value("hidden_actions", json::array())) {
    const std::string op = h["op"];
    const std::string key = h["key"];
    HiddenAction a;
    if (op == "set") {
      Bytes v = fromHex(h["value_hex"]);
      a = [key, v](TcpStoreClient& s, const json&) { s.set(key, v); };
    } else if (op == "add") {
      int64_t delta = h["delta"];
      a = [key, delta](TcpStoreClient& s, const json&) { s.add(key, delta); };
    } else if (op == "delete_key") {
      a = [key](TcpStoreClient& s, const json&) { s.deleteKey(key); };
    } else if (op == "queue_push") {
      Bytes v = fromHex(h["value_hex"]);
      a = [key, v](TcpStoreClient& s, const json&) { s.queuePush(key, v); };
    } else {
      FAIL("unknown hidden action '" << op << "' in " << scenario["name"]);
    }
    out[h["before"].get<size_t>()].push_back(a);
  }
  return out;
}

// The 1.13 file: the capture server's in-process client, and in init_process_group_env_rank1
// rank 0, which used its own server directly. Values that rank 0 stored are taken from rank 1's
// recorded GET replies.
std::map<std::string, std::map<size_t, HiddenAction>> hiddenActions() {
  auto set = [](std::string key, std::string value) -> HiddenAction {
    return [key, value](TcpStoreClient& s, const json&) { s.set(key, value); };
  };
  auto setRecorded = [](std::string key, size_t reply_index) -> HiddenAction {
    return [key, reply_index](TcpStoreClient& s, const json& ex) {
      s.set(key, recordedValue(ex, reply_index));
    };
  };
  auto add = [](std::string key) -> HiddenAction {
    return [key](TcpStoreClient& s, const json&) { s.add(key, 1); };
  };
  return {
      {"get_blocking", {{1, set("/late_get", "arrived")}}},
      {"wait_blocking", {{1, set("/late_key", "late")}}},
      {"wait_timeout_then_desync", {{3, set("/never", "now")}}},
      {"watch_key_raw",
       {{3, set("/watched", "v1")},
        {4, set("/watched", "v2")},
        {5, [](TcpStoreClient& s, const json&) { s.deleteKey("/watched"); }}}},
      {"init_process_group_env_rank1",
       {{1, add("init/")},
        {6, setRecorded("/default_pg/0/0/rank_0", 8)},
        {11, setRecorded("/default_pg/0/0/0", 15)},
        {16, add("/default_pg/store_based_barrier_key:1")},
        {21, setRecorded("/default_pg/0/SEQ_NUM_STORE_KEY", 25)}}},
  };
}

// The keys of a LIST_KEYS reply (u64 count, then count x (u64 length, bytes)), sorted; a
// malformed reply yields one entry saying so.
std::vector<std::string> sortedListedKeys(const Bytes& reply) {
  std::vector<std::string> keys;
  if (reply.size() < 8) return {"<malformed LIST_KEYS reply>"};
  const uint64_t count = wire::loadU64(reply.data());
  size_t pos = 8;
  for (uint64_t i = 0; i < count; ++i) {
    if (reply.size() - pos < 8) return {"<malformed LIST_KEYS reply>"};
    const uint64_t length = wire::loadU64(reply.data() + pos);
    pos += 8;
    if (reply.size() - pos < length) return {"<malformed LIST_KEYS reply>"};
    keys.emplace_back(reinterpret_cast<const char*>(reply.data() + pos), length);
    pos += length;
  }
  if (pos != reply.size()) return {"<malformed LIST_KEYS reply>"};
  std::sort(keys.begin(), keys.end());
  return keys;
}

class Replayer {
 public:
  explicit Replayer(uint16_t port) : port_(port) {
    TcpStoreClientOptions o;
    o.port = port;
    o.timeout = std::chrono::seconds(10);
    side_ = std::make_unique<TcpStoreClient>(o);
  }

  void run(const json& scenario) {
    const std::string name = scenario["name"];
    HiddenActions hidden;
    if (scenario.contains("hidden_actions")) {
      hidden = recordedHiddenActions(scenario);
    } else {
      auto written_out = hiddenActions();
      for (auto& [i, a] : written_out[name]) hidden[i].push_back(a);
    }
    const auto& exchanges = scenario["exchanges"];
    std::map<int, bool> client_closed;
    for (size_t i = 0; i < exchanges.size(); ++i) {
      for (auto& action : hidden[i]) action(*side_, exchanges);
      // SET has no reply: a round trip on the side connection makes sure the server applied
      // it before the replay's next request reaches it on another connection.
      if (!hidden[i].empty()) side_->numKeys();
      const auto& e = exchanges[i];
      const std::string direction = e["direction"];
      const int conn = e["conn"];
      const std::string what = e.value("name", "");
      INFO(name << " #" << i << " conn " << conn << " " << direction << " " << what);
      if (direction == "event") {
        if (what.find("opened by client") != std::string::npos) {
          connections_.erase(conn);
          connections_.emplace(conn, RawConnection("127.0.0.1", port_));
        } else if (what.find("closed connection") != std::string::npos &&
                   what.find("EOF from server") != std::string::npos) {
          if (name == "init_process_group_env_rank1" && !client_closed[conn]) {
            // The server lived in rank 0 and went away when rank 0 exited before rank 1
            // closed; ours stays up, so end this connection the way rank 1 then did.
            connection(conn).shutdownWrite();
            client_closed[conn] = true;
          }
          CHECK(connection(conn).closedByPeer(5s));
        } else if (what.find("EOF from client") != std::string::npos) {
          if (!client_closed[conn]) connection(conn).shutdownWrite();
          client_closed[conn] = true;
        } else if (what.empty()) {
          // init_process_group scenarios: unnamed events are connects (first sight) or closes.
          if (!seen_[conn]) {
            seen_[conn] = true;
            connections_.erase(conn);
            connections_.emplace(conn, RawConnection("127.0.0.1", port_));
          }
        }
      } else if (direction == "client->server") {
        connection(conn).send(fromHex(e["hex"]));
      } else {
        Bytes expected = fromHex(e["hex"]);
        auto got = connection(conn).read(expected.size(), 5s);
        REQUIRE(got.has_value());
        if (what == "LIST_KEYS response") {
          // The order of LIST_KEYS is a hash map's iteration order on both sides, which no
          // client relies on: the same keys, each once, and the same byte count suffice.
          CHECK(sortedListedKeys(*got) == sortedListedKeys(expected));
        } else {
          CHECK(toHex(*got) == toHex(expected));
        }
      }
    }
  }

  RawConnection& connection(int conn) {
    auto it = connections_.find(conn);
    if (it == connections_.end()) {
      // Connections opened before the scenario's first event (by an earlier scenario).
      it = connections_.emplace(conn, RawConnection("127.0.0.1", port_)).first;
    }
    return it->second;
  }

 private:
  uint16_t port_;
  std::unique_ptr<TcpStoreClient> side_;
  std::map<int, RawConnection> connections_;
  std::map<int, bool> seen_;
};

// A scenario where our server answers differently from the torch server that was recorded, on
// purpose: why, and what ours does instead (checked on a fresh server).
struct Difference {
  std::string reason;
  std::function<void(uint16_t port)> check_ours;
};

// Key: "<file>/<server>/<scenario>".
std::map<std::string, Difference> ourDifferences() {
  const std::string validate = "00cef7853c";
  auto closesAfter = [](std::string hex) {
    return [hex](uint16_t port) {
      RawConnection c("127.0.0.1", port);
      c.sendHex(hex);
      CHECK(c.closedByPeer(5s));
    };
  };
  auto answers = [](std::string hex, std::string reply_hex) {
    return [hex, reply_hex](uint16_t port) {
      RawConnection c("127.0.0.1", port);
      c.sendHex(hex);
      auto got = c.read(reply_hex.size() / 2, 5s);
      REQUIRE(got.has_value());
      CHECK(toHex(*got) == reply_hex);
    };
  };
  // Replayed against us in the libuv run of the same file, which passes.
  auto likeLibuv = [](std::string scenario) {
    return [scenario](uint16_t) {
      json v = loadVectors("torch-2.15.json");
      bool found = false;
      for (const auto& s : v["scenarios"]) {
        found = found || (s["server"] == "libuv" && s["name"] == scenario);
      }
      CHECK(found);
    };
  };
  const std::string add_init = "030500000000000000696e69742f0100000000000000";
  return {
      {"torch-1.13.json/1.13/v2_validate_ping_against_1_13_server",
       {"torch 1.13's server drops a torch >= 2.2 client; ours speaks that dialect and echoes "
        "its PING (checked in the next test case)",
        answers("00cef7853c0d92100000", "92100000")}},
      {"torch-1.13.json/1.13/unknown_query_type_raw",
       {"type 9 is MULTI_GET in torch 2.1 numbering: where torch 1.13 closed the connection, we "
        "switch it to 2.1 numbering (no 1.13 client sends 9) and wait for the rest of the "
        "MULTI_GET, whose key length (0x16b, read from the probe's bytes) has not arrived; at "
        "the client's EOF we close without a reply",
        [](uint16_t port) {
          RawConnection c("127.0.0.1", port);
          c.sendHex("0901000000000000006b010000000000000076");
          c.shutdownWrite();
          CHECK(c.closedByPeer(5s));
        }}},
      {"torch-2.1.json/legacy/v2_validate_ping_against_this_server",
       {"torch 2.1's server drops a torch >= 2.2 client; ours echoes its PING",
        answers("00cef7853c0d92100000", "92100000")}},
      {"torch-2.15.json/legacy/wrong_magic_raw",
       {"the legacy server closes a connection whose VALIDATE has the wrong magic at once; libuv "
        "(replayed against us, which passes) keeps it and waits for more bytes, and so do we: "
        "we read bytes that are not the handshake as an old client's SET, whose u64 key length "
        "(bytes ef be ad de 07 ...) is over the key limit as soon as its last 3 bytes arrive",
        closesAfter("00efbeadde07000000")}},
      {"torch-2.15.json/libuv/no_validate_raw",
       {"libuv swallows a first request that is not VALIDATE and never answers (a 1.13/2.1 "
        "client hangs); we read it as an old client's request (here 1.13 ADD init/ 1) and "
        "answer it, since we serve torch 1.13 and 2.1 clients too",
        answers(add_init, "0100000000000000")}},
      {"torch-2.15.json/legacy/no_validate_raw",
       {"the legacy server closes a connection whose first request is not VALIDATE; we serve "
        "old clients (as in the libuv difference above)",
        answers(add_init, "0100000000000000")}},
      {"torch-2.15.json/legacy/get_missing_raw",
       {"the two torch servers disagree: legacy closes on a GET of a missing key, libuv answers "
        "an empty value; for a torch >= 2.2 client we match libuv, the default server since "
        "torch 2.4",
        answers(validate + "0303000000000000002f6e6f", "0000000000000000")}},
      {"torch-2.15.json/legacy/queue_ops",
       {"the legacy server does not know the queue types and closes; we implement them as "
        "libuv does (libuv's recording of this scenario is replayed against us)",
        likeLibuv("queue_ops")}},
      {"torch-2.15.json/legacy/queue_pop_blocking",
       {"as queue_ops: no queues on the legacy server", likeLibuv("queue_pop_blocking")}},
  };
}

// Replays every scenario of `file`: the non-init scenarios of each server in order on one
// server of ours (key counts and connection numbers run on from one scenario to the next), each
// init_process_group scenario on a fresh one. Returns how many were replayed or checked.
int replayFile(const std::string& file, wire::Dialect no_handshake = wire::Dialect::kLegacy) {
  json vectors = loadVectors(file);
  auto differences = ourDifferences();
  std::map<std::string, std::unique_ptr<BackgroundTcpStoreServer>> servers;
  std::map<std::string, std::unique_ptr<Replayer>> replayers;
  TcpStoreServerOptions options;
  options.no_handshake_dialect = no_handshake;
  int done = 0;
  for (const auto& scenario : vectors["scenarios"]) {
    const std::string name = scenario["name"];
    const std::string server = scenario.value("server", "1.13");
    INFO(file << " " << server << "/" << name);
    auto diff = differences.find(file + "/" + server + "/" + name);
    if (diff != differences.end()) {
      INFO("differs on purpose: " << diff->second.reason);
      auto own = BackgroundTcpStoreServer::start(options);
      REQUIRE(own.isOk());
      diff->second.check_ours(own.value()->port());
    } else if (name.rfind("init_process_group", 0) == 0) {
      auto own = BackgroundTcpStoreServer::start(options);
      REQUIRE(own.isOk());
      Replayer fresh(own.value()->port());
      fresh.run(scenario);
    } else {
      if (!servers.count(server)) {
        auto started = BackgroundTcpStoreServer::start(options);
        REQUIRE(started.isOk());
        servers[server] = std::move(started.value());
        replayers[server] = std::make_unique<Replayer>(servers[server]->port());
      }
      replayers[server]->run(scenario);
    }
    ++done;
  }
  return done;
}

}  // namespace

TEST_CASE("our server answers every captured torch 1.13 scenario with torch's bytes",
          "[integration]") {
  json vectors = loadVectors();
  REQUIRE(vectors["numbering"].get<std::string>().find("SET=0") != std::string::npos);
  CHECK(replayFile("torch-1.13.json") == static_cast<int>(vectors["scenarios"].size()));
}

TEST_CASE("our server answers every captured torch 2.15 scenario, libuv and legacy server",
          "[integration][torch2]") {
  json vectors = loadVectors("torch-2.15.json");
  REQUIRE(vectors["dialect"] == "2.2+");
  REQUIRE(vectors["servers"] == json::array({"libuv", "legacy"}));
  CHECK(replayFile("torch-2.15.json") == static_cast<int>(vectors["scenarios"].size()));
}

TEST_CASE("our server answers every captured torch 2.1 scenario with torch's bytes",
          "[integration][torch2]") {
  json vectors = loadVectors("torch-2.1.json");
  REQUIRE(vectors["dialect"] == "2.1");
  // Read as 1.13 until the connection sends what only 2.1 sends (the default) ...
  CHECK(replayFile("torch-2.1.json") == static_cast<int>(vectors["scenarios"].size()));
  // ... and as 2.1 from the first byte when the server is told its clients are 2.1.
  CHECK(replayFile("torch-2.1.json", wire::Dialect::kV21) ==
        static_cast<int>(vectors["scenarios"].size()));
}

TEST_CASE("a torch 2.2+ handshake is answered rather than dropped as torch 1.13 did",
          "[integration]") {
  auto server = BackgroundTcpStoreServer::start({});
  REQUIRE(server.isOk());
  RawConnection c("127.0.0.1", server.value()->port());
  // The exact bytes of the capture: VALIDATE, then PING with nonce 0x1092 ...
  c.sendHex("00cef7853c0d92100000");
  auto echo = c.read(4, 5s);
  REQUIRE(echo.has_value());
  CHECK(toHex(*echo) == "92100000");
  // ... and the connection then speaks the 2.2 numbering: GETNUMKEYS is 7.
  c.sendHex("07");
  auto count = c.read(8, 5s);
  REQUIRE(count.has_value());
  CHECK(toHex(*count) == "0000000000000000");
}
