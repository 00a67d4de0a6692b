#include "rendezvous/memory_store.h"

namespace cpprun::rendezvous {

void MemoryStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    data_.set(key, value);
  }
  changed_.notify_all();
}

Bytes MemoryStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  std::unique_lock<std::mutex> lock(mutex_);
  const Bytes* answer = nullptr;
  const bool stored = data_.compareSet(key, expected, desired, &answer);
  Bytes result = *answer;
  lock.unlock();
  if (stored) changed_.notify_all();
  return result;
}

void MemoryStore::waitLocked(std::unique_lock<std::mutex>& lock,
                             const std::vector<std::string>& keys,
                             std::chrono::milliseconds timeout) {
  auto ready = [&] {
    for (const auto& k : keys) {
      if (!data_.contains(k)) return false;
    }
    return true;
  };
  if (!changed_.wait_for(lock, timeout, ready)) {
    throw StoreTimeout("wait for " + std::to_string(keys.size()) + " key(s) timed out after " +
                       std::to_string(timeout.count()) + " ms");
  }
}

Bytes MemoryStore::get(const std::string& key) {
  std::unique_lock<std::mutex> lock(mutex_);
  waitLocked(lock, {key}, timeout());
  return *data_.find(key);
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  std::optional<int64_t> value;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    value = data_.add(key, delta);
  }
  if (!value) throw StoreError(notACounterError("add", key));
  changed_.notify_all();
  return *value;
}

bool MemoryStore::deleteKey(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  return data_.erase(key);
}

int64_t MemoryStore::deletePrefix(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(data_.erasePrefix(prefix));
}

bool MemoryStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& k : keys) {
    if (!data_.contains(k)) return false;
  }
  return true;
}

int64_t MemoryStore::numKeys() {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(data_.size());
}

void MemoryStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  waitLocked(lock, keys, timeout);
}

std::vector<Bytes> MemoryStore::multiGet(const std::vector<std::string>& keys) {
  std::unique_lock<std::mutex> lock(mutex_);
  waitLocked(lock, keys, timeout());
  std::vector<Bytes> values;
  values.reserve(keys.size());
  for (const auto& k : keys) values.push_back(*data_.find(k));
  return values;
}

void MemoryStore::multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  if (keys.size() != values.size()) {
    throw StoreError("multiSet: " + std::to_string(keys.size()) + " keys but " +
                     std::to_string(values.size()) + " values");
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < keys.size(); ++i) data_.set(keys[i], values[i]);
  }
  changed_.notify_all();
}

void MemoryStore::append(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    data_.append(key, value);
  }
  changed_.notify_all();
}

}  // namespace cpprun::rendezvous
