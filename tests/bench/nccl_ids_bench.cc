// nccl_ids_bench: what NCCL bootstrap at scale (agent/nccl/nccl_id_groups.h,
// CPPRUN_NCCL_UNIQUE_IDS) costs the agents and the workers, against the single id, for 1,024 to
// 16,384 simulated ranks (8 per node, 256 per id by default). No GPU and no NCCL here: ids come
// from the library given with --nccl-library (default: the tests' stand-in NCCL), so the figure for
// making ids is the agent's own work around ncclGetUniqueId, not NCCL's (which opens a socket and a
// thread).
//
// Per world size it measures, each as the median of --runs runs of --reps repetitions:
//   make     one agent making all nId ids (dlopen'd ncclGetUniqueId + hex) and joining them;
//            peer: the one id of today
//   exchange one agent's part of the multi-node exchange through a real TCP store on loopback:
//            the owners' ids are already set; wait for the nId keys + one multiGet;
//            peer: the one get of the single id (carried today by the attempt's go)
//   parse    a worker turning CPPRUN_NCCL_UNIQUE_IDS into nId 128-byte ids; peer: one id
//   get      a worker reading cpprun/nccl_unique_ids from the store; peer: cpprun/nccl_unique_id
// and prints the size of the variable. Output: a table, then one line per figure:
//   RESULT <name>_<ranks> <value> us peer=<value> ratio=<x>
// Thread safety: single-threaded program (the store server runs on its own thread).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "agent/nccl/nccl_id_groups.h"
#include "agent/nccl/nccl_unique_id.h"
#include "common/command_line.h"
#include "rendezvous/tcp_store_client.h"
#include "rendezvous/tcp_store_server.h"

using namespace cpprun;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  std::string library = std::string(CPPRUN_STAND_IN_DIR) + "/nccl/libnccl.so.2";
  int runs = 5;
  int reps = 50;
  int ranks_per_node = 8;
  int ranks_per_id = agent::kDefaultNcclRanksPerId;
  std::vector<int> worlds = {1024, 2048, 4096, 8192, 16384};
};

// Median over `runs` of the mean microseconds of `reps` calls of f.
double medianMicros(const Options& o, const std::function<void()>& f) {
  std::vector<double> runs;
  for (int r = 0; r < o.runs; ++r) {
    const auto start = Clock::now();
    for (int i = 0; i < o.reps; ++i) f();
    runs.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count() /
                   o.reps);
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

std::vector<std::string> makeIds(agent::NcclUniqueIdProvider& nccl, int count) {
  std::vector<std::string> ids;
  for (int i = 0; i < count; ++i) {
    auto id = nccl.next();
    if (!id.isOk()) {
      std::fprintf(stderr, "ncclGetUniqueId: %s\n", id.status().message().c_str());
      std::exit(1);
    }
    ids.push_back(id.value());
  }
  return ids;
}

// A worker's decoding of the ids into 128-byte ncclUniqueIds.
size_t decode(const std::string& text) {
  auto ids = agent::splitNcclIds(text);
  if (!ids.isOk()) std::exit(1);
  size_t checksum = 0;
  unsigned char bytes[128];
  for (const auto& hex : ids.value()) {
    for (size_t i = 0; i < sizeof bytes; ++i) {
      bytes[i] =
          static_cast<unsigned char>(std::strtoul(hex.substr(2 * i, 2).c_str(), nullptr, 16));
    }
    checksum += bytes[0];
  }
  return checksum;
}

struct Figure {
  std::string name;
  double value;
  double peer;
};

std::vector<Figure> measureWorld(const Options& o, int world, agent::NcclUniqueIdProvider& nccl,
                                 rendezvous::Store& store) {
  const int nid = agent::ncclIdCount(world, o.ranks_per_id);
  const std::string prefix = "bench/" + std::to_string(world) + "/nccl_ids/";
  const std::vector<std::string> ids = makeIds(nccl, nid);
  for (int i = 0; i < nid; ++i) store.set(prefix + std::to_string(i), ids[static_cast<size_t>(i)]);
  const std::string joined = agent::joinNcclIds(ids);
  store.set(agent::kNcclUniqueIdsKey, joined);
  store.set("cpprun/nccl_unique_id", ids[0]);
  const std::vector<int> node_ranks(static_cast<size_t>(world / o.ranks_per_node),
                                    o.ranks_per_node);
  // A node owning no id: its part is the wait and the read (owners' ids already set).
  const int reader = node_ranks.size() > 1 ? 1 : 0;
  volatile size_t sink = 0;
  std::vector<Figure> f;
  f.push_back({"make",
               medianMicros(o, [&] { sink = agent::joinNcclIds(makeIds(nccl, nid)).size(); }),
               medianMicros(o, [&] { sink = makeIds(nccl, 1).size(); })});
  auto no_make = []() -> Result<std::string> { return internalError("not an owner"); };
  f.push_back({"exchange",
               medianMicros(o,
                            [&] {
                              auto got =
                                  agent::exchangeNcclIds(store, prefix, node_ranks, reader, nid,
                                                         no_make, std::chrono::seconds(10));
                              if (!got.isOk()) std::exit(1);
                              sink = got.value().size();
                            }),
               medianMicros(o, [&] { sink = store.get("cpprun/nccl_unique_id").size(); })});
  f.push_back({"parse", medianMicros(o, [&] { sink = decode(joined); }),
               medianMicros(o, [&] { sink = decode(ids[0]); })});
  f.push_back({"get", medianMicros(o, [&] { sink = store.get(agent::kNcclUniqueIdsKey).size(); }),
               medianMicros(o, [&] { sink = store.get("cpprun/nccl_unique_id").size(); })});
  (void)sink;
  return f;
}

[[noreturn]] void usage(const std::string& why, int code = 2) {
  if (!why.empty()) std::fprintf(stderr, "nccl_ids_bench: %s\n", why.c_str());
  std::fprintf(code == 0 ? stdout : stderr,
               "usage: nccl_ids_bench [--nccl-library PATH] [--runs N] [--reps N] "
               "[--ranks-per-id N]\n");
  std::exit(code);
}

// A count flag's value in [1, max], or usage() naming the flag and the text.
int countValue(const std::string& flag, const std::string& text, uint64_t max) {
  Result<uint64_t> n = parseUnsigned(flag, text, 1, max);
  if (!n.isOk()) usage(n.status().message());
  return static_cast<int>(n.value());
}

Options parse(int argc, char** argv) {
  Options o;
  OptionCursor args(argc, argv);
  while (args.next()) {
    const std::string flag = args.name();
    if (flag == "--help" || flag == "-h") usage("", 0);
    if (!args.isOption()) usage("unexpected argument " + flag);
    Result<std::string> value = args.value();
    if (!value.isOk()) usage(value.status().message());
    const std::string& v = value.value();
    if (flag == "--nccl-library") {
      o.library = v;
    } else if (flag == "--runs") {
      o.runs = countValue(flag, v, 1000);
    } else if (flag == "--reps") {
      o.reps = countValue(flag, v, 1'000'000);
    } else if (flag == "--ranks-per-id") {
      o.ranks_per_id = countValue(flag, v, 1'000'000);
    } else {
      usage("unknown flag " + flag);
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  auto nccl = agent::NcclUniqueIdProvider::create(o.library);
  if (!nccl.isOk()) {
    std::fprintf(stderr, "%s\n", nccl.status().message().c_str());
    return 1;
  }
  auto server = rendezvous::BackgroundTcpStoreServer::start({});
  if (!server.isOk()) {
    std::fprintf(stderr, "store: %s\n", server.status().message().c_str());
    return 1;
  }
  rendezvous::TcpStoreClientOptions co;
  co.port = server.value()->port();
  rendezvous::TcpStoreClient store(co);
  std::printf("NCCL ids (%s), %d ranks per id, %d ranks per node; median of %d runs x %d reps\n",
              o.library.c_str(), o.ranks_per_id, o.ranks_per_node, o.runs, o.reps);
  std::printf("%8s %5s %9s  %-9s %11s %11s %7s\n", "ranks", "nId", "env bytes", "figure",
              "scalable us", "single us", "ratio");
  std::vector<std::string> results;
  for (int world : o.worlds) {
    const int nid = agent::ncclIdCount(world, o.ranks_per_id);
    for (const Figure& f : measureWorld(o, world, *nccl.value(), store)) {
      std::printf("%8d %5d %9d  %-9s %11.2f %11.2f %7.1f\n", world, nid, nid * 257 - 1,
                  f.name.c_str(), f.value, f.peer, f.value / f.peer);
      char line[200];
      std::snprintf(line, sizeof line, "RESULT nccl_ids_%s_%d %.2f us peer=%.2f ratio=%.1f",
                    f.name.c_str(), world, f.value, f.peer, f.value / f.peer);
      results.push_back(line);
    }
  }
  for (const auto& line : results) std::printf("%s\n", line.c_str());
  return 0;
}
