// makeGpuEngine for builds without CUDA and NCCL (CPPRUN_HAVE_CUDA off).
#include "examples/mnist/gpu_engine.h"

namespace cpprun::mnist {

Result<std::unique_ptr<TrainingEngine>> makeGpuEngine(const EngineOptions&, const IdxDataset&,
                                                      const IdxDataset&, Communicator&) {
  return Status(StatusCode::kInvalidArgument,
                "--device cuda: this cpprun-mnist was built without CUDA and NCCL (configure "
                "with -DCPPRUN_CUDA=ON where nvcc and NCCL are installed)");
}

bool gpuEngineBuilt() { return false; }

int visibleGpuCount() { return 0; }

}  // namespace cpprun::mnist
