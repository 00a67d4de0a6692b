#include "rendezvous/store_engine.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "rendezvous/store_auth.h"

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
  if (!secret_.empty() && r.type != QueryType::CPPRUN_AUTH && !authenticated_.count(client)) {
    if (const std::string* key = protectedWrite(r)) {
      ++refused_unauthenticated_;
      *error = "a write of \"" + key->substr(0, 200) +
               "\" from a connection that did not prove the job's secret (docs/security.md)";
      return false;
    }
  }
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
    case QueryType::CPPRUN_AUTH: return onCpprunAuth(c);
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

void StoreEngine::requireAuthentication(std::string secret) {
  secret_ = std::move(secret);
  localSet(kAuthRequiredKey, wire::Bytes(kAuthScheme, kAuthScheme + std::strlen(kAuthScheme)));
}

bool StoreEngine::onCpprunAuth(const Call& c) {
  const std::string& step = c.r.keys[0];
  const Bytes& data = c.r.values[0];
  if (secret_.empty()) {
    // No secret: nothing to prove; an empty reply says so (a client with a secret then refuses
    // this store).
    answer(c, wire::ReplyFields::ofValue(wire::ByteView()));
    return true;
  }
  if (step == kAuthHello && data.size() == kAuthNonceBytes) {
    std::string client_nonce(data.begin(), data.end());
    std::string server_nonce = randomBytes(kAuthNonceBytes);
    const std::string reply = server_nonce + serverProof(secret_, client_nonce, server_nonce);
    auth_nonces_[c.client] = {std::move(client_nonce), std::move(server_nonce)};
    answer(c, wire::ReplyFields::ofValue(reply));
    return true;
  }
  const auto nonces = auth_nonces_.find(c.client);
  if (step == kAuthProof && nonces != auth_nonces_.end()) {
    const std::string expected = clientProof(secret_, nonces->second.first, nonces->second.second);
    auth_nonces_.erase(nonces);
    if (proofsEqual(std::string(data.begin(), data.end()), expected)) {
      authenticated_.insert(c.client);
      static const std::string kOk = "ok";
      answer(c, wire::ReplyFields::ofValue(kOk));
      return true;
    }
  }
  ++refused_unauthenticated_;
  *c.error = "authentication failed (" +
             std::string(step == kAuthProof ? "a wrong proof" : "a malformed step") +
             ": the client does not hold the job's secret)";
  return false;
}

bool StoreEngine::onPing(const Call& c) {
  answer(c, wire::ReplyFields::ofU32(c.r.u32));
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
    answer(c, wire::ReplyFields::ofValue(desired));
  } else {
    answer(c, wire::ReplyFields::ofValue(current == nullptr ? expected : *current));
  }
  return true;
}

bool StoreEngine::onGet(const Call& c) {
  const Bytes* value = data_.find(c.r.keys[0]);
  if (value == nullptr && c.dialect != Dialect::kV2) {
    *c.error = "GET of missing key";  // torch 1.13 and 2.1 servers throw: map::at
    return false;
  }
  // Absent (torch >= 2.2 only): an empty value.
  answer(c, wire::ReplyFields::ofValue(value == nullptr ? wire::ByteView() : *value));
  return true;
}

bool StoreEngine::onMultiGet(const Call& c) {
  // One request may name an 8 MiB value 131,072 times: answerSized checks the reply's size
  // against the client's budget before building it.
  items_.clear();
  for (const auto& k : c.r.keys) {
    const Bytes* value = data_.find(k);
    items_.push_back(value == nullptr ? wire::ByteView() : *value);
  }
  answerSized(c, wire::ReplyFields::ofItems(items_));
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
  answer(c, wire::ReplyFields::ofInteger(*value));
  return true;
}

bool StoreEngine::onCheck(const Call& c) {
  const bool all = std::all_of(c.r.keys.begin(), c.r.keys.end(),
                               [&](const std::string& k) { return exists(k); });
  answer(c, wire::ReplyFields::ofByte(all ? wire::kCheckReady : wire::kCheckNotReady));
  return true;
}

bool StoreEngine::onWait(const Call& c) {
  registerWait(c.client, c.r.keys);
  return true;
}

bool StoreEngine::onCancelWait(const Call& c) {
  cancelWaits(c.client);
  answer(c, wire::ReplyFields::ofByte(wire::kWaitCanceled));
  return true;
}

bool StoreEngine::onGetNumKeys(const Call& c) {
  answer(c, wire::ReplyFields::ofInteger(static_cast<int64_t>(data_.size())));
  return true;
}

bool StoreEngine::onDeleteKey(const Call& c) {
  const std::string& key = c.r.keys[0];
  const Bytes* value = data_.find(key);
  if (value != nullptr) notifyWatchers(key, wire::kWatchKeyDeleted, *value, {});
  answer(c, wire::ReplyFields::ofInteger(data_.erase(key) ? 1 : 0));
  return true;
}

bool StoreEngine::onWatchKey(const Call& c) {
  watchers_by_key_[c.r.keys[0]].push_back(c.client);
  watches_by_client_[c.client].push_back(c.r.keys[0]);
  answer(c, wire::ReplyFields::ofByte(wire::kWatchCallbackRegistered));
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
  if (len == 0) {
    answer(c, wire::ReplyFields::ofInteger(0));
    return true;
  }
  answer(c, wire::ReplyFields::ofInteger(len, it->second.front()));
  it->second.pop_front();
  if (it->second.empty()) queues_.erase(it);
  return true;
}

bool StoreEngine::onQueueLen(const Call& c) {
  auto it = queues_.find(c.r.keys[0]);
  answer(c, wire::ReplyFields::ofInteger(
                it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size())));
  return true;
}

bool StoreEngine::onListKeys(const Call& c) {
  items_.clear();
  for (const auto& kv : data_.entries()) items_.push_back(kv.first);
  answerSized(c, wire::ReplyFields::ofItems(items_));
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
  answer(c, wire::ReplyFields::ofByte(wire::kWaitStopWaiting));
  auto w = barrier_waiters_.find(key);
  if (w != barrier_waiters_.end()) {
    for (ClientId waiter : w->second) {
      answerLater(waiter, QueryType::BARRIER, wire::ReplyFields::ofByte(wire::kWaitStopWaiting));
    }
    barrier_waiters_.erase(w);
  }
  return true;
}

// --- replies: every one in the shape the wire table gives its operation -------------------------

void StoreEngine::answerLater(ClientId client, QueryType type, const wire::ReplyFields& fields) {
  scratch_.clear();
  wire::encodeReply(wire::operation(type).reply, fields, &scratch_);
  outbox_->send(client, scratch_);
}

void StoreEngine::answerSized(const Call& c, const wire::ReplyFields& fields) {
  const size_t size = wire::replySize(wire::operation(c.r.type).reply, fields);
  if (outbox_->roomFor(c.client, size)) answer(c, fields);
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
    waits_.erase(w);
    auto& mine = waits_by_client_[client];
    eraseValue(&mine, id);
    if (mine.empty()) waits_by_client_.erase(client);
    ++counters_.waits_woken;
    answerLater(client, QueryType::WAIT, wire::ReplyFields::ofByte(wire::kWaitStopWaiting));
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
  for (ClientId c : it->second) outbox_->send(c, msg);
}

void StoreEngine::registerWait(ClientId client, const std::vector<std::string>& keys) {
  // Fast path, and the common one: every key exists, nothing is allocated.
  size_t first_missing = 0;
  while (first_missing < keys.size() && exists(keys[first_missing])) ++first_missing;
  if (first_missing == keys.size()) {
    answerLater(client, QueryType::WAIT, wire::ReplyFields::ofByte(wire::kWaitStopWaiting));
    return;
  }
  PendingWait wait{client, 0, {}};
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
  auth_nonces_.erase(client);
  authenticated_.erase(client);
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
