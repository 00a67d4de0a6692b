#include "rendezvous/store_engine.h"

#include <algorithm>
#include <type_traits>
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

bool StoreEngine::exists(const std::string& key) const {
  if (data_.count(key) != 0) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

template <typename V>
void StoreEngine::storeImpl(const std::string& key, V&& value) {
  auto it = data_.find(key);
  if (!watchers_by_key_.empty()) {
    if (it == data_.end()) {
      notifyWatchers(key, wire::kWatchKeyCreated, {}, value);
    } else {
      notifyWatchers(key, wire::kWatchKeyUpdated, it->second, value);
    }
  }
  if (it == data_.end()) {
    data_.emplace(key, std::forward<V>(value));
  } else if constexpr (std::is_lvalue_reference_v<V>) {
    // A request's value is copied into the old value's storage: an overwrite of a key with a
    // value no longer than before allocates nothing.
    it->second.assign(value.begin(), value.end());
  } else {
    it->second = std::move(value);
  }
  wake(key);
}

void StoreEngine::store(const std::string& key, Bytes&& value) { storeImpl(key, std::move(value)); }
void StoreEngine::store(const std::string& key, const Bytes& value) { storeImpl(key, value); }

size_t StoreEngine::eraseKeysExcept(const std::string& keep_prefix) {
  size_t erased = 0;
  for (auto it = data_.begin(); it != data_.end();) {
    if (it->first.compare(0, keep_prefix.size(), keep_prefix) == 0) {
      ++it;
    } else {
      it = data_.erase(it);
      ++erased;
    }
  }
  erased += queues_.size();
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

bool StoreEngine::handle(ClientId client, Dialect dialect, const Request& r, std::string* error) {
  ++counters_.requests;
  Bytes& out = scratch_;
  out.clear();
  switch (r.type) {
    case QueryType::VALIDATE:
      if (r.u32 != wire::kValidationMagic) {
        *error = "VALIDATE with wrong magic";
        return false;
      }
      return true;

    case QueryType::PING:
      wire::appendU32(&out, r.u32);
      reply(client, out);
      return true;

    case QueryType::SET:
      store(r.keys[0], r.values[0]);
      return true;

    case QueryType::MULTI_SET:
      for (size_t i = 0; i < r.keys.size(); ++i) store(r.keys[i], r.values[i]);
      return true;

    case QueryType::APPEND: {
      auto it = data_.find(r.keys[0]);
      if (it == data_.end()) {
        store(r.keys[0], r.values[0]);
      } else {
        Bytes updated = it->second;
        updated.insert(updated.end(), r.values[0].begin(), r.values[0].end());
        store(r.keys[0], std::move(updated));
      }
      return true;
    }

    case QueryType::COMPARE_SET: {
      const std::string& key = r.keys[0];
      const Bytes& expected = r.values[0];
      const Bytes& desired = r.values[1];
      auto it = data_.find(key);
      if (it == data_.end()) {
        if (expected.empty()) {
          store(key, desired);
          wire::appendBytes(&out, desired);
        } else {
          wire::appendBytes(&out, expected);  // torch's documented "lie"
        }
      } else if (it->second == expected) {
        store(key, desired);
        wire::appendBytes(&out, desired);
      } else {
        wire::appendBytes(&out, it->second);
      }
      reply(client, out);
      return true;
    }

    case QueryType::GET: {
      auto it = data_.find(r.keys[0]);
      if (it == data_.end()) {
        if (dialect != Dialect::kV2) {  // torch 1.13 and 2.1 servers throw: map::at
          *error = "GET of missing key";
          return false;
        }
        wire::appendU64(&out, 0);
      } else {
        wire::appendBytes(&out, it->second);
      }
      reply(client, out);
      return true;
    }

    case QueryType::MULTI_GET: {
      // One request may name an 8 MiB value 131,072 times: size the reply before building it.
      size_t size = 0;
      for (const auto& k : r.keys) {
        auto it = data_.find(k);
        size += 8 + (it == data_.end() ? 0 : it->second.size());
      }
      if (!outbox_->roomFor(client, size)) return true;
      for (const auto& k : r.keys) {
        auto it = data_.find(k);
        if (it == data_.end()) {
          wire::appendU64(&out, 0);
        } else {
          wire::appendBytes(&out, it->second);
        }
      }
      reply(client, out);
      return true;
    }

    case QueryType::ADD: {
      const std::string& key = r.keys[0];
      int64_t value = r.integer;
      auto it = data_.find(key);
      if (it != data_.end()) {
        int64_t current = 0;
        if (!wire::parseCounter(it->second, &current)) {
          *error = "ADD on a value that is not a decimal integer";
          return false;
        }
        value =
            static_cast<int64_t>(static_cast<uint64_t>(current) + static_cast<uint64_t>(r.integer));
      }
      store(key, wire::formatCounter(value));
      wire::appendI64(&out, value);
      reply(client, out);
      return true;
    }

    case QueryType::CHECK: {
      bool all = std::all_of(r.keys.begin(), r.keys.end(),
                             [&](const std::string& k) { return exists(k); });
      replyByte(client, all ? wire::kCheckReady : wire::kCheckNotReady);
      return true;
    }

    case QueryType::WAIT:
      registerWait(client, r.keys, wire::kWaitStopWaiting);
      return true;

    case QueryType::CANCEL_WAIT:
      cancelWaits(client);
      replyByte(client, wire::kWaitCanceled);
      return true;

    case QueryType::GETNUMKEYS:
      wire::appendI64(&out, static_cast<int64_t>(data_.size()));
      reply(client, out);
      return true;

    case QueryType::DELETE_KEY: {
      auto it = data_.find(r.keys[0]);
      int64_t erased = 0;
      if (it != data_.end()) {
        notifyWatchers(r.keys[0], wire::kWatchKeyDeleted, it->second, {});
        data_.erase(it);
        erased = 1;
      }
      wire::appendI64(&out, erased);
      reply(client, out);
      return true;
    }

    case QueryType::WATCH_KEY:
      watchers_by_key_[r.keys[0]].push_back(client);
      watches_by_client_[client].push_back(r.keys[0]);
      replyByte(client, wire::kWatchCallbackRegistered);
      return true;

    case QueryType::QUEUE_PUSH:
      queues_[r.keys[0]].push_back(r.values[0]);
      wake(r.keys[0], /*one_only=*/true);
      return true;

    case QueryType::QUEUE_POP: {
      auto it = queues_.find(r.keys[0]);
      int64_t len = it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size());
      wire::appendI64(&out, len);
      if (len > 0) {
        wire::appendBytes(&out, it->second.front());
        it->second.pop_front();
        if (it->second.empty()) queues_.erase(it);
      }
      reply(client, out);
      return true;
    }

    case QueryType::QUEUE_LEN: {
      auto it = queues_.find(r.keys[0]);
      wire::appendI64(&out, it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size()));
      reply(client, out);
      return true;
    }

    case QueryType::LIST_KEYS: {
      size_t size = 8;
      for (const auto& kv : data_) size += 8 + kv.first.size();
      if (!outbox_->roomFor(client, size)) return true;
      wire::appendU64(&out, data_.size());
      for (const auto& kv : data_) wire::appendString(&out, kv.first);
      reply(client, out);
      return true;
    }

    case QueryType::BARRIER: {
      const std::string& key = r.keys[0];
      int64_t count = 1;
      auto it = data_.find(key);
      if (it != data_.end()) {
        int64_t current = 0;
        if (!wire::parseCounter(it->second, &current)) {
          *error = "BARRIER on a key whose value is not a decimal integer";
          return false;
        }
        count = current + 1;
      }
      store(key, wire::formatCounter(count));
      if (count >= r.integer) {
        replyByte(client, wire::kWaitStopWaiting);
        auto w = barrier_waiters_.find(key);
        if (w != barrier_waiters_.end()) {
          for (ClientId c : w->second) replyByte(c, wire::kWaitStopWaiting);
          barrier_waiters_.erase(w);
        }
      } else {
        barrier_waiters_[key].push_back(client);
      }
      return true;
    }
  }
  *error = "unhandled query type";
  return false;
}

}  // namespace cpprun::rendezvous
