#include "examples/mnist/layers.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "examples/mnist/sample_math.h"

namespace cpprun::mnist {
namespace {

void uniformFill(float* data, size_t n, float bound, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(-bound, bound);
  for (size_t i = 0; i < n; ++i) data[i] = dist(rng);
}

// Convolution with stride 1 and no padding, as the MNIST example's nn.Conv2d(in, out, k).
class Conv2d : public Layer {
 public:
  Conv2d(Shape in, int out_channels, int kernel, bool relu)
      : relu_(relu),
        in_(in),
        out_{out_channels, in.height - kernel + 1, in.width - kernel + 1},
        kernel_(kernel),
        patch_(in.channels * kernel * kernel) {}

  std::string name() const override {
    return "conv" + std::to_string(kernel_) + "x" + std::to_string(kernel_) + " " +
           std::to_string(in_.channels) + "->" + std::to_string(out_.channels) +
           (relu_ ? " + relu" : "");
  }
  Shape outputShape() const override { return out_; }
  size_t parameterCount() const override {
    return static_cast<size_t>(out_.channels) * patch_ + out_.channels;
  }
  LayerSpec spec() const override {
    LayerSpec s{LayerSpec::Kind::kConv2d, in_, out_};
    s.kernel = kernel_;
    s.relu = relu_;
    return s;
  }
  void bind(float* params, float* grads) override {
    weight_ = params;
    bias_ = params + static_cast<size_t>(out_.channels) * patch_;
    dweight_ = grads;
    dbias_ = grads + static_cast<size_t>(out_.channels) * patch_;
  }
  void initialize(std::mt19937_64& rng) override {
    const float bound = 1.0f / std::sqrt(static_cast<float>(patch_));
    uniformFill(weight_, parameterCount(), bound, rng);
  }

  // One image at a time: cols [patch, pixels] (L2-sized), y_b [out_channels, pixels] = W cols.
  void forward(const float* x, float* y, int batch, const PassContext&) override {
    const int pixels = out_.height * out_.width;
    for (int b = 0; b < batch; ++b) {
      im2col(x + static_cast<size_t>(b) * in_.size());
      float* yb = y + static_cast<size_t>(b) * out_.size();
      for (int oc = 0; oc < out_.channels; ++oc) {
        std::fill(yb + static_cast<size_t>(oc) * pixels, yb + static_cast<size_t>(oc + 1) * pixels,
                  bias_[oc]);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, out_.channels, pixels, patch_, 1.0f,
                  weight_, patch_, cols_.data(), pixels, 1.0f, yb, pixels);
      if (relu_) {
        const size_t n = static_cast<size_t>(out_.size());
        for (size_t i = 0; i < n; ++i) yb[i] = yb[i] > 0.0f ? yb[i] : 0.0f;
      }
    }
  }

  void backward(const float* x, const float* y, const float* dy, float* dx, int batch) override {
    const int pixels = out_.height * out_.width;
    for (int b = 0; b < batch; ++b) {
      const float* dyb = dy + static_cast<size_t>(b) * out_.size();
      if (relu_) {
        // Through the fused ReLU: the gradient passes where the output was positive.
        const float* yb = y + static_cast<size_t>(b) * out_.size();
        const size_t n = static_cast<size_t>(out_.size());
        masked_.resize(n);
        for (size_t i = 0; i < n; ++i) masked_[i] = yb[i] > 0.0f ? dyb[i] : 0.0f;
        dyb = masked_.data();
      }
      // dbias[oc] += sum_p dy_b[oc][p], as a matrix-vector product.
      ones_.resize(pixels, 1.0f);
      cblas_sgemv(CblasRowMajor, CblasNoTrans, out_.channels, pixels, 1.0f, dyb, pixels,
                  ones_.data(), 1, 1.0f, dbias_, 1);
      im2col(x + static_cast<size_t>(b) * in_.size());
      // dweight[oc][k] += sum_p dy_b[oc][p] * cols[k][p]
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, out_.channels, patch_, pixels, 1.0f, dyb,
                  pixels, cols_.data(), pixels, 1.0f, dweight_, patch_);
      if (dx == nullptr) continue;
      // dcols[k][p] = sum_oc weight[oc][k] * dy_b[oc][p]
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, patch_, pixels, out_.channels, 1.0f,
                  weight_, patch_, dyb, pixels, 0.0f, cols_.data(), pixels);
      col2im(dx + static_cast<size_t>(b) * in_.size());
    }
  }

 private:
  // cols_[(c * k + i) * k + j][oy * out_w + ox] = x[c][oy + i][ox + j], for one image.
  void im2col(const float* x) {
    const int pixels = out_.height * out_.width;
    cols_.resize(static_cast<size_t>(patch_) * pixels);
    for (int c = 0; c < in_.channels; ++c) {
      const float* plane = x + static_cast<size_t>(c) * in_.height * in_.width;
      for (int i = 0; i < kernel_; ++i) {
        for (int j = 0; j < kernel_; ++j) {
          float* row = cols_.data() + static_cast<size_t>((c * kernel_ + i) * kernel_ + j) * pixels;
          for (int oy = 0; oy < out_.height; ++oy) {
            std::memcpy(row + oy * out_.width, plane + (oy + i) * in_.width + j,
                        sizeof(float) * out_.width);
          }
        }
      }
    }
  }

  // The adjoint of im2col: dx[c][oy + i][ox + j] += dcols[(c * k + i) * k + j][oy * out_w + ox].
  void col2im(float* dx) {
    const int pixels = out_.height * out_.width;
    std::fill(dx, dx + in_.size(), 0.0f);
    for (int c = 0; c < in_.channels; ++c) {
      float* plane = dx + static_cast<size_t>(c) * in_.height * in_.width;
      for (int i = 0; i < kernel_; ++i) {
        for (int j = 0; j < kernel_; ++j) {
          const float* row =
              cols_.data() + static_cast<size_t>((c * kernel_ + i) * kernel_ + j) * pixels;
          for (int oy = 0; oy < out_.height; ++oy) {
            float* dst = plane + (oy + i) * in_.width + j;
            const float* src = row + oy * out_.width;
            for (int ox = 0; ox < out_.width; ++ox) dst[ox] += src[ox];
          }
        }
      }
    }
  }

  bool relu_;
  Shape in_;
  Shape out_;
  int kernel_;
  int patch_;
  float* weight_ = nullptr;
  float* bias_ = nullptr;
  float* dweight_ = nullptr;
  float* dbias_ = nullptr;
  std::vector<float> cols_;
  std::vector<float> ones_;
  std::vector<float> masked_;
};

class Linear : public Layer {
 public:
  Linear(int in, int out) : in_(in), out_(out) {}
  std::string name() const override {
    return "linear " + std::to_string(in_) + "->" + std::to_string(out_);
  }
  Shape outputShape() const override { return {out_, 1, 1}; }
  LayerSpec spec() const override { return {LayerSpec::Kind::kLinear, {in_, 1, 1}, {out_, 1, 1}}; }
  size_t parameterCount() const override { return static_cast<size_t>(out_) * in_ + out_; }
  void bind(float* params, float* grads) override {
    weight_ = params;
    bias_ = params + static_cast<size_t>(out_) * in_;
    dweight_ = grads;
    dbias_ = grads + static_cast<size_t>(out_) * in_;
  }
  void initialize(std::mt19937_64& rng) override {
    uniformFill(weight_, parameterCount(), 1.0f / std::sqrt(static_cast<float>(in_)), rng);
  }
  void forward(const float* x, float* y, int batch, const PassContext&) override {
    for (int b = 0; b < batch; ++b)
      std::memcpy(y + static_cast<size_t>(b) * out_, bias_, sizeof(float) * out_);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, out_, in_, 1.0f, x, in_, weight_,
                in_, 1.0f, y, out_);
  }
  void backward(const float* x, const float*, const float* dy, float* dx, int batch) override {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out_, in_, batch, 1.0f, dy, out_, x, in_,
                1.0f, dweight_, in_);
    for (int b = 0; b < batch; ++b) {
      const float* row = dy + static_cast<size_t>(b) * out_;
      for (int o = 0; o < out_; ++o) dbias_[o] += row[o];
    }
    if (dx != nullptr) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, in_, out_, 1.0f, dy, out_,
                  weight_, in_, 0.0f, dx, in_);
    }
  }

 private:
  int in_;
  int out_;
  float* weight_ = nullptr;
  float* bias_ = nullptr;
  float* dweight_ = nullptr;
  float* dbias_ = nullptr;
};

class Relu : public Layer {
 public:
  explicit Relu(Shape in) : shape_(in) {}
  std::string name() const override { return "relu"; }
  Shape outputShape() const override { return shape_; }
  LayerSpec spec() const override { return {LayerSpec::Kind::kRelu, shape_, shape_}; }
  void forward(const float* x, float* y, int batch, const PassContext&) override {
    const size_t n = static_cast<size_t>(batch) * shape_.size();
    for (size_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  }
  void backward(const float* x, const float*, const float* dy, float* dx, int batch) override {
    if (dx == nullptr) return;
    const size_t n = static_cast<size_t>(batch) * shape_.size();
    for (size_t i = 0; i < n; ++i) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
  }

 private:
  Shape shape_;
};

class MaxPool2d : public Layer {
 public:
  MaxPool2d(Shape in, int kernel)
      : in_(in), out_{in.channels, in.height / kernel, in.width / kernel}, kernel_(kernel) {}
  std::string name() const override { return "maxpool" + std::to_string(kernel_); }
  Shape outputShape() const override { return out_; }
  LayerSpec spec() const override {
    LayerSpec s{LayerSpec::Kind::kMaxPool2d, in_, out_};
    s.kernel = kernel_;
    return s;
  }
  void forward(const float* x, float* y, int batch, const PassContext&) override {
    argmax_.resize(static_cast<size_t>(batch) * out_.size());
    const int planes = batch * in_.channels;
    for (int plane = 0; plane < planes; ++plane) {
      const float* src = x + static_cast<size_t>(plane) * in_.height * in_.width;
      float* dst = y + static_cast<size_t>(plane) * out_.height * out_.width;
      int32_t* arg = argmax_.data() + static_cast<size_t>(plane) * out_.height * out_.width;
      if (kernel_ == 2) {
        pool2x2(src, dst, arg);
        continue;
      }
      for (int oy = 0; oy < out_.height; ++oy) {
        for (int ox = 0; ox < out_.width; ++ox) {
          float best = -std::numeric_limits<float>::infinity();
          int32_t where = 0;
          for (int i = 0; i < kernel_; ++i) {
            for (int j = 0; j < kernel_; ++j) {
              const int at = (oy * kernel_ + i) * in_.width + ox * kernel_ + j;
              if (src[at] > best) {
                best = src[at];
                where = at;
              }
            }
          }
          dst[oy * out_.width + ox] = best;
          arg[oy * out_.width + ox] = where;
        }
      }
    }
  }

  // The network's case, unrolled: the first maximum in row-major order wins, as above.
  void pool2x2(const float* src, float* dst, int32_t* arg) const {
    for (int oy = 0; oy < out_.height; ++oy) {
      const float* top = src + 2 * oy * in_.width;
      const float* bottom = top + in_.width;
      for (int ox = 0; ox < out_.width; ++ox) {
        const int base = 2 * oy * in_.width + 2 * ox;
        float best = top[2 * ox];
        int32_t where = base;
        if (top[2 * ox + 1] > best) {
          best = top[2 * ox + 1];
          where = base + 1;
        }
        if (bottom[2 * ox] > best) {
          best = bottom[2 * ox];
          where = base + in_.width;
        }
        if (bottom[2 * ox + 1] > best) {
          best = bottom[2 * ox + 1];
          where = base + in_.width + 1;
        }
        dst[oy * out_.width + ox] = best;
        arg[oy * out_.width + ox] = where;
      }
    }
  }

  void backward(const float*, const float*, const float* dy, float* dx, int batch) override {
    if (dx == nullptr) return;
    std::fill(dx, dx + static_cast<size_t>(batch) * in_.size(), 0.0f);
    const int planes = batch * in_.channels;
    const int per_plane = out_.height * out_.width;
    for (int plane = 0; plane < planes; ++plane) {
      float* dst = dx + static_cast<size_t>(plane) * in_.height * in_.width;
      const float* src = dy + static_cast<size_t>(plane) * per_plane;
      const int32_t* arg = argmax_.data() + static_cast<size_t>(plane) * per_plane;
      for (int i = 0; i < per_plane; ++i) dst[arg[i]] += src[i];
    }
  }

 private:
  Shape in_;
  Shape out_;
  int kernel_;
  std::vector<int32_t> argmax_;
};

class Dropout : public Layer {
 public:
  Dropout(Shape in, float probability, uint64_t salt)
      : shape_(in), probability_(probability), salt_(salt) {}
  std::string name() const override { return "dropout " + std::to_string(probability_); }
  Shape outputShape() const override { return shape_; }
  LayerSpec spec() const override {
    LayerSpec s{LayerSpec::Kind::kDropout, shape_, shape_};
    s.probability = probability_;
    s.salt = salt_;
    return s;
  }
  void forward(const float* x, float* y, int batch, const PassContext& context) override {
    const size_t per_sample = static_cast<size_t>(shape_.size());
    const size_t n = static_cast<size_t>(batch) * per_sample;
    if (!context.training || probability_ <= 0.0f) {
      std::copy(x, x + n, y);
      scale_.assign(n, 1.0f);
      return;
    }
    scale_.resize(n);
    for (int b = 0; b < batch; ++b) {
      for (size_t e = 0; e < per_sample; ++e) {
        const size_t i = static_cast<size_t>(b) * per_sample + e;
        scale_[i] = dropoutScale(context.sample_keys[b], salt_, e, probability_);
        y[i] = x[i] * scale_[i];
      }
    }
  }
  void backward(const float*, const float*, const float* dy, float* dx, int batch) override {
    if (dx == nullptr) return;
    const size_t n = static_cast<size_t>(batch) * shape_.size();
    for (size_t i = 0; i < n; ++i) dx[i] = dy[i] * scale_[i];
  }

 private:
  Shape shape_;
  float probability_;
  uint64_t salt_;
  std::vector<float> scale_;
};

}  // namespace

std::unique_ptr<Layer> makeConv2d(Shape in, int out_channels, int kernel, bool relu) {
  return std::make_unique<Conv2d>(in, out_channels, kernel, relu);
}
std::unique_ptr<Layer> makeLinear(int in_features, int out_features) {
  return std::make_unique<Linear>(in_features, out_features);
}
std::unique_ptr<Layer> makeRelu(Shape in) { return std::make_unique<Relu>(in); }
std::unique_ptr<Layer> makeMaxPool2d(Shape in, int kernel) {
  return std::make_unique<MaxPool2d>(in, kernel);
}
std::unique_ptr<Layer> makeDropout(Shape in, float probability, uint64_t salt) {
  return std::make_unique<Dropout>(in, probability, salt);
}

double logSoftmaxNllLoss(const float* logits, const uint8_t* labels, int batch, int classes,
                         float* dlogits, int* correct) {
  double total = 0.0;
  int hits = 0;
  for (int b = 0; b < batch; ++b) {
    int best = 0;
    total += sampleLogSoftmaxNll(
        logits + static_cast<size_t>(b) * classes, labels[b], classes, batch,
        dlogits == nullptr ? nullptr : dlogits + static_cast<size_t>(b) * classes, &best);
    if (best == labels[b]) ++hits;
  }
  if (correct != nullptr) *correct = hits;
  return total / batch;
}

void setComputeThreads(int threads) { openblas_set_num_threads(std::max(1, threads)); }
int computeThreads() { return openblas_get_num_threads(); }

}  // namespace cpprun::mnist
