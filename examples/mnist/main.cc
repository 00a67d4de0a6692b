// cpprun-mnist: the bundled data-parallel MNIST trainer. Reads the environment cpprun (or
// torchrun) injects — RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_RESTART_COUNT, OMP_NUM_THREADS — and trains on CPUs with gloo, meeting its peers
// through the agent's TCP store. Run alone it trains as world size 1.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>
#include <thread>

#include "common/command_line.h"
#include "common/logging.h"
#include "examples/mnist/communicator.h"
#include "examples/mnist/network.h"
#include "examples/mnist/optimizer.h"
#include "examples/mnist/trainer.h"

#ifndef CPPRUN_MNIST_DEFAULT_DATA
#define CPPRUN_MNIST_DEFAULT_DATA "examples/mnist/data"
#endif
#ifndef CPPRUN_VERSION
#define CPPRUN_VERSION "0"
#endif

namespace {

using namespace cpprun;
using namespace cpprun::mnist;

constexpr int kUsageError = 2;

const char* kHelp = R"(Usage: cpprun-mnist [options]

Trains PyTorch's MNIST example network data-parallel. Under cpprun (or torchrun) every worker
is one rank: `cpprun --nproc-per-node=4 cpprun-mnist --epochs 5`. Alone, it is world size 1.

Data and model:
  --data DIR             MNIST-format IDX files (train-/t10k-images-idx3-ubyte[.gz] and labels);
                         default: the shipped digits (PREFIX/share/cpprun/mnist when
                         installed, else the source tree's examples/mnist/data)
  --model cnn|mlp        the example's conv net (default) or a small MLP for quick runs
Training:
  --epochs N             default 14, as the example
  --batch-size N         per rank, default 64
  --test-batch-size N    default 1000
  --optimizer NAME       adadelta (default, lr 1.0), sgd (momentum 0.9, lr 0.01), adamw (lr 1e-3)
  --lr X                 learning rate (default: the optimizer's)
  --gamma X              StepLR factor per epoch, default 0.7
  --scale-lr             multiply the learning rate by the world size
  --seed N               default 1
  --max-steps N          stop after N optimizer steps
  --threads N            BLAS threads per rank (default: OMP_NUM_THREADS, else CPUs / local ranks)
  --device auto|cpu|cuda where to compute. auto (default): cuda when this build has CUDA and
                         the rank sees a GPU, else cpu; one line says which. cuda: the GPU
                         LOCAL_RANK indexes in CUDA_VISIBLE_DEVICES, cuBLAS and kernels, NCCL
                         between ranks, the dataset on the device (builds with CUDA and NCCL)
  --bf16                 on the GPU engine: bfloat16 matrix products, float accumulation
Checkpoints and output:
  --checkpoint-dir DIR   rank 0 saves DIR/latest.ckpt after every epoch (atomically) and
                         DIR/final.ckpt at the end
  --resume               continue from DIR/latest.ckpt (implied when TORCHELASTIC_RESTART_COUNT > 0
                         or SLURM_RESTART_COUNT > 0)
  --metrics FILE         rank 0 appends JSON lines: epoch, step, loss, test_loss, accuracy, images/s
  --log-interval N       batches between progress lines, default 10
  --quiet                no progress lines
  --help, --version
Signals:
  SIGUSR1 (pre-emption warning): every rank stops after the same step, rank 0 writes
  DIR/latest.ckpt mid-epoch, and the process exits 138 (128 + SIGUSR1); --resume continues
  with the next batch
)";

int envInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long parsed = std::strtol(v, &end, 10);
  if (*end != '\0' || parsed < 0 || parsed > 1 << 20) {
    std::fprintf(stderr, "cpprun-mnist: environment variable %s=%s is not a number\n", name, v);
    std::exit(kUsageError);
  }
  return static_cast<int>(parsed);
}

// The shipped digits: next to an installed binary (PREFIX/share/cpprun/mnist, from `cmake
// --install` or the .deb, wherever it was unpacked), else in the source tree it was built from.
std::string defaultDataDir() {
  char exe[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    std::string dir(exe, static_cast<size_t>(n));
    dir = dir.substr(0, dir.rfind('/'));
    const std::string installed = dir + "/../share/cpprun/mnist";
    if (::access((installed + "/train-images-idx3-ubyte.gz").c_str(), R_OK) == 0) return installed;
  }
  return CPPRUN_MNIST_DEFAULT_DATA;
}

struct Parsed {
  TrainerOptions options;
  bool threads_given = false;
};

Result<Parsed> parseFlags(int argc, char** argv) {
  Parsed p;
  TrainerOptions& o = p.options;
  o.data_dir = defaultDataDir();
  OptionCursor cursor(argc, argv);
  auto number = [&](uint64_t max) -> Result<uint64_t> {
    const std::string flag = cursor.name();
    Result<std::string> v = cursor.value();
    if (!v.isOk()) return v.status();
    return parseUnsigned(flag, v.value(), max);
  };
  auto real = [&]() -> Result<float> {
    const std::string flag = cursor.name();
    Result<std::string> v = cursor.value();
    if (!v.isOk()) return v.status();
    char* end = nullptr;
    const float x = std::strtof(v.value().c_str(), &end);
    if (v.value().empty() || *end != '\0' || !(x > 0.0f) || !std::isfinite(x)) {
      return invalidArgument(flag + ": expected a positive number, got '" + v.value() + "'");
    }
    return x;
  };
#define CPPRUN_TAKE(var, expr)                \
  {                                           \
    auto taken = (expr);                      \
    if (!taken.isOk()) return taken.status(); \
    var = taken.value();                      \
  }
  while (cursor.next()) {
    const std::string name = cursor.name();
    if (!cursor.isOption()) return invalidArgument("unexpected argument '" + name + "'");
    if (name == "--help") {
      std::fputs(kHelp, stdout);
      std::exit(0);
    } else if (name == "--version") {
      std::printf("cpprun-mnist %s\n", CPPRUN_VERSION);
      std::exit(0);
    } else if (name == "--data") {
      CPPRUN_TAKE(o.data_dir, cursor.value());
    } else if (name == "--model") {
      CPPRUN_TAKE(o.model, cursor.value());
      if (o.model != "cnn" && o.model != "mlp") {
        return invalidArgument("--model: expected cnn or mlp, got '" + o.model + "'");
      }
    } else if (name == "--optimizer") {
      CPPRUN_TAKE(o.optimizer, cursor.value());
      if (!makeOptimizer(o.optimizer, 1).isOk()) {
        return invalidArgument("--optimizer: expected adadelta, sgd or adamw, got '" + o.optimizer +
                               "'");
      }
    } else if (name == "--epochs") {
      CPPRUN_TAKE(o.epochs, number(100000));
    } else if (name == "--batch-size") {
      CPPRUN_TAKE(o.batch_size, number(1 << 16));
      if (o.batch_size == 0) return invalidArgument("--batch-size: must be at least 1");
    } else if (name == "--test-batch-size") {
      CPPRUN_TAKE(o.test_batch_size, number(1 << 16));
      if (o.test_batch_size == 0) return invalidArgument("--test-batch-size: must be at least 1");
    } else if (name == "--lr") {
      float lr = 0;
      CPPRUN_TAKE(lr, real());
      o.learning_rate = lr;
    } else if (name == "--gamma") {
      CPPRUN_TAKE(o.gamma, real());
    } else if (name == "--scale-lr") {
      o.scale_lr = true;
    } else if (name == "--seed") {
      CPPRUN_TAKE(o.seed, number(UINT64_MAX));
    } else if (name == "--max-steps") {
      CPPRUN_TAKE(o.max_steps, number(INT64_MAX));
    } else if (name == "--threads") {
      CPPRUN_TAKE(o.threads, number(4096));
      if (o.threads == 0) return invalidArgument("--threads: must be at least 1");
      p.threads_given = true;
    } else if (name == "--device") {
      CPPRUN_TAKE(o.device, cursor.value());
      if (o.device != "auto" && o.device != "cpu" && o.device != "cuda") {
        return invalidArgument("--device: expected auto, cpu or cuda, got '" + o.device + "'");
      }
    } else if (name == "--bf16") {
      o.bf16 = true;
    } else if (name == "--checkpoint-dir") {
      CPPRUN_TAKE(o.checkpoint_dir, cursor.value());
    } else if (name == "--resume") {
      o.resume = true;
    } else if (name == "--metrics") {
      CPPRUN_TAKE(o.metrics_path, cursor.value());
    } else if (name == "--log-interval") {
      CPPRUN_TAKE(o.log_interval, number(1 << 30));
      if (o.log_interval == 0) return invalidArgument("--log-interval: must be at least 1");
    } else if (name == "--quiet") {
      o.quiet = true;
    } else {
      return invalidArgument("unknown option " + name + " (see --help)");
    }
  }
#undef CPPRUN_TAKE
  return p;
}

}  // namespace

// SIGUSR1 is the pre-emption warning (Slurm's --signal=USR1@SECONDS, forwarded by cpprun with
// --signals-to-handle=...,SIGUSR1): finish the step, checkpoint, exit 128+SIGUSR1.
namespace {
volatile sig_atomic_t g_stop_signal = 0;

void onStopSignal(int signo) { g_stop_signal = signo; }
}  // namespace

int main(int argc, char** argv) {
  setLogProgramName("cpprun-mnist");
  struct sigaction stop = {};
  stop.sa_handler = onStopSignal;
  stop.sa_flags = SA_RESTART;
  sigemptyset(&stop.sa_mask);
  ::sigaction(SIGUSR1, &stop, nullptr);
  Result<Parsed> parsed = parseFlags(argc, argv);
  if (!parsed.isOk()) {
    std::fprintf(stderr, "cpprun-mnist: %s\n", parsed.status().message().c_str());
    return kUsageError;
  }
  TrainerOptions options = parsed.value().options;
  const int rank = envInt("RANK", 0);
  const int world = envInt("WORLD_SIZE", 1);
  const int local_world = std::max(1, envInt("LOCAL_WORLD_SIZE", 1));
  const int restart = envInt("TORCHELASTIC_RESTART_COUNT", 0);
  if (world < 1 || rank >= world) {
    std::fprintf(stderr, "cpprun-mnist: RANK=%d is not below WORLD_SIZE=%d\n", rank, world);
    return kUsageError;
  }
  if (!parsed.value().threads_given) {
    const int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    options.threads = envInt("OMP_NUM_THREADS", std::max(1, cpus / local_world));
    if (options.threads == 0) options.threads = 1;
  }
  // A restart by the launcher, or a job Slurm requeued (after a pre-emption), continues.
  if (restart > 0 || envInt("SLURM_RESTART_COUNT", 0) > 0) options.resume = true;
  options.stop_requested = [] { return g_stop_signal != 0; };
  options.cuda_device = envInt("LOCAL_RANK", 0);
  if (options.bf16 && options.device == "cpu") {
    std::fprintf(stderr, "cpprun-mnist: --bf16 needs the GPU engine, not --device cpu\n");
    return kUsageError;
  }
  if (options.resume && options.checkpoint_dir.empty()) {
    std::fprintf(stderr,
                 "cpprun-mnist: resuming (restart %d) needs --checkpoint-dir; starting afresh\n",
                 restart);
  }

  try {
    std::unique_ptr<Communicator> comm;
    if (world == 1) {
      comm = makeSingleProcessCommunicator();
    } else {
      Result<std::unique_ptr<Communicator>> joined = makeGlooCommunicatorThroughMasterStore(
          rank, world, "cpprun-mnist/attempt_" + std::to_string(restart) + "/");
      if (!joined.isOk()) {
        std::fprintf(stderr, "cpprun-mnist: %s (run it under cpprun or torchrun)\n",
                     joined.status().message().c_str());
        return kUsageError;
      }
      comm = std::move(joined.value());
    }
    if (rank == 0 && !options.quiet) {
      std::printf(
          "cpprun-mnist: %s, %d rank(s), %d thread(s) each, model %s, optimizer %s, data %s\n",
          comm->describe().c_str(), world, options.threads, options.model.c_str(),
          options.optimizer.c_str(), options.data_dir.c_str());
    }
    Result<TrainResult> result = train(options, *comm);
    if (!result.isOk()) {
      std::fprintf(stderr, "cpprun-mnist: rank %d: %s\n", rank, result.status().message().c_str());
      return 1;
    }
    if (result.value().preempted) {
      std::fprintf(stderr, "cpprun-mnist: rank %d: stopped by SIGUSR1 after step %lld; %s\n", rank,
                   static_cast<long long>(result.value().steps),
                   options.checkpoint_dir.empty()
                       ? "no --checkpoint-dir, so the progress is lost"
                       : "run again with --resume (or requeue) to continue from latest.ckpt");
      return 128 + SIGUSR1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cpprun-mnist: rank %d: %s\n", rank, e.what());
    return 1;
  }
}
