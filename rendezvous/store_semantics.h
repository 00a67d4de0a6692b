// The store's semantics, written once: the key map with its values and the rules of ADD,
// COMPARE_SET and APPEND. The TCP server's StoreEngine and MemoryStore keep their keys in a
// KeyValueMap; EtcdStore (whose keys live in etcd) and the TCP client's legacy append (a
// compareSet loop against a server without APPEND) apply the same rules through the free
// functions below, so a rule and its error text change in one place.
//
// Rules (c10d's, see docs/protocol.md):
//   - ADD keeps a decimal counter, created at 0; adding to a value that is not decimal text (as
//     std::stoll reads it) is an error; the sum wraps around like torch's.
//   - COMPARE_SET stores `desired` when the key holds `expected`, or is missing and `expected`
//     is empty; a missing key with a non-empty `expected` stores nothing and answers `expected`
//     (c10d's documented "lie"); otherwise the answer is the current value.
//   - APPEND extends the value in place (created when missing); repeated appends cost amortised
//     time linear in what they add, never a copy of the old value.
//
// Thread safety: none; the owner (an event loop, or MemoryStore's mutex) serialises access.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace cpprun::rendezvous {

using Bytes = std::vector<uint8_t>;

// ADD: `current` (nullptr: absent) plus `delta`, or nullopt when `current` is not a counter.
std::optional<int64_t> addToCounter(const Bytes* current, int64_t delta);
// The error of an ADD (or BARRIER) on a value that is not a counter; `op` names the operation.
std::string notACounterError(const char* op, const std::string& key);

// COMPARE_SET's decision for a key holding `current` (nullptr: absent).
enum class CompareSetAction {
  kStore,           // store `desired` and answer it
  kAnswerExpected,  // missing key, non-empty expected: store nothing, answer `expected`
  kAnswerCurrent,   // mismatch: store nothing, answer the current value
};
CompareSetAction compareSetAction(const Bytes* current, const Bytes& expected);
// What COMPARE_SET's `answer` tells a client that sent `expected` and `desired` (REQUIRES:
// expected != desired): stored; not stored because the key is absent (the answer is `expected`
// while the key is missing); or not stored because the key holds `answer`.
enum class CompareSetOutcome { kStored, kAbsent, kHolds };
CompareSetOutcome compareSetOutcome(const Bytes& answer, const Bytes& expected,
                                    const Bytes& desired);

// APPEND in place: grows the capacity geometrically (at least doubling), so N appends of one
// byte move O(N) bytes in total.
void appendInPlace(Bytes* value, const uint8_t* data, size_t size);
inline void appendInPlace(Bytes* value, const Bytes& suffix) {
  appendInPlace(value, suffix.data(), suffix.size());
}

// The key map every in-process store keeps, with the rules above applied to it.
class KeyValueMap {
 public:
  using Map = std::unordered_map<std::string, Bytes>;

  // nullptr when absent. The pointer is valid until the key is erased or the map rehashes.
  const Bytes* find(const std::string& key) const {
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : &it->second;
  }
  bool contains(const std::string& key) const { return map_.count(key) != 0; }
  size_t size() const { return map_.size(); }
  const Map& entries() const { return map_; }

  // An overwrite with a value no longer than the old one reuses its storage.
  void set(const std::string& key, const Bytes& value);
  void set(const std::string& key, Bytes&& value);
  // Returns the new counter value, or nullopt (nothing changed) when the value is not one.
  std::optional<int64_t> add(const std::string& key, int64_t delta);
  // Returns whether `desired` was stored; *answer is what a client is told (see the rules): it
  // points at `expected`, `desired` or the stored value, so it lives as long as they do.
  bool compareSet(const std::string& key, const Bytes& expected, const Bytes& desired,
                  const Bytes** answer);
  void append(const std::string& key, const Bytes& suffix);
  // True when the key existed.
  bool erase(const std::string& key) { return map_.erase(key) != 0; }
  // Removes every key that does not start with `keep_prefix`; returns how many.
  size_t eraseExcept(const std::string& keep_prefix);
  // Removes every key that starts with `prefix`; returns how many.
  size_t erasePrefix(const std::string& prefix);

 private:
  Map map_;
};

}  // namespace cpprun::rendezvous
