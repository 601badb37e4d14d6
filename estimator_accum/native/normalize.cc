// Layer normalization's normalization over the last axis,
// (x - mean) / sqrt(variance + epsilon) with the variance the mean square
// of the centred values (models.bert's normalize_last_axis), and its
// gradient, row by row: TensorFlow's ops take eight passes over the tensor
// forward (two means, a difference, a square, a product and their
// broadcasts) and about twice that backward; here each row is read three
// times while it is in cache, and written once. Forward, the same Eigen
// reductions (a row's lanes summed in the same order) and element-wise
// arithmetic as TensorFlow's Mean, Sub, Square, AddV2, Rsqrt and Mul: their
// values bit for bit where Eigen is built alike (no fused
// multiply-add). Backward, the gradient's closed form,
//   dx = r (dy - mean(dy) - c r^2 mean(dy c)),  c = x - mean, r = rstd,
// within float rounding of TensorFlow's (its ops sum in another order).
// Built and loaded by estimator_accum/native/__init__.py.

#include "common.h"

namespace estimator_accum {
namespace {

using Column = Eigen::TensorMap<Eigen::Tensor<float, 1, Eigen::RowMajor>>;

// The shape of `inputs` with its last axis 1 (the rows' statistics).
absl::Status RowShape(InferenceContext* c, ShapeHandle inputs,
                      ShapeHandle* rows) {
  if (!c->RankKnown(inputs)) {
    *rows = c->UnknownShape();
    return absl::OkStatus();
  }
  ShapeHandle leading;
  TF_RETURN_IF_ERROR(c->Subshape(inputs, 0, -1, &leading));
  return c->Concatenate(leading, c->Vector(1), rows);
}

REGISTER_OP("EaNormalize")
    .Input("inputs: float")
    .Attr("epsilon: float")
    .Output("outputs: float")
    .Output("mean: float")
    .Output("rstd: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle inputs, rows;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &inputs));
      TF_RETURN_IF_ERROR(RowShape(c, inputs, &rows));
      c->set_output(0, inputs);
      c->set_output(1, rows);
      c->set_output(2, rows);
      return absl::OkStatus();
    });

REGISTER_OP("EaNormalizeGrad")
    .Input("gradients: float")
    .Input("inputs: float")
    .Input("mean: float")
    .Input("rstd: float")
    .Output("backprops: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle shape;
      TF_RETURN_IF_ERROR(c->Merge(c->input(0), c->input(1), &shape));
      c->set_output(0, shape);
      return absl::OkStatus();
    });

TensorShape RowStatisticsShape(const Tensor& inputs) {
  TensorShape shape = inputs.shape();
  shape.set_dim(shape.dims() - 1, 1);
  return shape;
}

// A row of `width` floats as a 1-D Eigen tensor: its full sum runs the
// same InnerMostDimReducer, in the same lane order, as TensorFlow's sum of
// a matrix's rows.
using Row = Eigen::TensorMap<Eigen::Tensor<const float, 1, Eigen::RowMajor>>;

class NormalizeOp : public OpKernel {
 public:
  explicit NormalizeOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("epsilon", &epsilon_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& inputs = context->input(0);
    int64_t rows, width;
    if (!RowsAndWidth(context, inputs, "inputs", &rows, &width)) return;
    Tensor *outputs, *mean_out, *rstd_out;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, inputs.shape(), &outputs));
    OP_REQUIRES_OK(context, context->allocate_output(
                                1, RowStatisticsShape(inputs), &mean_out));
    OP_REQUIRES_OK(context, context->allocate_output(
                                2, RowStatisticsShape(inputs), &rstd_out));
    if (inputs.NumElements() == 0) {
      // No element to normalize; rows of width 0 have a mean of 0/0.
      mean_out->flat<float>().setConstant(
          std::numeric_limits<float>::quiet_NaN());
      rstd_out->flat<float>().setConstant(
          std::numeric_limits<float>::quiet_NaN());
      return;
    }
    const float* x = inputs.flat<float>().data();
    float* y = outputs->flat<float>().data();
    float* mean = mean_out->flat<float>().data();
    float* rstd = rstd_out->flat<float>().data();
    const float count = static_cast<float>(width);
    // Each row's mean and variance (kept in rstd): TensorFlow's Mean (the
    // sum, then divided by the count) of the row and of its centred
    // values' squares.
    Sharded(context, rows, width * 6, [&](int64_t begin, int64_t end) {
      Eigen::Tensor<float, 0, Eigen::RowMajor> sum;
      for (int64_t i = begin; i < end; ++i) {
        Row row(x + i * width, width);
        sum = row.sum();
        const float m = sum() / count;
        mean[i] = m;
        sum = (row - row.constant(m)).square().sum();
        rstd[i] = sum() / count;
      }
    });
    // 1 / sqrt(variance + epsilon) over the rows as one vector, as
    // TensorFlow's AddV2 and Rsqrt take it (their vector lanes and last
    // scalars fall on the same rows).
    Column statistics(rstd, rows);
    statistics.device(context->eigen_device<Eigen::ThreadPoolDevice>()) =
        (statistics + epsilon_).rsqrt();
    // (x - mean) * rstd: a difference, then a product, as Sub and Mul.
    Sharded(context, rows, width * 3, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const float m = mean[i], r = rstd[i];
        const float* __restrict in = x + i * width;
        float* __restrict out = y + i * width;
        for (int64_t j = 0; j < width; ++j) out[j] = (in[j] - m) * r;
      }
    });
  }

 private:
  float epsilon_;
};

class NormalizeGradOp : public OpKernel {
 public:
  explicit NormalizeGradOp(OpKernelConstruction* context)
      : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& gradients = context->input(0);
    const Tensor& inputs = context->input(1);
    const Tensor& mean_in = context->input(2);
    const Tensor& rstd_in = context->input(3);
    if (!SameShape(context, gradients, "gradients", inputs, "inputs")) return;
    int64_t rows, width;
    if (!RowsAndWidth(context, inputs, "inputs", &rows, &width)) return;
    const TensorShape statistics = RowStatisticsShape(inputs);
    OP_REQUIRES(context,
                mean_in.shape() == statistics && rstd_in.shape() == statistics,
                absl::InvalidArgumentError(
                    "mean and rstd must have the shape " +
                    statistics.DebugString() + " of inputs' rows, got " +
                    mean_in.shape().DebugString() + " and " +
                    rstd_in.shape().DebugString()));
    Tensor* backprops = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, inputs.shape(), &backprops));
    if (inputs.NumElements() == 0) return;
    const float* dy = gradients.flat<float>().data();
    const float* x = inputs.flat<float>().data();
    const float* mean = mean_in.flat<float>().data();
    const float* rstd = rstd_in.flat<float>().data();
    float* dx = backprops->flat<float>().data();
    Sharded(context, rows, width * 10, [&](int64_t begin, int64_t end) {
      // The row's two means in double: the closed form subtracts them
      // from each element, so their rounding would reach every one.
      Eigen::Tensor<double, 0, Eigen::RowMajor> sum;
      for (int64_t i = begin; i < end; ++i) {
        Row g(dy + i * width, width), row(x + i * width, width);
        const float m = mean[i], r = rstd[i];
        sum = g.cast<double>().sum();
        const float g_mean = static_cast<float>(sum() / width);
        sum = (g.cast<double>() *
               (row - row.constant(m)).cast<double>()).sum();
        const float c_scale = static_cast<float>(
            static_cast<double>(r) * r * (sum() / width));
        const float* __restrict gi = dy + i * width;
        const float* __restrict xi = x + i * width;
        float* __restrict out = dx + i * width;
        for (int64_t j = 0; j < width; ++j) {
          out[j] = r * (gi[j] - g_mean - (xi[j] - m) * c_scale);
        }
      }
    });
  }
};

REGISTER_KERNEL_BUILDER(
    Name("EaNormalize").Device(::tensorflow::DEVICE_CPU), NormalizeOp);
REGISTER_KERNEL_BUILDER(
    Name("EaNormalizeGrad").Device(::tensorflow::DEVICE_CPU),
    NormalizeGradOp);

}  // namespace
}  // namespace estimator_accum
