#include "examples/mnist/gloo_store.h"

#include <gloo/common/error.h>

namespace cpprun::mnist {

GlooStore::GlooStore(std::shared_ptr<rendezvous::Store> store, std::string prefix,
                     std::chrono::milliseconds default_timeout)
    : store_(std::move(store)), prefix_(std::move(prefix)), default_timeout_(default_timeout) {}

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  try {
    store_->set(full(key), rendezvous::Bytes(data.begin(), data.end()));
  } catch (const rendezvous::StoreError& e) {
    throw gloo::IoException("gloo rendezvous: set " + full(key) + ": " + e.what());
  }
}

std::vector<char> GlooStore::get(const std::string& key) {
  wait({key}, default_timeout_);
  try {
    rendezvous::Bytes value = store_->get(full(key));
    return std::vector<char>(value.begin(), value.end());
  } catch (const rendezvous::StoreError& e) {
    throw gloo::IoException("gloo rendezvous: get " + full(key) + ": " + e.what());
  }
}

void GlooStore::wait(const std::vector<std::string>& keys) { wait(keys, default_timeout_); }

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  std::vector<std::string> full_keys;
  full_keys.reserve(keys.size());
  for (const std::string& k : keys) full_keys.push_back(full(k));
  try {
    store_->wait(full_keys, timeout);
  } catch (const rendezvous::StoreTimeout&) {
    std::string missing;
    for (const std::string& k : full_keys) {
      bool present = false;
      try {
        present = store_->check({k});
      } catch (const rendezvous::StoreError&) {
      }
      if (!present) missing += (missing.empty() ? "" : ", ") + k;
    }
    throw gloo::IoException("gloo rendezvous: keys not set within " +
                            std::to_string(timeout.count()) + " ms: " + missing +
                            " (a peer rank did not reach the rendezvous)");
  } catch (const rendezvous::StoreError& e) {
    throw gloo::IoException(std::string("gloo rendezvous: ") + e.what());
  }
}

}  // namespace cpprun::mnist
