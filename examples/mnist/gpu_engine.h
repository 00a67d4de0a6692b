// The GPU engine: the trainer's arithmetic on one CUDA device, data parallel over NCCL.
//
// - The whole dataset (normalised) and the labels live on the device; a batch is gathered there
//   from the sample indices.
// - Matrix products are cuBLAS (float, or with `bf16` bfloat16 operands and float accumulation,
//   what Apex AMP's O1 did for these layers); im2col, bias + ReLU, pooling, dropout (the same
//   counter-based masks as the CPU engine), the loss and the optimizers are kernels here.
// - Gradients are all-reduced with NCCL (ncclAvg) in two buckets on a communication stream:
//   the fully connected layers' bucket starts, ordered by an event, as soon as their backward
//   pass is done and runs while the convolutions' backward continues on the compute stream.
// - NCCL's communicator comes from CPPRUN_NCCL_UNIQUE_ID (the id cpprun's agent made for this
//   attempt); without it rank 0 makes one and shares it through the store. Above
//   CPPRUN_NCCL_RANKS_PER_ID ranks the agents' CPPRUN_NCCL_UNIQUE_IDS go to
//   ncclCommInitRankScalable when the loaded NCCL has it (dlsym, >= 2.23).
// Built only when CMake finds nvcc and NCCL (CPPRUN_HAVE_CUDA); otherwise makeGpuEngine returns
// an error saying so. Thread safety: as TrainingEngine.
#pragma once

#include <memory>

#include "examples/mnist/engine.h"

namespace cpprun::mnist {

Result<std::unique_ptr<TrainingEngine>> makeGpuEngine(const EngineOptions& options,
                                                      const IdxDataset& train,
                                                      const IdxDataset& test, Communicator& comm);

// True when this build has the GPU engine.
bool gpuEngineBuilt();

// The CUDA devices this process sees (after CUDA_VISIBLE_DEVICES); 0 without the GPU engine,
// a driver or a device.
int visibleGpuCount();

}  // namespace cpprun::mnist
