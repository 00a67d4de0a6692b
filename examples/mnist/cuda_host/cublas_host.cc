// The emulated cuBLAS: each call is checked as cuBLAS documents, then queued on the handle's
// stream as the same column-major OpenBLAS call with the same arguments, so that a wrong
// transposition or leading dimension in the engine gives wrong numbers here as on a GPU.
#include <cblas.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "examples/mnist/cuda_host/cuda_host.h"

struct cublasContext {
  cudaStream_t stream = nullptr;
};

namespace {

bool validOperation(cublasOperation_t op) {
  return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C;
}

// Real matrices: conjugate transposition is transposition.
CBLAS_TRANSPOSE toCblas(cublasOperation_t op) {
  return op == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
}

// cublas<t>gemm's argument checks: dimensions not negative, lda >= max(1, rows of A as stored)
// where A is m x k under op N and k x m otherwise, likewise B (k x n), ldc >= max(1, m).
cublasStatus_t checkGemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                         int m, int n, int k, const void* alpha, int lda, int ldb, const void* beta,
                         int ldc) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!validOperation(transa) || !validOperation(transb) || m < 0 || n < 0 || k < 0 ||
      alpha == nullptr || beta == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const int a_rows = transa == CUBLAS_OP_N ? m : k;
  const int b_rows = transb == CUBLAS_OP_N ? k : n;
  if (lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) || ldc < std::max(1, m)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t queued(cudaError_t e) {
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

// Elements a column-major rows x columns matrix with leading dimension ld spans.
size_t spanned(int rows, int columns, int ld) {
  if (rows == 0 || columns == 0) return 0;
  return static_cast<size_t>(ld) * static_cast<size_t>(columns - 1) + static_cast<size_t>(rows);
}

}  // namespace

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the functionality requested is not supported";
  }
  return "unknown error";
}

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasContext();
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (stream == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *stream = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float* alpha,
                           const float* a, int lda, const float* b, int ldb, const float* beta,
                           float* c, int ldc) {
  if (cublasStatus_t s = checkGemm(handle, transa, transb, m, n, k, alpha, lda, ldb, beta, ldc);
      s != CUBLAS_STATUS_SUCCESS) {
    return s;
  }
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;  // cuBLAS returns at once
  const float alpha_value = *alpha;                    // host pointer mode: read at the call
  const float beta_value = *beta;
  return queued(cuda_host::enqueue(handle->stream, [=] {
    cblas_sgemm(CblasColMajor, toCblas(transa), toCblas(transb), m, n, k, alpha_value, a, lda, b,
                ldb, beta_value, c, ldc);
    return cudaSuccess;
  }));
}

cublasStatus_t cublasSgemv(cublasHandle_t handle, cublasOperation_t trans, int m, int n,
                           const float* alpha, const float* a, int lda, const float* x, int incx,
                           const float* beta, float* y, int incy) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!validOperation(trans) || m < 0 || n < 0 || lda < std::max(1, m) || incx == 0 || incy == 0 ||
      alpha == nullptr || beta == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  const float alpha_value = *alpha;
  const float beta_value = *beta;
  return queued(cuda_host::enqueue(handle->stream, [=] {
    cblas_sgemv(CblasColMajor, toCblas(trans), m, n, alpha_value, a, lda, x, incx, beta_value, y,
                incy);
    return cudaSuccess;
  }));
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* a, cudaDataType_t a_type, int lda, const void* b,
                            cudaDataType_t b_type, int ldb, const void* beta, void* c,
                            cudaDataType_t c_type, int ldc, cublasComputeType_t compute_type,
                            cublasGemmAlgo_t algo) {
  if (cublasStatus_t s = checkGemm(handle, transa, transb, m, n, k, alpha, lda, ldb, beta, ldc);
      s != CUBLAS_STATUS_SUCCESS) {
    return s;
  }
  if (a_type != CUDA_R_16BF || b_type != CUDA_R_16BF || c_type != CUDA_R_32F ||
      compute_type != CUBLAS_COMPUTE_32F || algo != CUBLAS_GEMM_DEFAULT) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  // CUBLAS_COMPUTE_32F: alpha and beta are floats.
  const float alpha_value = *static_cast<const float*>(alpha);
  const float beta_value = *static_cast<const float*>(beta);
  const auto* a16 = static_cast<const __nv_bfloat16*>(a);
  const auto* b16 = static_cast<const __nv_bfloat16*>(b);
  auto* c32 = static_cast<float*>(c);
  // What each operand spans as stored (rows x columns of A itself, not of op(A)).
  const size_t a_span = transa == CUBLAS_OP_N ? spanned(m, k, lda) : spanned(k, m, lda);
  const size_t b_span = transb == CUBLAS_OP_N ? spanned(k, n, ldb) : spanned(n, k, ldb);
  return queued(cuda_host::enqueue(handle->stream, [=] {
    // bf16 to float is exact, so the product is sgemm's on the same values: float sums of
    // bf16 operands, as the tensor cores compute them (up to the order of the sums).
    std::vector<float> a32(a_span);
    std::vector<float> b32(b_span);
    for (size_t i = 0; i < a_span; ++i) a32[i] = __bfloat162float(a16[i]);
    for (size_t i = 0; i < b_span; ++i) b32[i] = __bfloat162float(b16[i]);
    cblas_sgemm(CblasColMajor, toCblas(transa), toCblas(transb), m, n, k, alpha_value,
                a32.empty() ? nullptr : a32.data(), lda, b32.empty() ? nullptr : b32.data(), ldb,
                beta_value, c32, ldc);
    return cudaSuccess;
  }));
}
