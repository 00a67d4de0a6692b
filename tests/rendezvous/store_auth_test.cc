// The job's secret on the TCP store (rendezvous/store_auth.h): only connections that prove it
// write the job's keys ("cpprun/..."); everyone else keeps reading them and writing their own.
#include "rendezvous/store_auth.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <string>

#include "rendezvous/tcp_store_client.h"
#include "rendezvous/tcp_store_server.h"
#include "tests/support/test_support.h"

namespace {

using namespace cpprun::rendezvous;
using namespace cpprun::testing;
using namespace std::chrono_literals;

const std::string kSecret = "0123456789abcdef0123456789abcdef";

std::unique_ptr<TcpStoreClient> client(uint16_t port, const std::string& secret = "") {
  TcpStoreClientOptions o;
  o.port = port;
  o.timeout = 5s;
  o.connect_timeout = 10s;
  o.secret = secret;
  return std::make_unique<TcpStoreClient>(o);
}

std::unique_ptr<BackgroundTcpStoreServer> serverWithSecret(const std::string& secret) {
  TcpStoreServerOptions o;
  o.secret = secret;
  auto server = BackgroundTcpStoreServer::start(o);
  REQUIRE(server.isOk());
  return std::move(server).value();
}

// SET <key> <value> in the torch >= 2.2 numbering, after VALIDATE.
Bytes v2Set(const std::string& key, const std::string& value) {
  Bytes out = fromHex("00cef7853c");
  out.push_back(1);
  wire::appendString(&out, key);
  wire::appendString(&out, value);
  return out;
}

}  // namespace

TEST_CASE(
    "store auth: a stranger's writes of the job's keys close its connection and change "
    "nothing",
    "[integration]") {
  auto server = serverWithSecret(kSecret);
  const uint16_t port = server->port();
  auto agent = client(port, kSecret);
  agent->set("cpprun/job/attempt/0/stop", std::string("{\"by\":0,\"cause\":\"failure\"}"));
  // Issue 36's bytes, written the way a stranger would: with torch's own client protocol.
  for (const char* key :
       {"cpprun/job/attempt/0/stop", "cpprun/job/rdzv/round/0/agent/1", "cpprun/served_run_id"}) {
    INFO(key);
    RawConnection c("127.0.0.1", port);
    c.send(v2Set(key, R"({"by":"x","cause":7})"));
    CHECK(c.closedByPeer(5s));
  }
  CHECK(toString(agent->get("cpprun/job/attempt/0/stop")) == "{\"by\":0,\"cause\":\"failure\"}");
  CHECK_FALSE(agent->check({"cpprun/job/rdzv/round/0/agent/1"}));
  // Through the real client as well: ADD, COMPARE_SET, DELETE_KEY, MULTI_SET, APPEND.
  auto stranger = client(port);
  CHECK_THROWS_AS(stranger->add("cpprun/job/rdzv/joined", 1), StoreError);
  CHECK_THROWS_AS(stranger->deleteKey("cpprun/job/attempt/0/stop"), StoreError);
  CHECK_THROWS_AS(stranger->compareSet("cpprun/job/attempt/1/stop", {}, toBytes(std::string("x"))),
                  StoreError);
  stranger->multiSet({"ok/1", "cpprun/job/x"},
                     {toBytes(std::string("a")), toBytes(std::string("b"))});
  CHECK_THROWS_AS(stranger->get("ok/1"), StoreError);  // the MULTI_SET closed it: nothing written
  CHECK_FALSE(agent->check({"ok/1"}));
  CHECK_FALSE(agent->check({"cpprun/job/x"}));
  CHECK(server->stats().refused_unauthenticated == 7);
  // What the workers do keeps working: read the job's keys, write their own.
  auto worker = client(port);
  CHECK(toString(worker->get("cpprun/job/attempt/0/stop")) == "{\"by\":0,\"cause\":\"failure\"}");
  worker->set("/default_pg/0//cuda//0", std::string("nccl id"));
  CHECK(worker->add("init/", 1) == 1);
  CHECK(toString(agent->get("/default_pg/0//cuda//0")) == "nccl id");
  CHECK(toString(worker->get(kAuthRequiredKey)) == kAuthScheme);
}

TEST_CASE(
    "store auth: a wrong secret, or a store without one, is refused at once and not "
    "retried",
    "[integration]") {
  auto server = serverWithSecret(kSecret);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    client(server->port(), "another secret of the right length!!");
    FAIL("connected with a wrong secret");
  } catch (const StoreAuthError& e) {
    CHECK_THAT(e.what(), Catch::Contains("does not hold this job's secret"));
  }
  // connect_timeout is 10 s: an authentication failure is not retried until then.
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  auto open = BackgroundTcpStoreServer::start({});
  REQUIRE(open.isOk());
  try {
    client(open.value()->port(), kSecret);
    FAIL("accepted a store without the secret");
  } catch (const StoreAuthError& e) {
    CHECK_THAT(e.what(), Catch::Contains("it has no job secret"));
  }
  // The right secret: writes pass.
  auto agent = client(server->port(), kSecret);
  agent->set("cpprun/job/k", std::string("v"));
  CHECK(toString(agent->get("cpprun/job/k")) == "v");
}

TEST_CASE("store auth: a proof without a hello, or replayed on another connection, is refused",
          "[integration]") {
  auto server = serverWithSecret(kSecret);
  const uint16_t port = server->port();
  auto auth = [](const std::string& step, const std::string& data) {
    Bytes out;
    out.push_back(96);
    wire::appendString(&out, step);
    wire::appendString(&out, data);
    return out;
  };
  {
    RawConnection c("127.0.0.1", port);
    Bytes bytes = fromHex("00cef7853c");
    const Bytes proof = auth(kAuthProof, std::string(32, 'p'));
    bytes.insert(bytes.end(), proof.begin(), proof.end());
    c.send(bytes);
    CHECK(c.closedByPeer(5s));
  }
  {
    // A hello with this client's nonce, then a proof made for other nonces (as a recorded one
    // would be): refused.
    RawConnection c("127.0.0.1", port);
    Bytes bytes = fromHex("00cef7853c");
    const std::string nonce(kAuthNonceBytes, 'n');
    const Bytes hello = auth(kAuthHello, nonce);
    const Bytes proof =
        auth(kAuthProof, clientProof(kSecret, nonce, std::string(kAuthNonceBytes, 's')));
    bytes.insert(bytes.end(), hello.begin(), hello.end());
    bytes.insert(bytes.end(), proof.begin(), proof.end());
    c.send(bytes);
    CHECK(c.closedByPeer(5s));
  }
  CHECK(server->stats().refused_unauthenticated == 2);
}

TEST_CASE("store auth: proofs depend on the secret, both nonces and the side", "[unit]") {
  const std::string a(32, 'a'), b(32, 'b');
  CHECK(serverProof(kSecret, a, b).size() == kAuthProofBytes);
  CHECK(serverProof(kSecret, a, b) != clientProof(kSecret, a, b));
  CHECK(serverProof(kSecret, a, b) != serverProof(kSecret, b, a));
  CHECK(serverProof(kSecret, a, b) != serverProof(kSecret + "x", a, b));
  CHECK(proofsEqual(clientProof(kSecret, a, b), clientProof(kSecret, a, b)));
  CHECK_FALSE(proofsEqual("abc", "abd"));
  CHECK_FALSE(proofsEqual("abc", "ab"));
  CHECK(randomBytes(32) != randomBytes(32));
  CHECK(isProtectedKey("cpprun/x"));
  CHECK_FALSE(isProtectedKey("/cpprun/x"));
  CHECK_FALSE(isProtectedKey("cpprun"));
}

TEST_CASE("store auth: the secret file must be this user's own, 0600, not a link, long enough",
          "[unit]") {
  TempDir dir;
  const std::string path = dir.path() + "/secret";
  { std::ofstream(path) << "  " << kSecret << "\n"; }
  ::chmod(path.c_str(), 0600);
  cpprun::Result<std::string> good = readJobSecret(path);
  REQUIRE(good.isOk());
  CHECK(good.value() == kSecret);  // surrounding whitespace trimmed
  ::chmod(path.c_str(), 0640);
  CHECK_THAT(readJobSecret(path).status().message(),
             Catch::Contains("has mode 0640: group and others must have no access"));
  ::chmod(path.c_str(), 0600);
  const std::string link = dir.path() + "/link";
  REQUIRE(::symlink(path.c_str(), link.c_str()) == 0);
  CHECK_THAT(readJobSecret(link).status().message(), Catch::Contains("is a symbolic link"));
  const std::string short_path = dir.path() + "/short";
  { std::ofstream(short_path) << "abc"; }
  ::chmod(short_path.c_str(), 0600);
  CHECK_THAT(readJobSecret(short_path).status().message(), Catch::Contains("at least 16"));
  CHECK_THAT(readJobSecret(dir.path() + "/missing").status().message(),
             Catch::Contains("No such file"));
  CHECK_THAT(readJobSecret(dir.path()).status().message(),
             Catch::Contains("is not a regular file"));
}
