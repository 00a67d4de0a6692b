#include "rendezvous/etcd_store.h"

#include <algorithm>
#include <map>
#include <random>
#include <thread>

#include "common/check.h"
#include "rendezvous/store_semantics.h"
#include "rendezvous/wire.h"

namespace cpprun::rendezvous {

namespace {

std::string str(const Bytes& b) { return std::string(b.begin(), b.end()); }
Bytes bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

}  // namespace

EtcdStore::EtcdStore(std::shared_ptr<EtcdClient> client, std::string prefix)
    : client_(std::move(client)), prefix_(std::move(prefix)) {
  CPPRUN_CHECK(client_ != nullptr);
}

void EtcdStore::fail(const char* op, const std::string& key, const Status& status) const {
  throw StoreError(std::string("etcd store ") + op + (key.empty() ? "" : " '" + key + "'") +
                   " (prefix '" + prefix_ + "'): " + status.toString());
}

void EtcdStore::set(const std::string& key, const Bytes& value) {
  auto r = client_->put(full(key), str(value));
  if (!r.isOk()) fail("set", key, r.status());
}

std::string EtcdStore::update(
    const std::string& key, const char* op,
    const std::function<std::string(const std::optional<std::string>&)>& change) {
  const std::string k = full(key);
  auto read = client_->get(k);
  if (!read.isOk()) fail(op, key, read.status());
  std::optional<EtcdKeyValue> current = read.value();
  // Many agents bumping one counter at once (a round's slots) lose most compare-and-swaps:
  // a conflict's txn hands back the value it lost to (no second read), and the next try waits
  // a random pause that doubles per conflict (1 ms up to 64 ms), so that contenders spread out
  // instead of colliding again in step.
  std::chrono::microseconds pause_cap(1000);
  thread_local std::minstd_rand random(
      static_cast<unsigned>(std::hash<std::thread::id>()(std::this_thread::get_id()) ^
                            static_cast<size_t>(Clock::now().time_since_epoch().count())));
  while (true) {
    std::optional<std::string> value;
    EtcdTxn txn;
    if (current) {
      value = current->value;
      txn.compare.push_back(EtcdCompare::modRevisionIs(k, current->mod_revision));
    } else {
      txn.compare.push_back(EtcdCompare::versionIs(k, 0));
    }
    std::string next = change(value);
    txn.success.push_back(EtcdOp::put(k, next));
    txn.failure.push_back(EtcdOp::range(k));
    auto r = client_->txn(txn);
    if (!r.isOk()) fail(op, key, r.status());
    if (r.value().succeeded) return next;
    // Someone else wrote in between: the failure branch read what they wrote.
    current.reset();
    if (!r.value().responses.empty() && !r.value().responses.front().kvs.empty()) {
      current = r.value().responses.front().kvs.front();
    }
    std::this_thread::sleep_for(std::chrono::microseconds(
        std::uniform_int_distribution<int64_t>(0, pause_cap.count())(random)));
    pause_cap = std::min(pause_cap * 2, std::chrono::microseconds(64000));
  }
}

// One txn per call: the comparison, the put on success, and a read of the key on failure, so a
// mismatch hands back the value it lost to without a second request. A non-empty `expected` is
// compared by value (etcd fails a value comparison on an absent key: then `expected` comes back,
// as c10d's). An empty one is compared by version 0 (absent), since etcd cannot compare an
// absent key's value; only a key that exists holding "" (expected "" matches it) takes a second
// txn, on that read's mod_revision.
Bytes EtcdStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  const std::string k = full(key);
  const std::string want = str(expected);
  EtcdCompare compare =
      expected.empty() ? EtcdCompare::versionIs(k, 0) : EtcdCompare::valueIs(k, want);
  while (true) {
    EtcdTxn txn;
    txn.compare.push_back(compare);
    txn.success.push_back(EtcdOp::put(k, str(desired)));
    txn.failure.push_back(EtcdOp::range(k));
    auto r = client_->txn(txn);
    if (!r.isOk()) fail("compareSet", key, r.status());
    if (r.value().succeeded) return desired;
    const auto& responses = r.value().responses;
    if (responses.empty() || responses.front().kvs.empty()) {
      // Absent (the store's rule, store_semantics.h): a non-empty `expected` comes back and
      // nothing is stored. An empty one failed because the key was there and is gone again:
      // retry.
      if (compareSetAction(nullptr, expected) == CompareSetAction::kAnswerExpected) {
        return expected;
      }
      compare = EtcdCompare::versionIs(k, 0);
      continue;
    }
    const EtcdKeyValue& current = responses.front().kvs.front();
    Bytes current_value = bytes(current.value);
    if (compareSetAction(&current_value, expected) == CompareSetAction::kAnswerCurrent) {
      return current_value;
    }
    // The key holds "" and `expected` is "": a match, which version 0 could not express.
    compare = EtcdCompare::modRevisionIs(k, current.mod_revision);
  }
}

Bytes EtcdStore::waitFor(const std::string& full_key, Clock::time_point deadline,
                         std::chrono::milliseconds timeout) {
  while (true) {
    int64_t revision = 0;
    auto current = client_->get(full_key, &revision);
    if (!current.isOk()) fail("get", full_key.substr(prefix_.size()), current.status());
    if (current.value()) return bytes(current.value()->value);
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      throw StoreTimeout("etcd store: wait for key '" + full_key.substr(prefix_.size()) +
                         "' (prefix '" + prefix_ + "') timed out after " +
                         std::to_string(timeout.count()) + " ms");
    }
    // Everything after the read: a put in between is not missed. A watch on a member that is
    // cut off (alive but silent) would never end, so each watch lasts at most request_timeout;
    // the read that follows fails over like every other request.
    auto slice = std::min(left, client_->options().request_timeout);
    auto events = client_->watch(full_key, false, revision + 1, slice);
    if (!events.isOk()) fail("wait", full_key.substr(prefix_.size()), events.status());
    for (const auto& e : events.value()) {
      if (e.type == EtcdEvent::Type::kPut) return bytes(e.kv.value);
    }
    // A timeout (empty) or only deletes: read again, which also checks the deadline.
  }
}

Bytes EtcdStore::get(const std::string& key) {
  auto timeout = this->timeout();
  return waitFor(full(key), Clock::now() + timeout, timeout);
}

int64_t EtcdStore::add(const std::string& key, int64_t delta) {
  if (delta == 0) {  // a read (c10d's way to read a counter): no write unless it must create it
    auto current = client_->get(full(key));
    if (!current.isOk()) fail("add", key, current.status());
    if (current.value()) {
      const Bytes value = bytes(current.value()->value);
      const std::optional<int64_t> counter = addToCounter(&value, 0);
      if (!counter) throw StoreError("etcd store " + notACounterError("add", key));
      return *counter;
    }
  }
  int64_t result = 0;
  update(key, "add", [&](const std::optional<std::string>& value) {
    const Bytes current = value ? bytes(*value) : Bytes{};
    const std::optional<int64_t> sum = addToCounter(value ? &current : nullptr, delta);
    if (!sum) throw StoreError("etcd store " + notACounterError("add", key));
    result = *sum;
    return str(wire::formatCounter(result));
  });
  return result;
}

int64_t EtcdStore::takeTicket(const std::string& key) {
  const std::string k = full(key);
  EtcdTxn txn;
  txn.success.push_back(EtcdOp::put(k, ""));
  txn.success.push_back(EtcdOp::range(k));
  auto r = client_->txn(txn);
  if (!r.isOk()) fail("takeTicket", key, r.status());
  if (r.value().responses.size() != 2 || r.value().responses[1].kvs.empty()) {
    throw StoreError("etcd store takeTicket on key '" + key + "': the txn read nothing back");
  }
  return r.value().responses[1].kvs.front().version;
}

int64_t EtcdStore::tickets(const std::string& key) {
  auto current = client_->get(full(key));
  if (!current.isOk()) fail("tickets", key, current.status());
  return current.value() ? current.value()->version : 0;
}

void EtcdStore::append(const std::string& key, const Bytes& value) {
  update(key, "append", [&](const std::optional<std::string>& current) {
    return current.value_or("") + str(value);
  });
}

bool EtcdStore::deleteKey(const std::string& key) {
  auto r = client_->deleteKey(full(key));
  if (!r.isOk()) fail("deleteKey", key, r.status());
  return r.value() > 0;
}

int64_t EtcdStore::deletePrefix(const std::string& prefix) {
  EtcdTxn txn;
  txn.success.push_back(EtcdOp::remove(full(prefix), /*prefix=*/true));
  auto r = client_->txn(txn);
  if (!r.isOk()) fail("deletePrefix", prefix, r.status());
  return r.value().responses.empty() ? 0 : r.value().responses[0].deleted;
}

std::vector<std::optional<std::string>> EtcdStore::readAll(const std::vector<std::string>& keys,
                                                           const char* op) {
  std::vector<std::optional<std::string>> out;
  for (size_t start = 0; start < keys.size(); start += kMaxTxnOps) {
    EtcdTxn txn;
    for (size_t i = start; i < std::min(keys.size(), start + kMaxTxnOps); ++i) {
      txn.success.push_back(EtcdOp::range(full(keys[i])));
    }
    auto r = client_->txn(txn);
    if (!r.isOk()) fail(op, "", r.status());
    for (const auto& resp : r.value().responses) {
      out.push_back(resp.kvs.empty() ? std::nullopt
                                     : std::optional<std::string>(resp.kvs.front().value));
    }
  }
  return out;
}

bool EtcdStore::check(const std::vector<std::string>& keys) {
  for (const auto& v : readAll(keys, "check")) {
    if (!v) return false;
  }
  return true;
}

int64_t EtcdStore::numKeys() {
  auto r = client_->countPrefix(prefix_);
  if (!r.isOk()) fail("numKeys", "", r.status());
  return r.value();
}

// Keys that exist already cost one txn per kMaxTxnOps of them (not one read each); only those
// still missing are waited for one by one.
void EtcdStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  if (keys.size() == 1) {
    waitFor(full(keys.front()), deadline, timeout);
    return;
  }
  const auto present = readAll(keys, "wait");
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!present[i]) waitFor(full(keys[i]), deadline, timeout);
  }
}

// Reads first (one txn per kMaxTxnOps keys); only when some are missing, waits for them and
// reads again.
std::vector<Bytes> EtcdStore::multiGet(const std::vector<std::string>& keys) {
  auto timeout = this->timeout();
  auto deadline = Clock::now() + timeout;
  while (true) {
    const auto read = readAll(keys, "multiGet");
    std::vector<Bytes> values;
    std::vector<std::string> missing;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (read[i]) {
        values.push_back(bytes(*read[i]));
      } else {
        missing.push_back(keys[i]);
      }
    }
    if (missing.empty()) return values;
    for (const auto& k : missing) waitFor(full(k), deadline, timeout);
  }
}

void EtcdStore::multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  if (keys.size() != values.size()) {
    throw StoreError("etcd store multiSet: " + std::to_string(keys.size()) + " keys but " +
                     std::to_string(values.size()) + " values");
  }
  // etcd refuses a txn that puts one key twice; as in c10d, the last value wins.
  std::map<std::string, size_t> last;
  for (size_t i = 0; i < keys.size(); ++i) last[keys[i]] = i;
  std::vector<EtcdOp> puts;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (last[keys[i]] == i) puts.push_back(EtcdOp::put(full(keys[i]), str(values[i])));
  }
  for (size_t start = 0; start < puts.size(); start += kMaxTxnOps) {
    EtcdTxn txn;
    txn.success.assign(
        puts.begin() + static_cast<std::ptrdiff_t>(start),
        puts.begin() + static_cast<std::ptrdiff_t>(std::min(puts.size(), start + kMaxTxnOps)));
    auto r = client_->txn(txn);
    if (!r.isOk()) fail("multiSet", "", r.status());
  }
}

}  // namespace cpprun::rendezvous
