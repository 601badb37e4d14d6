// What follows a bfloat16 matrix product in a dense layer (models.bert's
// product_type), each in one pass over the product where TensorFlow's ops
// take several, forward and backward:
//   EaBiasWiden: the product widened to float32 and its bias added (a cast
//     and an add); its gradient gives the product's gradient in bfloat16
//     and the bias's (a cast and a sum).
//   EaBiasGelu: that, then the exact GELU rounded to bfloat16 for the next
//     product (a cast, an add, EaGelu and a cast), keeping the GELU's slope
//     in float32 for the backward pass, which is then the slope times the
//     incoming gradient (where EaGeluGrad recomputes erf and exp).
// The forward outputs are those ops' bit for bit (the same float
// arithmetic, Eigen's erf, and its rounding to bfloat16); the gradients
// within float rounding of theirs: the bias's is summed in double over
// fixed blocks of rows, the same sum on any number of threads. Built and
// loaded by estimator_accum/native/__init__.py.

#include "common.h"
#include "unsupported/Eigen/SpecialFunctions"

namespace estimator_accum {
namespace products {
namespace {

// EaGelu's constants (gelu.cc): 1 / sqrt(2) and sqrt(2 / pi).
constexpr float kInverseRootTwo = 0.70710678118654752440f;
constexpr float kRootTwoOverPi = 0.79788456080286535588f;

// The products' shape, its last dimension the bias's.
absl::Status ProductAndBias(InferenceContext* c) {
  ShapeHandle products, bias;
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &products));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &bias));
  TF_RETURN_IF_ERROR(MergeLastDimension(c, products, bias));
  for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, products);
  return absl::OkStatus();
}

// The bias's shape: a vector of the last dimension of `shape`.
ShapeHandle BiasShape(InferenceContext* c, ShapeHandle shape) {
  return c->RankKnown(shape) ? c->Vector(c->Dim(shape, -1))
                             : c->Vector(c->UnknownDim());
}

REGISTER_OP("EaBiasGelu")
    .Input("products: bfloat16")
    .Input("bias: float")
    .Output("outputs: bfloat16")
    .Output("slopes: float")
    .SetShapeFn(ProductAndBias);

REGISTER_OP("EaBiasGeluGrad")
    .Input("gradients: bfloat16")
    .Input("slopes: float")
    .Output("backprops: bfloat16")
    .Output("bias_gradient: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle shape;
      TF_RETURN_IF_ERROR(c->Merge(c->input(0), c->input(1), &shape));
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(shape, 1, &shape));
      c->set_output(0, shape);
      c->set_output(1, BiasShape(c, shape));
      return absl::OkStatus();
    });

REGISTER_OP("EaBiasWiden")
    .Input("products: bfloat16")
    .Input("bias: float")
    .Output("outputs: float")
    .SetShapeFn(ProductAndBias);

REGISTER_OP("EaBiasWidenGrad")
    .Input("gradients: float")
    .Output("backprops: bfloat16")
    .Output("bias_gradient: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle shape;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &shape));
      c->set_output(0, shape);
      c->set_output(1, BiasShape(c, shape));
      return absl::OkStatus();
    });

template <typename T>
using Span = Eigen::TensorMap<Eigen::Tensor<T, 1, Eigen::RowMajor>>;

// The rows and width of `products`, or false with an error on the context
// where `products` has no axis or `bias` is not a vector of its width.
bool RowsOfProducts(OpKernelContext* context, const Tensor& products,
                    const Tensor& bias, int64_t* rows, int64_t* width) {
  return RowsAndWidth(context, products, "products", rows, width) &&
         IsVectorOfWidth(context, bias, "bias", "products", *width);
}

// A gradient's backward pass: `row(offset, width, sum)` for each row of
// `gradients` (its elements from `offset`, `width` of them) writes the
// row's backprops and adds its float32 values into `sum` (a double a
// column); the columns' sums (`ColumnSums`) are the bias's gradient
// (output 1). `cost` is an element's.
template <typename Row>
void BackwardOverRows(OpKernelContext* context, const Tensor& gradients,
                      int64_t cost, Row row) {
  int64_t rows, width;
  if (!RowsAndWidth(context, gradients, "gradients", &rows, &width)) return;
  Tensor* bias_gradient = nullptr;
  OP_REQUIRES_OK(context, context->allocate_output(1, TensorShape({width}),
                                                   &bias_gradient));
  float* sums[] = {bias_gradient->flat<float>().data()};
  ColumnSums(context, rows, width, 1, cost, sums,
             [&](int64_t begin, int64_t end, double* sum) {
    for (int64_t i = begin; i < end; ++i) row(i * width, width, sum);
  });
}

class BiasWidenOp : public OpKernel {
 public:
  explicit BiasWidenOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& products = context->input(0);
    const Tensor& bias = context->input(1);
    int64_t rows, width;
    if (!RowsOfProducts(context, products, bias, &rows, &width)) return;
    Tensor* outputs = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, products.shape(), &outputs));
    const uint16_t* p = Bits(products);
    const float* b = bias.flat<float>().data();
    float* y = outputs->flat<float>().data();
    Sharded(context, rows, width * 2,
            [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const uint16_t* __restrict pi = p + i * width;
        float* __restrict yi = y + i * width;
        // As Cast and AddV2.
        for (int64_t j = 0; j < width; ++j) yi[j] = Widen(pi[j]) + b[j];
      }
    });
  }
};

class BiasWidenGradOp : public OpKernel {
 public:
  explicit BiasWidenGradOp(OpKernelConstruction* context)
      : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& gradients = context->input(0);
    Tensor* backprops = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, gradients.shape(), &backprops));
    const float* g = gradients.flat<float>().data();
    uint16_t* dx = Bits(backprops);
    BackwardOverRows(context, gradients, /*cost=*/3,
                     [&](int64_t offset, int64_t width,
                         double* __restrict sum) {
      const float* __restrict gi = g + offset;
      uint16_t* __restrict out = dx + offset;
      for (int64_t j = 0; j < width; ++j) {
        out[j] = Narrow(gi[j]);  // As Cast
        sum[j] += gi[j];
      }
    });
  }
};

class BiasGeluOp : public OpKernel {
 public:
  explicit BiasGeluOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& products = context->input(0);
    const Tensor& bias = context->input(1);
    int64_t rows, width;
    if (!RowsOfProducts(context, products, bias, &rows, &width)) return;
    Tensor *outputs, *slopes;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, products.shape(), &outputs));
    OP_REQUIRES_OK(context,
                   context->allocate_output(1, products.shape(), &slopes));
    const uint16_t* p = Bits(products);
    const float* b = bias.flat<float>().data();
    uint16_t* y = Bits(outputs);
    float* s = slopes->flat<float>().data();
    Sharded(context, rows, width * 40,
            [&](int64_t begin, int64_t end) {
      std::vector<float> buffers(3 * width);
      float* __restrict x = buffers.data();
      float* __restrict e = x + width;
      float* __restrict g = e + width;
      Span<float> erfs(e, width), gaussians(g, width);
      Span<const float> xs(x, width);
      for (int64_t i = begin; i < end; ++i) {
        const uint16_t* __restrict pi = p + i * width;
        // As Cast and AddV2.
        for (int64_t j = 0; j < width; ++j) x[j] = Widen(pi[j]) + b[j];
        // EaGelu's erf, and exp(-u^2) for the slope.
        erfs = (xs * kInverseRootTwo).erf();
        gaussians = (-((xs * kInverseRootTwo) * (xs * kInverseRootTwo))).exp();
        uint16_t* __restrict yi = y + i * width;
        float* __restrict si = s + i * width;
        for (int64_t j = 0; j < width; ++j) {
          const float half = x[j] * 0.5f, one_plus = e[j] + 1.0f;
          yi[j] = Narrow(half * one_plus);  // EaGelu's product, then Cast
          // d/dx of 0.5 x (1 + erf(u)), u = x / sqrt(2).
          si[j] = one_plus * 0.5f + g[j] * (kRootTwoOverPi * half);
        }
      }
    });
  }
};

class BiasGeluGradOp : public OpKernel {
 public:
  explicit BiasGeluGradOp(OpKernelConstruction* context)
      : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& gradients = context->input(0);
    const Tensor& slopes = context->input(1);
    if (!SameShape(context, gradients, "gradients", slopes, "slopes")) return;
    Tensor* backprops = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, gradients.shape(), &backprops));
    const uint16_t* dy = Bits(gradients);
    const float* s = slopes.flat<float>().data();
    uint16_t* dx = Bits(backprops);
    BackwardOverRows(context, gradients, /*cost=*/4,
                     [&](int64_t offset, int64_t width,
                         double* __restrict sum) {
      const uint16_t* __restrict gi = dy + offset;
      const float* __restrict si = s + offset;
      uint16_t* __restrict out = dx + offset;
      for (int64_t j = 0; j < width; ++j) {
        const float product = Widen(gi[j]) * si[j];
        out[j] = Narrow(product);
        sum[j] += product;
      }
    });
  }
};

REGISTER_KERNEL_BUILDER(
    Name("EaBiasWiden").Device(::tensorflow::DEVICE_CPU), BiasWidenOp);
REGISTER_KERNEL_BUILDER(
    Name("EaBiasWidenGrad").Device(::tensorflow::DEVICE_CPU),
    BiasWidenGradOp);
REGISTER_KERNEL_BUILDER(
    Name("EaBiasGelu").Device(::tensorflow::DEVICE_CPU), BiasGeluOp);
REGISTER_KERNEL_BUILDER(
    Name("EaBiasGeluGrad").Device(::tensorflow::DEVICE_CPU), BiasGeluGradOp);

}  // namespace
}  // namespace products
}  // namespace estimator_accum
