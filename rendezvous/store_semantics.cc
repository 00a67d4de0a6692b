#include "rendezvous/store_semantics.h"

#include <algorithm>

#include "rendezvous/wire.h"

namespace cpprun::rendezvous {

std::optional<int64_t> addToCounter(const Bytes* current, int64_t delta) {
  if (current == nullptr) return delta;
  int64_t value = 0;
  if (!wire::parseCounter(*current, &value)) return std::nullopt;
  return static_cast<int64_t>(static_cast<uint64_t>(value) + static_cast<uint64_t>(delta));
}

std::string notACounterError(const char* op, const std::string& key) {
  return std::string(op) + " on key '" + key + "' whose value is not a decimal integer";
}

CompareSetAction compareSetAction(const Bytes* current, const Bytes& expected) {
  if (current == nullptr) {
    return expected.empty() ? CompareSetAction::kStore : CompareSetAction::kAnswerExpected;
  }
  return *current == expected ? CompareSetAction::kStore : CompareSetAction::kAnswerCurrent;
}

CompareSetOutcome compareSetOutcome(const Bytes& answer, const Bytes& expected,
                                    const Bytes& desired) {
  if (answer == desired) return CompareSetOutcome::kStored;
  // A key holding `expected` would have taken `desired`, so an answer of `expected` is the
  // missing-key answer.
  if (answer == expected) return CompareSetOutcome::kAbsent;
  return CompareSetOutcome::kHolds;
}

void appendInPlace(Bytes* value, const uint8_t* data, size_t size) {
  const size_t needed = value->size() + size;
  if (needed > value->capacity()) value->reserve(std::max(needed, 2 * value->capacity()));
  value->insert(value->end(), data, data + size);
}

void KeyValueMap::set(const std::string& key, const Bytes& value) {
  auto it = map_.find(key);
  if (it == map_.end()) {
    map_.emplace(key, value);
  } else {
    it->second.assign(value.begin(), value.end());
  }
}

void KeyValueMap::set(const std::string& key, Bytes&& value) {
  auto it = map_.find(key);
  if (it == map_.end()) {
    map_.emplace(key, std::move(value));
  } else {
    it->second = std::move(value);
  }
}

std::optional<int64_t> KeyValueMap::add(const std::string& key, int64_t delta) {
  auto it = map_.find(key);
  auto value = addToCounter(it == map_.end() ? nullptr : &it->second, delta);
  if (value) set(key, wire::formatCounter(*value));
  return value;
}

bool KeyValueMap::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired,
                             const Bytes** answer) {
  auto it = map_.find(key);
  const Bytes* current = it == map_.end() ? nullptr : &it->second;
  switch (compareSetAction(current, expected)) {
    case CompareSetAction::kStore:
      set(key, desired);
      *answer = &desired;
      return true;
    case CompareSetAction::kAnswerExpected:
      *answer = &expected;
      return false;
    case CompareSetAction::kAnswerCurrent:
      break;
  }
  *answer = current;
  return false;
}

void KeyValueMap::append(const std::string& key, const Bytes& suffix) {
  auto it = map_.find(key);
  if (it == map_.end()) {
    map_.emplace(key, suffix);
  } else {
    appendInPlace(&it->second, suffix);
  }
}

size_t KeyValueMap::erasePrefix(const std::string& prefix) {
  size_t erased = 0;
  for (auto it = map_.begin(); it != map_.end();) {
    if (it->first.compare(0, prefix.size(), prefix) == 0) {
      it = map_.erase(it);
      ++erased;
    } else {
      ++it;
    }
  }
  return erased;
}

size_t KeyValueMap::eraseExcept(const std::string& keep_prefix) {
  size_t erased = 0;
  for (auto it = map_.begin(); it != map_.end();) {
    if (it->first.compare(0, keep_prefix.size(), keep_prefix) == 0) {
      ++it;
    } else {
      it = map_.erase(it);
      ++erased;
    }
  }
  return erased;
}

}  // namespace cpprun::rendezvous
