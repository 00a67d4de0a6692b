#include "agent/nccl/nccl_id_groups.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "rendezvous/store.h"

namespace cpprun::agent {

namespace {
constexpr size_t kIdHexDigits = 256;  // 128 bytes of ncclUniqueId

bool isHexId(const std::string& id) {
  if (id.size() != kIdHexDigits) return false;
  for (char c : id) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}
}  // namespace

Result<int> ncclRanksPerId(const std::map<std::string, std::string>& env) {
  auto it = env.find(kNcclRanksPerIdVariable);
  if (it == env.end() || it->second.empty()) return kDefaultNcclRanksPerId;
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(it->second.c_str(), &end, 10);
  if (errno != 0 || end == it->second.c_str() || *end != '\0' || value < 0 ||
      value > 1'000'000'000) {
    return invalidArgument(std::string(kNcclRanksPerIdVariable) + "=" + it->second +
                           ": expected a number of ranks (0 turns the scalable ids off)");
  }
  return static_cast<int>(value);
}

int ncclIdCount(int world_size, int ranks_per_id) {
  if (ranks_per_id <= 0 || world_size <= ranks_per_id) return 1;
  return (world_size + ranks_per_id - 1) / ranks_per_id;
}

// NCCL's rule: the first nranks % nid ids get nranks / nid + 1 ranks each, the others one less.
int firstRankOfId(int id, int nranks, int nid) {
  const int per = nranks / nid;
  const int larger = nranks % nid;
  return id < larger ? id * (per + 1) : larger * (per + 1) + (id - larger) * per;
}

std::vector<int> ncclIdOwners(const std::vector<int>& node_ranks, int nid) {
  int world = 0;
  for (int n : node_ranks) world += n;
  std::vector<int> owners;
  owners.reserve(static_cast<size_t>(nid));
  size_t node = 0;
  int node_end = node_ranks.empty() ? 0 : node_ranks[0];  // one past the node's last rank
  for (int id = 0; id < nid; ++id) {
    const int first = firstRankOfId(id, world, nid);
    while (first >= node_end && node + 1 < node_ranks.size()) node_end += node_ranks[++node];
    owners.push_back(static_cast<int>(node));
  }
  return owners;
}

std::string joinNcclIds(const std::vector<std::string>& ids) {
  std::string text;
  text.reserve(ids.size() * (kIdHexDigits + 1));
  for (const auto& id : ids) {
    if (!text.empty()) text += ',';
    text += id;
  }
  return text;
}

Result<std::vector<std::string>> splitNcclIds(const std::string& text) {
  if (text.empty()) return invalidArgument("no NCCL ids: the list is empty");
  std::vector<std::string> ids;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    std::string id = text.substr(start, comma == std::string::npos ? comma : comma - start);
    if (!isHexId(id)) {
      return invalidArgument("NCCL id " + std::to_string(ids.size()) + " of the list is not " +
                             std::to_string(kIdHexDigits) + " hex digits (" +
                             std::to_string(id.size()) + " characters)");
    }
    ids.push_back(std::move(id));
    if (comma == std::string::npos) return ids;
    start = comma + 1;
  }
}

Result<std::vector<std::string>> exchangeNcclIds(
    rendezvous::Store& store, const std::string& prefix, const std::vector<int>& node_ranks,
    int node, int nid, const std::function<Result<std::string>()>& make_id,
    std::chrono::milliseconds timeout, const WaitForKeys& wait) {
  const std::vector<int> owners = ncclIdOwners(node_ranks, nid);
  std::vector<std::string> keys;
  keys.reserve(static_cast<size_t>(nid));
  for (int i = 0; i < nid; ++i) keys.push_back(prefix + std::to_string(i));
  for (int i = 0; i < nid; ++i) {
    if (owners[static_cast<size_t>(i)] != node) continue;
    Result<std::string> id = make_id();
    if (!id.isOk()) {
      const std::string why = "NCCL id " + std::to_string(i) + " of " + std::to_string(nid) +
                              " (made by node " + std::to_string(node) +
                              "): " + id.status().message();
      store.set(keys[static_cast<size_t>(i)], rendezvous::toBytes("!" + why));
      return unavailable(why);
    }
    store.set(keys[static_cast<size_t>(i)], rendezvous::toBytes(id.value()));
  }
  try {
    if (wait) {
      if (Status s = wait(keys); !s.isOk()) return s;
    } else {
      store.wait(keys, timeout);
    }
  } catch (const rendezvous::StoreTimeout&) {
    return timeoutError("the " + std::to_string(nid) + " NCCL ids under " + prefix +
                        " were not all made within " + std::to_string(timeout.count()) + " ms");
  }
  std::vector<std::string> ids;
  ids.reserve(static_cast<size_t>(nid));
  for (const auto& bytes : store.multiGet(keys)) {
    ids.push_back(rendezvous::toString(bytes));
    if (!ids.back().empty() && ids.back()[0] == '!') return unavailable(ids.back().substr(1));
  }
  return ids;
}

}  // namespace cpprun::agent
