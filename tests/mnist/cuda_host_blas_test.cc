// The emulated cuBLAS against a naive triple loop: every transposition, non-square shapes and
// padded leading dimensions (padding must survive untouched), argument checks as cuBLAS
// documents them, alpha and beta read at the call, and gemmEx's bf16 operands.
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "examples/mnist/cuda_host/cuda_host.h"

namespace {

// A device copy of a host vector, freed at scope exit.
template <typename T>
class Device {
 public:
  explicit Device(const std::vector<T>& host) : size_(host.size()) {
    REQUIRE(cudaMalloc(&data_, size_ * sizeof(T)) == cudaSuccess);
    REQUIRE(cudaMemcpy(data_, host.data(), size_ * sizeof(T), cudaMemcpyHostToDevice) ==
            cudaSuccess);
  }
  ~Device() { cudaFree(data_); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  T* get() { return data_; }
  std::vector<T> download() const {
    std::vector<T> host(size_);
    REQUIRE(cudaMemcpy(host.data(), data_, size_ * sizeof(T), cudaMemcpyDeviceToHost) ==
            cudaSuccess);
    return host;
  }

 private:
  T* data_ = nullptr;
  size_t size_;
};

// Values exact in bf16 and in every float sum below: quarters in [-2, 2].
std::vector<float> quarters(size_t n, int seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>((static_cast<int>(i) * 7 + seed) % 17 - 8) * 0.25f;
  return v;
}

// Element (row, column) of op(X) for a column-major X with leading dimension ld.
float opAt(const std::vector<float>& x, cublasOperation_t op, int ld, int row, int column) {
  return op == CUBLAS_OP_N ? x[row + static_cast<size_t>(column) * ld]
                           : x[column + static_cast<size_t>(row) * ld];
}

// C = alpha op(A) op(B) + beta C, column-major, by the definition.
void naiveGemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
               const std::vector<float>& a, int lda, const std::vector<float>& b, int ldb,
               float beta, std::vector<float>& c, int ldc) {
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      float sum = 0.0f;
      for (int p = 0; p < k; ++p) sum += opAt(a, ta, lda, i, p) * opAt(b, tb, ldb, p, j);
      c[i + static_cast<size_t>(j) * ldc] =
          alpha * sum + beta * c[i + static_cast<size_t>(j) * ldc];
    }
  }
}

struct Handle {
  Handle() {
    REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cublasCreate(&blas) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasSetStream(blas, stream) == CUBLAS_STATUS_SUCCESS);
  }
  ~Handle() {
    cublasDestroy(blas);
    cudaStreamDestroy(stream);
  }
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
};

const char* name(cublasOperation_t op) {
  return op == CUBLAS_OP_N ? "N" : op == CUBLAS_OP_T ? "T" : "C";
}

}  // namespace

TEST_CASE("cuda_host cublasSgemm and cublasGemmEx equal the definition for every transposition",
          "[unit]") {
  const int m = 5, n = 3, k = 4;
  Handle h;
  for (cublasOperation_t ta : {CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_OP_C}) {
    for (cublasOperation_t tb : {CUBLAS_OP_N, CUBLAS_OP_T}) {
      for (bool bf16 : {false, true}) {
        INFO("op(A) " << name(ta) << ", op(B) " << name(tb)
                      << (bf16 ? ", bf16 gemmEx" : ", sgemm"));
        // A as stored: m x k under N, k x m under T; padded leading dimensions.
        const int a_rows = ta == CUBLAS_OP_N ? m : k, a_columns = ta == CUBLAS_OP_N ? k : m;
        const int b_rows = tb == CUBLAS_OP_N ? k : n, b_columns = tb == CUBLAS_OP_N ? n : k;
        const int lda = a_rows + 2, ldb = b_rows + 3, ldc = m + 1;
        const std::vector<float> a = quarters(static_cast<size_t>(lda) * a_columns, 1);
        const std::vector<float> b = quarters(static_cast<size_t>(ldb) * b_columns, 5);
        std::vector<float> c = quarters(static_cast<size_t>(ldc) * n, 9);
        std::vector<float> expected = c;
        const float alpha = 1.5f, beta = -0.5f;
        naiveGemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, expected, ldc);
        REQUIRE(expected != c);
        Device<float> dc(c);
        if (!bf16) {
          Device<float> da(a), db(b);
          REQUIRE(cublasSgemm(h.blas, ta, tb, m, n, k, &alpha, da.get(), lda, db.get(), ldb, &beta,
                              dc.get(), ldc) == CUBLAS_STATUS_SUCCESS);
          REQUIRE(cudaStreamSynchronize(h.stream) == cudaSuccess);
        } else {
          std::vector<__nv_bfloat16> a16, b16;
          for (float x : a) a16.push_back(__float2bfloat16(x));
          for (float x : b) b16.push_back(__float2bfloat16(x));
          Device<__nv_bfloat16> da(a16), db(b16);
          REQUIRE(cublasGemmEx(h.blas, ta, tb, m, n, k, &alpha, da.get(), CUDA_R_16BF, lda,
                               db.get(), CUDA_R_16BF, ldb, &beta, dc.get(), CUDA_R_32F, ldc,
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
          REQUIRE(cudaStreamSynchronize(h.stream) == cudaSuccess);
        }
        // Exact: quarters sum exactly; the padding rows of C are untouched.
        CHECK(dc.download() == expected);
      }
    }
  }
}

TEST_CASE("cuda_host cublasGemmEx rounds float data to bf16 before the product", "[unit]") {
  Handle h;
  // 1 + 2^-9 is not a bf16: it rounds (tie, even) to 1.
  const float one_and_a_bit = 1.0f + 1.0f / 512.0f;
  std::vector<__nv_bfloat16> a16 = {__float2bfloat16(one_and_a_bit)};
  std::vector<__nv_bfloat16> b16 = {__float2bfloat16(3.0f)};
  Device<__nv_bfloat16> da(a16), db(b16);
  Device<float> dc(std::vector<float>{0.0f});
  const float alpha = 1.0f, beta = 0.0f;
  REQUIRE(cublasGemmEx(h.blas, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &alpha, da.get(), CUDA_R_16BF, 1,
                       db.get(), CUDA_R_16BF, 1, &beta, dc.get(), CUDA_R_32F, 1, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
  // (Without this the null stream's copy may, and here does, run before the product.)
  REQUIRE(cudaStreamSynchronize(h.stream) == cudaSuccess);
  CHECK(dc.download() == std::vector<float>{3.0f});
}

TEST_CASE("cuda_host cublasSgemv equals the definition for both transpositions and strides",
          "[unit]") {
  const int m = 5, n = 3, lda = 7;
  Handle h;
  for (cublasOperation_t t : {CUBLAS_OP_N, CUBLAS_OP_T}) {
    for (int incx : {1, 2}) {
      for (int incy : {1, 3}) {
        INFO("op " << name(t) << ", incx " << incx << ", incy " << incy);
        const int x_len = t == CUBLAS_OP_N ? n : m, y_len = t == CUBLAS_OP_N ? m : n;
        const std::vector<float> a = quarters(static_cast<size_t>(lda) * n, 2);
        const std::vector<float> x = quarters(static_cast<size_t>(x_len) * incx, 4);
        std::vector<float> y = quarters(static_cast<size_t>(y_len) * incy, 6);
        const float alpha = 2.0f, beta = 0.25f;
        std::vector<float> expected = y;
        for (int i = 0; i < y_len; ++i) {
          float sum = 0.0f;
          for (int j = 0; j < x_len; ++j)
            sum += opAt(a, t, lda, i, j) * x[static_cast<size_t>(j) * incx];
          expected[static_cast<size_t>(i) * incy] =
              alpha * sum + beta * y[static_cast<size_t>(i) * incy];
        }
        REQUIRE(expected != y);
        Device<float> da(a), dx(x), dy(y);
        REQUIRE(cublasSgemv(h.blas, t, m, n, &alpha, da.get(), lda, dx.get(), incx, &beta, dy.get(),
                            incy) == CUBLAS_STATUS_SUCCESS);
        REQUIRE(cudaStreamSynchronize(h.stream) == cudaSuccess);
        CHECK(dy.download() == expected);
      }
    }
  }
}

TEST_CASE("cuda_host cuBLAS reads alpha and beta at the call, runs the product on the stream",
          "[unit]") {
  Handle h;
  Device<float> da(std::vector<float>{2.0f}), db(std::vector<float>{3.0f}),
      dc(std::vector<float>{1.0f});
  float alpha = 1.0f, beta = 1.0f;
  const size_t before = cuda_host::pendingOperations();
  REQUIRE(cublasSgemm(h.blas, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &alpha, da.get(), 1, db.get(), 1,
                      &beta, dc.get(), 1) == CUBLAS_STATUS_SUCCESS);
  CHECK(cuda_host::pendingOperations() == before + 1);  // queued, not run
  alpha = 100.0f;
  beta = 100.0f;
  REQUIRE(cudaStreamSynchronize(h.stream) == cudaSuccess);
  CHECK(dc.download() == std::vector<float>{7.0f});  // 1 * 2 * 3 + 1 * 1
}

TEST_CASE("cuda_host cuBLAS rejects what cuBLAS rejects and queues nothing", "[unit]") {
  Handle h;
  Device<float> buffer(std::vector<float>(64, 1.0f));
  float* p = buffer.get();
  const float one = 1.0f;
  const size_t before = cuda_host::pendingOperations();
  auto sgemm = [&](cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, int lda,
                   int ldb, int ldc) {
    return cublasSgemm(h.blas, ta, tb, m, n, k, &one, p, lda, p, ldb, &one, p, ldc);
  };
  // m = 4, n = 3, k = 2: A is 4 x 2 (N) or 2 x 4 (T); B is 2 x 3 (N) or 3 x 2 (T).
  CHECK(sgemm(CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, 3, 2, 4) ==
        CUBLAS_STATUS_INVALID_VALUE);  // lda < m
  CHECK(sgemm(CUBLAS_OP_T, CUBLAS_OP_N, 4, 3, 2, 1, 2, 4) ==
        CUBLAS_STATUS_INVALID_VALUE);  // lda < k
  CHECK(sgemm(CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, 4, 1, 4) ==
        CUBLAS_STATUS_INVALID_VALUE);  // ldb < k
  CHECK(sgemm(CUBLAS_OP_N, CUBLAS_OP_T, 4, 3, 2, 4, 2, 4) ==
        CUBLAS_STATUS_INVALID_VALUE);  // ldb < n
  CHECK(sgemm(CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, 4, 2, 3) ==
        CUBLAS_STATUS_INVALID_VALUE);  // ldc < m
  CHECK(sgemm(CUBLAS_OP_N, CUBLAS_OP_N, -1, 3, 2, 4, 2, 4) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(sgemm(CUBLAS_OP_N, CUBLAS_OP_N, 0, 3, 2, 0, 2, 0) ==
        CUBLAS_STATUS_INVALID_VALUE);  // ld >= 1
  CHECK(sgemm(static_cast<cublasOperation_t>(7), CUBLAS_OP_N, 4, 3, 2, 4, 2, 4) ==
        CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasSgemm(nullptr, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, &one, p, 4, p, 2, &one, p, 4) ==
        CUBLAS_STATUS_NOT_INITIALIZED);
  CHECK(cublasSgemv(h.blas, CUBLAS_OP_N, 4, 3, &one, p, 3, p, 1, &one, p, 1) ==
        CUBLAS_STATUS_INVALID_VALUE);  // lda < m
  CHECK(cublasSgemv(h.blas, CUBLAS_OP_T, 4, 3, &one, p, 4, p, 0, &one, p, 1) ==
        CUBLAS_STATUS_INVALID_VALUE);  // incx 0
  CHECK(cublasSgemv(h.blas, CUBLAS_OP_T, 4, 3, &one, p, 4, p, 1, &one, p, 0) ==
        CUBLAS_STATUS_INVALID_VALUE);  // incy 0
  auto gemm_ex = [&](cudaDataType_t at, cudaDataType_t ct, cublasComputeType_t compute, int lda) {
    return cublasGemmEx(h.blas, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, &one, p, at, lda, p, CUDA_R_16BF,
                        2, &one, p, ct, 4, compute, CUBLAS_GEMM_DEFAULT);
  };
  CHECK(gemm_ex(CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F, 3) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(gemm_ex(CUDA_R_16F, CUDA_R_32F, CUBLAS_COMPUTE_32F, 4) == CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(gemm_ex(CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, 4) == CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(gemm_ex(CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, 4) ==
        CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(cuda_host::pendingOperations() == before);
  // The valid call beside them is accepted: the checks above are not refusing everything.
  CHECK(sgemm(CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, 4, 2, 4) == CUBLAS_STATUS_SUCCESS);
  CHECK(cudaStreamSynchronize(h.stream) == cudaSuccess);
}
