#include "examples/mnist/communicator.h"

#include <arpa/inet.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/collective_record.h"
#include "common/network_address.h"
#include "examples/mnist/gloo_store.h"
#include "rendezvous/tcp_store_client.h"

namespace cpprun::mnist {
namespace {

class SingleProcessCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int worldSize() const override { return 1; }
  void allreduceSum(float*, size_t) override {}
  void allreduceSum(double*, size_t) override {}
  void broadcast(float*, size_t, int) override {}
  void barrier() override {}
  void finish() override {}
  std::string describe() const override { return "single process"; }
};

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<rendezvous::Store> store, const GlooOptions& options)
      : store_(std::move(store)), options_(options) {
    GlooStore gloo_store(store_, options_.prefix + "gloo/", options_.timeout);
    gloo::transport::tcp::attr attr;
    attr.hostname = options_.hostname;
    device_ = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(options_.rank, options_.world_size);
    context->setTimeout(options_.timeout);
    context->connectFullMesh(gloo_store, device_);
    context_ = std::move(context);
  }

  int rank() const override { return options_.rank; }
  int worldSize() const override { return options_.world_size; }

  void allreduceSum(float* data, size_t count) override { allreduce(data, count); }
  void allreduceSum(double* data, size_t count) override { allreduce(data, count); }

  void broadcast(float* data, size_t count, int root) override {
    auto recorded = recorder_.enter("broadcast");
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(data, count);
    opts.setRoot(root);
    opts.setTag(nextTag());
    opts.setTimeout(options_.timeout);
    gloo::broadcast(opts);
  }

  void barrier() override {
    auto recorded = recorder_.enter("barrier");
    gloo::BarrierOptions opts(context_);
    opts.setTag(nextTag());
    opts.setTimeout(options_.timeout);
    gloo::barrier(opts);
  }

  void finish() override {
    if (finished_) return;
    finished_ = true;
    const std::string base = options_.prefix + "finished/";
    store_->set(base + std::to_string(options_.rank), rendezvous::toBytes("1"));
    std::vector<std::string> keys;
    for (int r = 0; r < options_.world_size; ++r) keys.push_back(base + std::to_string(r));
    store_->wait(keys, options_.timeout);
  }

  std::shared_ptr<rendezvous::Store> store() const override { return store_; }
  std::string keyPrefix() const override { return options_.prefix; }

  std::string describe() const override {
    return "gloo over TCP (" + options_.hostname + "), " + std::to_string(options_.world_size) +
           " ranks";
  }

 private:
  template <typename T>
  void allreduce(T* data, size_t count) {
    if (count == 0) return;
    auto recorded = recorder_.enter("all_reduce");
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, count);
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<T>));
    opts.setTag(nextTag());
    opts.setTimeout(options_.timeout);
    gloo::allreduce(opts);
  }

  uint32_t nextTag() { return tag_++; }

  std::shared_ptr<rendezvous::Store> store_;
  GlooOptions options_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  uint32_t tag_ = 0;
  bool finished_ = false;
  // What this rank waits in, for cpprun's hang verdict (common/collective_record.h).
  CollectiveRecorder recorder_ = CollectiveRecorder::fromEnvironment();
};

}  // namespace

std::unique_ptr<Communicator> makeSingleProcessCommunicator() {
  return std::make_unique<SingleProcessCommunicator>();
}

std::unique_ptr<Communicator> makeGlooCommunicator(std::shared_ptr<rendezvous::Store> store,
                                                   const GlooOptions& options) {
  return std::make_unique<GlooCommunicator>(std::move(store), options);
}

std::string localAddressTowards(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return "";
  std::string address;
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    char text[INET_ADDRSTRLEN] = {};
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text)) != nullptr) {
      address = text;
    }
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  return address;
}

Result<std::unique_ptr<Communicator>> makeGlooCommunicatorThroughMasterStore(
    int rank, int world_size, const std::string& prefix) {
  const char* addr = std::getenv("MASTER_ADDR");
  const char* port_text = std::getenv("MASTER_PORT");
  const Result<int> port = parsePort(port_text == nullptr ? "" : port_text, /*min_port=*/1);
  if (addr == nullptr || *addr == '\0' || !port.isOk()) {
    return invalidArgument("WORLD_SIZE=" + std::to_string(world_size) +
                           " needs MASTER_ADDR and MASTER_PORT (a port in 1..65535)" +
                           (port.isOk() ? "" : "; MASTER_PORT: " + port.status().message()));
  }
  rendezvous::TcpStoreClientOptions client;
  client.host = addr;
  client.port = static_cast<uint16_t>(port.value());
  client.connect_timeout = std::chrono::seconds(60);
  client.timeout = std::chrono::minutes(5);
  GlooOptions gloo;
  gloo.rank = rank;
  gloo.world_size = world_size;
  gloo.prefix = prefix;
  gloo.hostname = localAddressTowards(addr, static_cast<uint16_t>(port.value()));
  if (gloo.hostname.empty()) gloo.hostname = "127.0.0.1";
  return makeGlooCommunicator(std::make_shared<rendezvous::TcpStoreClient>(client), gloo);
}

}  // namespace cpprun::mnist
