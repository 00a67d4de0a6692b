#include "rendezvous/prefix_store.h"

#include "common/check.h"

namespace cpprun::rendezvous {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> inner)
    : prefix_(std::move(prefix)), inner_(std::move(inner)) {
  CPPRUN_CHECK(inner_ != nullptr);
  setTimeout(inner_->timeout());
}

std::vector<std::string> PrefixStore::join(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(join(k));
  return out;
}

void PrefixStore::set(const std::string& key, const Bytes& value) { inner_->set(join(key), value); }

Bytes PrefixStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  return inner_->compareSet(join(key), expected, desired);
}

Bytes PrefixStore::get(const std::string& key) {
  auto keys = std::vector<std::string>{join(key)};
  inner_->wait(keys, timeout());
  return inner_->multiGet(keys).at(0);
}

int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return inner_->add(join(key), delta);
}

int64_t PrefixStore::takeTicket(const std::string& key) { return inner_->takeTicket(join(key)); }

int64_t PrefixStore::tickets(const std::string& key) { return inner_->tickets(join(key)); }

bool PrefixStore::deleteKey(const std::string& key) { return inner_->deleteKey(join(key)); }

int64_t PrefixStore::deletePrefix(const std::string& prefix) {
  return inner_->deletePrefix(join(prefix));
}

bool PrefixStore::check(const std::vector<std::string>& keys) { return inner_->check(join(keys)); }

int64_t PrefixStore::numKeys() { return inner_->numKeys(); }

void PrefixStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  inner_->wait(join(keys), timeout);
}

std::vector<Bytes> PrefixStore::multiGet(const std::vector<std::string>& keys) {
  auto joined = join(keys);
  inner_->wait(joined, timeout());
  return inner_->multiGet(joined);
}

void PrefixStore::multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  inner_->multiSet(join(keys), values);
}

void PrefixStore::append(const std::string& key, const Bytes& value) {
  inner_->append(join(key), value);
}

}  // namespace cpprun::rendezvous
