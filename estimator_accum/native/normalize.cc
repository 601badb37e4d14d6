// Layer normalization's normalization over the last axis,
// (x - mean) / sqrt(variance + epsilon) with the variance the mean square
// of the centred values (models.bert's normalize_last_axis), and its
// gradient, in few passes: TensorFlow's ops take eight passes over the
// tensor forward (two means, a difference, a square, a product and their
// broadcasts) and about twice that backward. Forward, the same Eigen
// reductions and element-wise functors as TensorFlow's Mean, Sub, Square,
// AddV2, Rsqrt and Mul, on the same shapes: their values bit for bit where
// Eigen is built alike (AVX, no fused multiply-add). Backward, the
// gradient's closed form,
//   dx = r (dy - mean(dy) - c r^2 mean(dy c)),  c = x - mean, r = rstd,
// within float rounding of TensorFlow's (its ops sum in another order).
// Built and loaded by estimator_accum/native/__init__.py.
#define EIGEN_USE_THREADS

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "unsupported/Eigen/CXX11/Tensor"

namespace estimator_accum {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

using Matrix = Eigen::TensorMap<Eigen::Tensor<const float, 2, Eigen::RowMajor>,
                                Eigen::Aligned>;
using Column = Eigen::TensorMap<Eigen::Tensor<float, 1, Eigen::RowMajor>>;
using ConstColumn =
    Eigen::TensorMap<Eigen::Tensor<const float, 1, Eigen::RowMajor>,
                     Eigen::Aligned>;

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

// rows x width of `inputs` (rank >= 1), or an error on the context.
bool RowsAndWidth(OpKernelContext* context, const Tensor& inputs,
                  int64_t* rows, int64_t* width) {
  if (inputs.dims() < 1) {
    context->CtxFailure(absl::InvalidArgumentError(
        "inputs must have rank >= 1, got shape " +
        inputs.shape().DebugString()));
    return false;
  }
  *width = inputs.dim_size(inputs.dims() - 1);
  *rows = *width == 0 ? 0 : inputs.NumElements() / *width;
  return true;
}

TensorShape RowStatisticsShape(const Tensor& inputs) {
  TensorShape shape = inputs.shape();
  shape.set_dim(shape.dims() - 1, 1);
  return shape;
}

class NormalizeOp : public OpKernel {
 public:
  explicit NormalizeOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("epsilon", &epsilon_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& inputs = context->input(0);
    int64_t rows, width;
    if (!RowsAndWidth(context, inputs, &rows, &width)) return;
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
    const auto& device = context->eigen_device<Eigen::ThreadPoolDevice>();
    Matrix x(inputs.flat<float>().data(), rows, width);
    Column mean(mean_out->flat<float>().data(), rows);
    Column rstd(rstd_out->flat<float>().data(), rows);
    // The reduced axis known at compile time, as TensorFlow's reductions
    // give it (Eigen then sums a row in vector lanes, in their order).
    const Eigen::IndexList<Eigen::type2index<1>> last;
    const Eigen::array<Eigen::Index, 2> column{rows, 1};
    const Eigen::array<Eigen::Index, 2> across{1, width};
    const float count = static_cast<float>(width);
    // TensorFlow's Mean: the sum over the row, then divided by its count.
    mean.device(device) = x.sum(last) / count;
    auto centred = x - mean.reshape(column).broadcast(across);
    // The variance (stored in rstd first), then 1 / sqrt(it + epsilon).
    rstd.device(device) = centred.square().sum(last) / count;
    rstd.device(device) = (rstd + epsilon_).rsqrt();
    Eigen::TensorMap<Eigen::Tensor<float, 2, Eigen::RowMajor>, Eigen::Aligned>
        y(outputs->flat<float>().data(), rows, width);
    y.device(device) = centred * rstd.reshape(column).broadcast(across);
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
    OP_REQUIRES(context, gradients.shape() == inputs.shape(),
                absl::InvalidArgumentError(
                    "gradients and inputs must have the same shape, got " +
                    gradients.shape().DebugString() + " and " +
                    inputs.shape().DebugString()));
    int64_t rows, width;
    if (!RowsAndWidth(context, inputs, &rows, &width)) return;
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
    const auto& device = context->eigen_device<Eigen::ThreadPoolDevice>();
    Matrix dy(gradients.flat<float>().data(), rows, width);
    Matrix x(inputs.flat<float>().data(), rows, width);
    ConstColumn mean(mean_in.flat<float>().data(), rows);
    ConstColumn rstd(rstd_in.flat<float>().data(), rows);
    Tensor sums_tensor;
    OP_REQUIRES_OK(context, context->allocate_temp(
                                ::tensorflow::DT_FLOAT,
                                TensorShape({2, rows}), &sums_tensor));
    Column dy_mean(sums_tensor.flat<float>().data(), rows);
    Column dy_c_mean(sums_tensor.flat<float>().data() + rows, rows);
    // The reduced axis known at compile time, as TensorFlow's reductions
    // give it (Eigen then sums a row in vector lanes, in their order).
    const Eigen::IndexList<Eigen::type2index<1>> last;
    const Eigen::array<Eigen::Index, 2> column{rows, 1};
    const Eigen::array<Eigen::Index, 2> across{1, width};
    const float count = static_cast<float>(width);
    auto centred = x - mean.reshape(column).broadcast(across);
    dy_mean.device(device) = dy.sum(last) / count;
    dy_c_mean.device(device) = (dy * centred).sum(last) / count;
    auto r = rstd.reshape(column).broadcast(across);
    Eigen::TensorMap<Eigen::Tensor<float, 2, Eigen::RowMajor>, Eigen::Aligned>
        dx(backprops->flat<float>().data(), rows, width);
    dx.device(device) =
        r * (dy - dy_mean.reshape(column).broadcast(across) -
             centred * (r * r) * dy_c_mean.reshape(column).broadcast(across));
  }
};

REGISTER_KERNEL_BUILDER(
    Name("EaNormalize").Device(::tensorflow::DEVICE_CPU), NormalizeOp);
REGISTER_KERNEL_BUILDER(
    Name("EaNormalizeGrad").Device(::tensorflow::DEVICE_CPU),
    NormalizeGradOp);

}  // namespace
}  // namespace estimator_accum
