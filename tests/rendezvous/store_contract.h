// The Store contract (rendezvous/store.h), written once and run over every Store implementation:
// set/get with binary, empty and large values, add in decimal text, compareSet's four cases,
// check/deleteKey/numKeys, wait, a blocking get woken by another handle, get timing out,
// multiGet/multiSet/append, concurrent adds never lost.
//
// Use: a test file describes its store kinds in a factory (MakeStoreKinds: the servers or
// clusters it starts, and how to open handles on them) and registers the contract once, at
// namespace scope:
//   const bool kRegistered = registerStoreContract("etcd store ", "[etcd]", &etcdKinds);
// That adds one Catch test case per contract case (named name_prefix + the case's name, with the
// given tags, located at the case's line in store_contract.cc). Each test case calls the
// factory once (fresh servers, fresh data) and runs the case over every kind in order, each
// kind with two handles of its own under its own key prefix; a failure names the kind.
//
// Why a registering function over a factory rather than TEMPLATE_TEST_CASE with a fixture type
// per kind: the kinds live in two test binaries (EtcdStore needs cpprun::etcd and a real etcd,
// and its cases carry the [etcd] tag CI filters by; the memory and TCP kinds must run without
// it), and a TEMPLATE_TEST_CASE lists its types where it is written, so each binary would repeat
// every case's registration. A type per kind would also start one etcd cluster per kind per case;
// the factory starts one per case for all kinds (and Catch sections would restart it per kind).
//
// Where the kinds really differ, StoreKind says so and the contract checks each kind against
// what it says (nothing is skipped):
//   - numKeys: the whole store (MemoryStore, TcpStoreClient, PrefixStore over them: c10d) or
//     only the keys under the store's own prefix (EtcdStore and a PrefixStore over it).
//   - how many adds each thread makes in the concurrency case (etcd's compare-and-swap round
//     trips cost about 100 times a TCP store's).
// What a timeout throws does not differ: every kind throws StoreTimeout from get and wait, after
// at least the timeout and well within 5 s of it.
//
// Thread safety: registerStoreContract runs during static initialisation (one thread); the
// contract cases drive each handle from several threads, as the Store contract allows.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "rendezvous/store.h"

namespace cpprun::testing {

// What numKeys() counts.
enum class NumKeysScope {
  kWholeStore,  // every key in the backing store, whatever its prefix (c10d)
  kOwnPrefix,   // only the keys under this store's own prefix
};

// One kind of Store under the contract.
struct StoreKind {
  std::string name;  // shown with every failure, e.g. "PrefixStore(TcpStoreClient)"
  // Opens a new handle on this kind's shared data. Two calls give two handles that behave like
  // two agents: their own connection or client where the kind has one.
  std::function<std::shared_ptr<rendezvous::Store>()> open;
  // Opens a handle on the same backing store outside this kind's namespace (the store another
  // job would use): its keys are counted by numKeys() under kWholeStore, not under kOwnPrefix.
  std::function<std::shared_ptr<rendezvous::Store>()> open_elsewhere;
  NumKeysScope num_keys = NumKeysScope::kWholeStore;
  int adds_per_thread = 200;  // in "concurrent adds ... are never lost" (8 threads)
};

// The kinds of one test case and what keeps their servers alive while it runs.
struct StoreKinds {
  std::shared_ptr<void> servers;  // destroyed after the kinds' handles
  std::vector<StoreKind> kinds;
};

// Starts fresh servers and describes the kinds on them. May throw or fail a REQUIRE when a
// server cannot start: the test case then fails.
using MakeStoreKinds = std::function<StoreKinds()>;

// Registers one Catch test case per contract case (see the file comment). Returns true, so it can
// initialise a namespace-scope constant. REQUIRES: called once per binary per name_prefix (Catch
// refuses two test cases of one name).
bool registerStoreContract(const std::string& name_prefix, const std::string& tags,
                           MakeStoreKinds make_kinds);

}  // namespace cpprun::testing
