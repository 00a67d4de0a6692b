// PrefixStore: a namespace inside another store. Key k becomes prefix + "/" + k, exactly as
// c10d's PrefixStore builds it, so keys match what PyTorch's workers put on the wire.
// numKeys() counts the whole underlying store, as c10d does.
// Ownership: shares the underlying store. Thread safety: as the underlying store.
#pragma once

#include <memory>

#include "rendezvous/store.h"

namespace cpprun::rendezvous {

class PrefixStore : public Store {
 public:
  using Store::set;
  using Store::wait;

  PrefixStore(std::string prefix, std::shared_ptr<Store> inner);

  void set(const std::string& key, const Bytes& value) override;
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  int64_t takeTicket(const std::string& key) override;
  int64_t tickets(const std::string& key) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t numKeys() override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  std::vector<Bytes> multiGet(const std::vector<std::string>& keys) override;
  void multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;
  void append(const std::string& key, const Bytes& value) override;
  int64_t deletePrefix(const std::string& prefix) override;

  const std::string& prefix() const { return prefix_; }
  Store& underlying() { return *inner_; }

 private:
  std::string join(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> join(const std::vector<std::string>& keys) const;

  std::string prefix_;
  std::shared_ptr<Store> inner_;
};

}  // namespace cpprun::rendezvous
