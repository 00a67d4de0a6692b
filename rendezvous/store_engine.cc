#include "rendezvous/store_engine.h"

#include <algorithm>
#include <utility>

namespace cpprun::rendezvous {

using wire::Bytes;
using wire::Dialect;
using wire::QueryType;
using wire::Request;

namespace {

template <typename T>
void eraseValue(std::vector<T>* v, const T& value) {
  v->erase(std::remove(v->begin(), v->end(), value), v->end());
}

}  // namespace

bool StoreEngine::handle(ClientId client, Dialect dialect, const Request& r, std::string* error) {
  ++counters_.requests;
  const Call c{client, dialect, r, error};
  // clang-format off
  switch (r.type) {
    case QueryType::VALIDATE: return onValidate(c);
    case QueryType::PING: return onPing(c);
    case QueryType::SET: return onSet(c);
    case QueryType::MULTI_SET: return onMultiSet(c);
    case QueryType::APPEND: return onAppend(c);
    case QueryType::COMPARE_SET: return onCompareSet(c);
    case QueryType::GET: return onGet(c);
    case QueryType::MULTI_GET: return onMultiGet(c);
    case QueryType::ADD: return onAdd(c);
    case QueryType::CHECK: return onCheck(c);
    case QueryType::WAIT: return onWait(c);
    case QueryType::CANCEL_WAIT: return onCancelWait(c);
    case QueryType::GETNUMKEYS: return onGetNumKeys(c);
    case QueryType::DELETE_KEY: return onDeleteKey(c);
    case QueryType::WATCH_KEY: return onWatchKey(c);
    case QueryType::QUEUE_PUSH: return onQueuePush(c);
    case QueryType::QUEUE_POP: return onQueuePop(c);
    case QueryType::QUEUE_LEN: return onQueueLen(c);
    case QueryType::LIST_KEYS: return onListKeys(c);
    case QueryType::BARRIER: return onBarrier(c);
  }
  // clang-format on
  *error = "unhandled query type";
  return false;
}

// --- the operations ----------------------------------------------------------------------------

bool StoreEngine::onValidate(const Call& c) {
  if (c.r.u32 == wire::kValidationMagic) return true;
  *c.error = "VALIDATE with wrong magic";
  return false;
}

bool StoreEngine::onPing(const Call& c) {
  replyU32(c.client, c.r.u32);
  return true;
}

bool StoreEngine::onSet(const Call& c) {
  store(c.r.keys[0], c.r.values[0]);
  return true;
}

bool StoreEngine::onMultiSet(const Call& c) {
  for (size_t i = 0; i < c.r.keys.size(); ++i) store(c.r.keys[i], c.r.values[i]);
  return true;
}

bool StoreEngine::onAppend(const Call& c) {
  const std::string& key = c.r.keys[0];
  const Prior prior = beforeWrite(key);
  data_.append(key, c.r.values[0]);  // in place: the old value is not copied
  afterWrite(key, prior);
  return true;
}

bool StoreEngine::onCompareSet(const Call& c) {
  const std::string& key = c.r.keys[0];
  const Bytes& expected = c.r.values[0];
  const Bytes& desired = c.r.values[1];
  const Bytes* current = data_.find(key);
  if (compareSetAction(current, expected) == CompareSetAction::kStore) {
    store(key, desired);
    replyValue(c.client, desired);
  } else {
    replyValue(c.client, current == nullptr ? expected : *current);
  }
  return true;
}

bool StoreEngine::onGet(const Call& c) {
  const Bytes* value = data_.find(c.r.keys[0]);
  if (value == nullptr && c.dialect != Dialect::kV2) {
    *c.error = "GET of missing key";  // torch 1.13 and 2.1 servers throw: map::at
    return false;
  }
  if (value == nullptr) {
    replyI64(c.client, 0);  // an empty value
  } else {
    replyValue(c.client, *value);
  }
  return true;
}

bool StoreEngine::onMultiGet(const Call& c) {
  // One request may name an 8 MiB value 131,072 times: size the reply before building it.
  size_t size = 0;
  for (const auto& k : c.r.keys) {
    const Bytes* value = data_.find(k);
    size += 8 + (value == nullptr ? 0 : value->size());
  }
  if (!outbox_->roomFor(c.client, size)) return true;
  Bytes& out = scratch_;
  out.clear();
  for (const auto& k : c.r.keys) {
    const Bytes* value = data_.find(k);
    if (value == nullptr) {
      wire::appendU64(&out, 0);
    } else {
      wire::appendBytes(&out, *value);
    }
  }
  reply(c.client, out);
  return true;
}

bool StoreEngine::onAdd(const Call& c) {
  const std::string& key = c.r.keys[0];
  const Prior prior = beforeWrite(key);
  const std::optional<int64_t> value = data_.add(key, c.r.integer);
  if (!value) {
    *c.error = notACounterError("ADD", key);
    return false;
  }
  afterWrite(key, prior);
  replyI64(c.client, *value);
  return true;
}

bool StoreEngine::onCheck(const Call& c) {
  const bool all = std::all_of(c.r.keys.begin(), c.r.keys.end(),
                               [&](const std::string& k) { return exists(k); });
  replyByte(c.client, all ? wire::kCheckReady : wire::kCheckNotReady);
  return true;
}

bool StoreEngine::onWait(const Call& c) {
  registerWait(c.client, c.r.keys, wire::kWaitStopWaiting);
  return true;
}

bool StoreEngine::onCancelWait(const Call& c) {
  cancelWaits(c.client);
  replyByte(c.client, wire::kWaitCanceled);
  return true;
}

bool StoreEngine::onGetNumKeys(const Call& c) {
  replyI64(c.client, static_cast<int64_t>(data_.size()));
  return true;
}

bool StoreEngine::onDeleteKey(const Call& c) {
  const std::string& key = c.r.keys[0];
  const Bytes* value = data_.find(key);
  if (value != nullptr) notifyWatchers(key, wire::kWatchKeyDeleted, *value, {});
  replyI64(c.client, data_.erase(key) ? 1 : 0);
  return true;
}

bool StoreEngine::onWatchKey(const Call& c) {
  watchers_by_key_[c.r.keys[0]].push_back(c.client);
  watches_by_client_[c.client].push_back(c.r.keys[0]);
  replyByte(c.client, wire::kWatchCallbackRegistered);
  return true;
}

bool StoreEngine::onQueuePush(const Call& c) {
  queues_[c.r.keys[0]].push_back(c.r.values[0]);
  wake(c.r.keys[0], /*one_only=*/true);
  return true;
}

bool StoreEngine::onQueuePop(const Call& c) {
  // Reply: i64 length, then the head when the queue was not empty.
  auto it = queues_.find(c.r.keys[0]);
  const int64_t len = it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size());
  Bytes& out = scratch_;
  out.clear();
  wire::appendI64(&out, len);
  if (len > 0) {
    wire::appendBytes(&out, it->second.front());
    it->second.pop_front();
    if (it->second.empty()) queues_.erase(it);
  }
  reply(c.client, out);
  return true;
}

bool StoreEngine::onQueueLen(const Call& c) {
  auto it = queues_.find(c.r.keys[0]);
  replyI64(c.client, it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size()));
  return true;
}

bool StoreEngine::onListKeys(const Call& c) {
  size_t size = 8;
  for (const auto& kv : data_.entries()) size += 8 + kv.first.size();
  if (!outbox_->roomFor(c.client, size)) return true;
  Bytes& out = scratch_;
  out.clear();
  wire::appendU64(&out, data_.size());
  for (const auto& kv : data_.entries()) wire::appendString(&out, kv.first);
  reply(c.client, out);
  return true;
}

bool StoreEngine::onBarrier(const Call& c) {
  const std::string& key = c.r.keys[0];
  const Prior prior = beforeWrite(key);
  const std::optional<int64_t> count = data_.add(key, 1);
  if (!count) {
    *c.error = notACounterError("BARRIER", key);
    return false;
  }
  afterWrite(key, prior);
  if (*count < c.r.integer) {
    barrier_waiters_[key].push_back(c.client);
    return true;
  }
  replyByte(c.client, wire::kWaitStopWaiting);
  auto w = barrier_waiters_.find(key);
  if (w != barrier_waiters_.end()) {
    for (ClientId waiter : w->second) replyByte(waiter, wire::kWaitStopWaiting);
    barrier_waiters_.erase(w);
  }
  return true;
}

// --- replies -----------------------------------------------------------------------------------

void StoreEngine::replyU32(ClientId client, uint32_t v) {
  scratch_.clear();
  wire::appendU32(&scratch_, v);
  reply(client, scratch_);
}

void StoreEngine::replyI64(ClientId client, int64_t v) {
  scratch_.clear();
  wire::appendI64(&scratch_, v);
  reply(client, scratch_);
}

void StoreEngine::replyValue(ClientId client, const Bytes& value) {
  scratch_.clear();
  wire::appendBytes(&scratch_, value);
  reply(client, scratch_);
}

// --- keys, waits and watches -------------------------------------------------------------------

bool StoreEngine::exists(const std::string& key) const {
  if (data_.contains(key)) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

StoreEngine::Prior StoreEngine::beforeWrite(const std::string& key) const {
  Prior prior;
  if (watchers_by_key_.empty() || watchers_by_key_.count(key) == 0) return prior;
  prior.watched = true;
  const Bytes* value = data_.find(key);
  prior.existed = value != nullptr;
  if (value != nullptr) prior.value = *value;
  return prior;
}

void StoreEngine::afterWrite(const std::string& key, const Prior& prior) {
  if (prior.watched) {
    notifyWatchers(key, prior.existed ? wire::kWatchKeyUpdated : wire::kWatchKeyCreated,
                   prior.value, *data_.find(key));
  }
  wake(key);
}

template <typename V>
void StoreEngine::store(const std::string& key, V&& value) {
  const Prior prior = beforeWrite(key);
  data_.set(key, std::forward<V>(value));
  afterWrite(key, prior);
}

void StoreEngine::localSet(const std::string& key, Bytes value) { store(key, std::move(value)); }

size_t StoreEngine::eraseKeysExcept(const std::string& keep_prefix) {
  size_t erased = data_.eraseExcept(keep_prefix) + queues_.size();
  queues_.clear();
  return erased;
}
void StoreEngine::wake(const std::string& key, bool one_only) {
  auto it = waiters_by_key_.find(key);
  if (it == waiters_by_key_.end()) return;
  std::vector<WaitId> ids;
  if (one_only) {
    // The first wait that is still live (cancelled ones linger until pruned).
    auto& list = it->second;
    while (!list.empty() && ids.empty()) {
      if (waits_.count(list.front()) != 0) ids.push_back(list.front());
      list.erase(list.begin());
    }
    if (list.empty()) waiters_by_key_.erase(it);
  } else {
    ids = std::move(it->second);
    waiters_by_key_.erase(it);
  }
  for (WaitId id : ids) {
    auto w = waits_.find(id);
    if (w == waits_.end()) continue;
    if (--w->second.missing > 0) continue;
    ClientId client = w->second.client;
    uint8_t code = w->second.reply;
    waits_.erase(w);
    auto& mine = waits_by_client_[client];
    eraseValue(&mine, id);
    if (mine.empty()) waits_by_client_.erase(client);
    ++counters_.waits_woken;
    replyByte(client, code);
  }
}

void StoreEngine::notifyWatchers(const std::string& key, uint8_t event, const Bytes& old_value,
                                 const Bytes& new_value) {
  auto it = watchers_by_key_.find(key);
  if (it == watchers_by_key_.end()) return;
  Bytes msg;
  wire::appendU8(&msg, event);
  wire::appendString(&msg, key);
  wire::appendBytes(&msg, old_value);
  wire::appendBytes(&msg, new_value);
  for (ClientId c : it->second) reply(c, msg);
}

void StoreEngine::registerWait(ClientId client, const std::vector<std::string>& keys,
                               uint8_t code) {
  // Fast path, and the common one: every key exists, nothing is allocated.
  size_t first_missing = 0;
  while (first_missing < keys.size() && exists(keys[first_missing])) ++first_missing;
  if (first_missing == keys.size()) {
    replyByte(client, code);
    return;
  }
  PendingWait wait{client, 0, code, {}};
  std::unordered_set<std::string> seen;  // only for long key lists
  for (size_t i = first_missing; i < keys.size(); ++i) {
    const std::string& k = keys[i];
    if (exists(k)) continue;
    bool duplicate;
    if (wait.keys.size() < 16) {
      duplicate = std::find(wait.keys.begin(), wait.keys.end(), k) != wait.keys.end();
    } else {
      if (seen.empty()) seen.insert(wait.keys.begin(), wait.keys.end());
      duplicate = !seen.insert(k).second;
    }
    if (!duplicate) wait.keys.push_back(k);
  }
  WaitId id = next_wait_id_++;
  for (const auto& k : wait.keys) waiters_by_key_[k].push_back(id);
  wait.missing = wait.keys.size();
  waits_.emplace(id, std::move(wait));
  waits_by_client_[client].push_back(id);
  ++counters_.waits_deferred;
}

void StoreEngine::cancelWaits(ClientId client) {
  for (auto b = barrier_waiters_.begin(); b != barrier_waiters_.end();) {
    eraseValue(&b->second, client);
    b = b->second.empty() ? barrier_waiters_.erase(b) : std::next(b);
  }
  auto it = waits_by_client_.find(client);
  if (it == waits_by_client_.end()) return;
  for (WaitId id : it->second) {
    auto w = waits_.find(id);
    if (w == waits_.end()) continue;
    for (const auto& key : w->second.keys) {
      auto list = waiters_by_key_.find(key);
      if (list == waiters_by_key_.end()) continue;
      eraseValue(&list->second, id);
      if (list->second.empty()) waiters_by_key_.erase(list);
    }
    waits_.erase(w);
  }
  waits_by_client_.erase(it);
}

void StoreEngine::disconnect(ClientId client) {
  cancelWaits(client);
  auto w = watches_by_client_.find(client);
  if (w != watches_by_client_.end()) {
    for (const auto& key : w->second) {
      auto& list = watchers_by_key_[key];
      eraseValue(&list, client);
      if (list.empty()) watchers_by_key_.erase(key);
    }
    watches_by_client_.erase(w);
  }
}

}  // namespace cpprun::rendezvous
