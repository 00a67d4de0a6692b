// GlooStore: gloo's rendezvous::Store over a cpprun Store — in the trainer, the TCP store the
// agent serves at MASTER_ADDR:MASTER_PORT — with every key under a prefix, so gloo's
// rendezvous keys never meet anyone else's.
//
// Unlike gloo's base class, wait(keys, timeout) honours the timeout: it throws
// gloo::IoException naming the keys still missing and the bound, so a rank whose peer never
// comes fails with a clear error instead of hanging. get() waits (with the default timeout)
// like gloo's own stores.
// Thread safety: as the underlying Store (TcpStoreClient serialises its calls).
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "rendezvous/store.h"

namespace cpprun::mnist {

class GlooStore : public gloo::rendezvous::Store {
 public:
  GlooStore(std::shared_ptr<rendezvous::Store> store, std::string prefix,
            std::chrono::milliseconds default_timeout = kDefaultTimeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::string full(const std::string& key) const { return prefix_ + key; }

  std::shared_ptr<rendezvous::Store> store_;
  std::string prefix_;
  std::chrono::milliseconds default_timeout_;
};

}  // namespace cpprun::mnist
