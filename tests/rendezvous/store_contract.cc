// The Store contract's cases and their registration with Catch (see store_contract.h).
#include "tests/rendezvous/store_contract.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <thread>
#include <utility>

namespace cpprun::testing {
namespace {

using namespace rendezvous;
using namespace std::chrono_literals;

// A contract case: `s` and `other` are two handles of `kind` on fresh data, `p` a key prefix no
// other kind of the same test case uses.
using CaseBody = void (*)(Store& s, Store& other, const std::string& p, const StoreKind& kind);

struct ContractCase {
  const char* name;
  int line;  // in this file, where Catch reports the test case
  CaseBody body;
};

void setAndGet(Store& s, Store& other, const std::string& p, const StoreKind&) {
  s.set(p + "k", toBytes("v"));
  CHECK(toString(other.get(p + "k")) == "v");
  Bytes binary{0, 1, 255, 0};
  s.set(p + "bin", binary);
  CHECK(other.get(p + "bin") == binary);
  s.set(p + "empty", Bytes{});
  CHECK(other.get(p + "empty").empty());
  Bytes big(1 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 7);
  s.set(p + "big", big);
  CHECK(other.get(p + "big") == big);
  // SET has no reply on the TCP store, so only a round trip on the same handle orders it before
  // what another connection reads next.
  s.set(p + "k", std::string("overwritten"));
  CHECK(toString(s.get(p + "k")) == "overwritten");
  CHECK(toString(other.get(p + "k")) == "overwritten");
}

void addInDecimalText(Store& s, Store& other, const std::string& p, const StoreKind&) {
  CHECK(s.add(p + "c", 5) == 5);
  CHECK(other.add(p + "c", -2) == 3);
  CHECK(s.add(p + "c", 0) == 3);
  CHECK(toString(other.get(p + "c")) == "3");
  s.set(p + "text", std::string("abc"));
  CHECK_THROWS_AS(s.add(p + "text", 1), StoreError);
}

void compareSetCases(Store& s, Store& other, const std::string& p, const StoreKind&) {
  CHECK(toString(s.compareSet(p + "k", {}, toBytes("first"))) == "first");
  CHECK(toString(s.compareSet(p + "missing", toBytes("x"), toBytes("y"))) == "x");
  CHECK_FALSE(other.check({p + "missing"}));
  CHECK(toString(s.compareSet(p + "k", toBytes("first"), toBytes("second"))) == "second");
  CHECK(toString(s.compareSet(p + "k", toBytes("nomatch"), toBytes("third"))) == "second");
  CHECK(toString(other.get(p + "k")) == "second");
}

void checkDeleteKeyNumKeys(Store& s, Store& other, const std::string& p, const StoreKind& kind) {
  int64_t before = s.numKeys();
  CHECK_FALSE(s.check({p + "a"}));
  s.set(p + "a", std::string("1"));
  s.set(p + "b", std::string("2"));
  CHECK(s.check({p + "a", p + "b"}));  // a round trip: both SETs were applied
  CHECK(other.check({p + "a", p + "b"}));
  CHECK_FALSE(other.check({p + "a", p + "nope"}));
  CHECK(s.numKeys() == before + 2);
  CHECK(other.deleteKey(p + "a"));
  CHECK_FALSE(other.deleteKey(p + "a"));
  CHECK(s.numKeys() == before + 1);
  CHECK_FALSE(s.check({p + "a"}));

  // A key outside this store's namespace, in the same backing store.
  auto elsewhere = kind.open_elsewhere();
  elsewhere->setTimeout(10s);
  elsewhere->set(p + "elsewhere", std::string("x"));
  REQUIRE(elsewhere->check({p + "elsewhere"}));  // a round trip: the SET was applied
  CHECK_FALSE(s.check({p + "elsewhere"}));
  if (kind.num_keys == NumKeysScope::kWholeStore) {
    CHECK(s.numKeys() == before + 2);
  } else {
    CHECK(s.numKeys() == before + 1);
  }
  CHECK(elsewhere->deleteKey(p + "elsewhere"));
  CHECK(s.numKeys() == before + 1);
}

void waitReturnsOrTimesOut(Store& s, Store& other, const std::string& p, const StoreKind&) {
  std::thread writer([&] {
    // Synchronise on the store itself: write once the waiter announced itself.
    other.wait({p + "waiting"}, 10s);
    other.set(p + "late", std::string("arrived"));
  });
  s.set(p + "waiting", std::string("1"));
  s.wait({p + "late"}, 10s);
  CHECK(toString(s.get(p + "late")) == "arrived");
  writer.join();

  auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(s.wait({p + "never"}, 300ms), StoreTimeout);
  auto took = std::chrono::steady_clock::now() - start;
  CHECK(took >= 300ms);
  CHECK(took < 5s);
  // The handle still works after a timed-out wait (legacy TCP: reconnects; V2: CANCEL_WAIT).
  s.set(p + "after", std::string("ok"));
  CHECK(toString(s.get(p + "after")) == "ok");
  CHECK(s.add(p + "n", 1) == 1);
}

void blockingGetWokenByOther(Store& s, Store& other, const std::string& p, const StoreKind&) {
  std::thread writer([&] {
    other.wait({p + "reader-started"}, 10s);
    other.set(p + "value", std::string("pushed"));
  });
  s.set(p + "reader-started", std::string("1"));
  auto start = std::chrono::steady_clock::now();
  CHECK(toString(s.get(p + "value")) == "pushed");  // blocks until the writer's set
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  writer.join();
}

void getTimesOut(Store& s, Store&, const std::string& p, const StoreKind&) {
  s.setTimeout(200ms);
  auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(s.get(p + "absent"), StoreTimeout);
  auto took = std::chrono::steady_clock::now() - start;
  CHECK(took >= 200ms);
  CHECK(took < 5s);
  s.setTimeout(10s);
  s.set(p + "present", std::string("x"));
  CHECK(toString(s.get(p + "present")) == "x");
}

void multiGetMultiSetAppend(Store& s, Store& other, const std::string& p, const StoreKind&) {
  s.multiSet({p + "x", p + "y"}, {toBytes("1"), toBytes("22")});
  auto values = other.multiGet({p + "y", p + "x"});
  REQUIRE(values.size() == 2);
  CHECK(toString(values[0]) == "22");
  CHECK(toString(values[1]) == "1");
  s.append(p + "log", toBytes("a"));
  // APPEND has no reply on the TCP store: a round trip on the same handle orders it before the
  // next append from another connection.
  CHECK(toString(s.get(p + "log")) == "a");
  other.append(p + "log", toBytes("bc"));
  CHECK(toString(s.get(p + "log")) == "abc");
  CHECK_THROWS_AS(s.multiSet({p + "only-key"}, {}), StoreError);
}

void concurrentAddsNeverLost(Store& s, Store& other, const std::string& p, const StoreKind& kind) {
  constexpr int kThreads = 8;
  const int adds = kind.adds_per_thread;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    // Half the threads through the other handle: two clients racing on one counter, and several
    // threads on each.
    Store& target = t % 2 == 0 ? s : other;
    threads.emplace_back([&target, &p, adds] {
      for (int i = 0; i < adds; ++i) target.add(p + "counter", 1);
    });
  }
  for (auto& t : threads) t.join();
  CHECK(s.add(p + "counter", 0) == kThreads * adds);
}

// Tickets (Store::takeTicket): from many threads over both handles, every number 1..N once and
// tickets() == N.
void ticketsAreDenseAndUnique(Store& s, Store& other, const std::string& p, const StoreKind& kind) {
  constexpr int kThreads = 8;
  const int takes = kind.adds_per_thread;
  CHECK(s.tickets(p + "tickets") == 0);
  std::vector<std::vector<int64_t>> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    Store& target = t % 2 == 0 ? s : other;
    threads.emplace_back([&target, &p, &mine = got[static_cast<size_t>(t)], takes] {
      for (int i = 0; i < takes; ++i) mine.push_back(target.takeTicket(p + "tickets"));
    });
  }
  for (auto& t : threads) t.join();
  std::vector<int64_t> all;
  for (const auto& mine : got) all.insert(all.end(), mine.begin(), mine.end());
  std::sort(all.begin(), all.end());
  std::vector<int64_t> expected(static_cast<size_t>(kThreads * takes));
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = static_cast<int64_t>(i) + 1;
  CHECK(all == expected);
  CHECK(other.tickets(p + "tickets") == kThreads * takes);
}

// The case names are the test names CI and the docs know; keep them stable.
const std::vector<ContractCase>& contractCases() {
  static const std::vector<ContractCase> cases = {
      {"set and get with binary and empty values", __LINE__, &setAndGet},
      {"add counts in decimal text", __LINE__, &addInDecimalText},
      {"compareSet's four cases", __LINE__, &compareSetCases},
      {"check and deleteKey and numKeys", __LINE__, &checkDeleteKeyNumKeys},
      {"wait returns once another handle writes and times out otherwise", __LINE__,
       &waitReturnsOrTimesOut},
      {"blocking get is woken by another client's set", __LINE__, &blockingGetWokenByOther},
      {"get times out on a key nobody writes", __LINE__, &getTimesOut},
      {"multiGet and multiSet and append", __LINE__, &multiGetMultiSetAppend},
      {"concurrent adds from many threads are never lost", __LINE__, &concurrentAddsNeverLost},
      {"tickets from many threads are dense and each taken once", __LINE__,
       &ticketsAreDenseAndUnique},
  };
  return cases;
}

// Runs one contract case over every kind the factory makes, in one pass (no sections, so the
// servers start once per test case).
class ContractCaseInvoker : public Catch::ITestInvoker {
 public:
  ContractCaseInvoker(const ContractCase& c, MakeStoreKinds make_kinds)
      : case_(c), make_kinds_(std::move(make_kinds)) {}

  void invoke() const override {
    StoreKinds made = make_kinds_();
    REQUIRE_FALSE(made.kinds.empty());
    int round = 0;
    for (const auto& kind : made.kinds) {
      INFO("store kind: " << kind.name);
      auto a = kind.open();
      auto b = kind.open();
      a->setTimeout(10s);
      b->setTimeout(10s);
      case_.body(*a, *b, "/t" + std::to_string(round++) + "/", kind);
    }
  }

 private:
  ContractCase case_;
  MakeStoreKinds make_kinds_;
};

}  // namespace

bool registerStoreContract(const std::string& name_prefix, const std::string& tags,
                           MakeStoreKinds make_kinds) {
  for (const auto& c : contractCases()) {
    const std::string name = name_prefix + c.name;
    // What TEST_CASE expands to, with an invoker that carries the case and the factory; Catch
    // copies the name and tags and owns the invoker.
    Catch::AutoReg registration(new ContractCaseInvoker(c, make_kinds),
                                Catch::SourceLineInfo(__FILE__, static_cast<std::size_t>(c.line)),
                                Catch::StringRef(), Catch::NameAndTags{name, tags});
  }
  return true;
}

}  // namespace cpprun::testing
