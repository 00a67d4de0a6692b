// The GPU engine's own source, not a copy: examples/mnist/gpu_engine.cu compiled by the host
// C++ compiler, where gpu_runtime.h resolves the CUDA, cuBLAS, bfloat16 and NCCL names to the
// host emulation in examples/mnist/cuda_host/ (docs/mnist.md). Linked only into the tests'
// cpprun-mnist-emulated and gpu_emulation_tests, never into the production trainer.
#include "examples/mnist/gpu_engine.cu"  // NOLINT(bugprone-suspicious-include)
