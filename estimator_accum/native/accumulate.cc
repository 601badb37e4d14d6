// A micro-batch's bfloat16 (or float16) gradient added into its float32
// accumulator in one pass: total += weight * float(value). TensorFlow's
// own ops take two: a Cast writing a float32 copy of the gradient, then
// the add (ResourceApplyGradientDescent with alpha = -weight, or
// AssignAddVariableOp) reading it back. The same values bit for bit:
// converting bfloat16 or float16 to float32 is exact, and
// total - value * (-weight) is total + value * weight in IEEE arithmetic
// (built without fused multiply-add, as TensorFlow's wheels build Eigen).
// Built and loaded by estimator_accum/native/__init__.py against the
// running TensorFlow.

#include "common.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/kernels/training_op_helpers.h"

namespace estimator_accum {
namespace {

REGISTER_OP("EaAccumulate")
    .Input("total: resource")
    .Input("value: T")
    .Input("weight: float")
    .Attr("T: {bfloat16, half}")
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs);

template <typename T>
class AccumulateOp : public OpKernel {
 public:
  explicit AccumulateOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    ::tensorflow::core::RefCountPtr<::tensorflow::Var> variable;
    OP_REQUIRES_OK(context, ::tensorflow::LookupResource(
                                context, ::tensorflow::HandleFromInput(
                                             context, 0),
                                &variable));
    const Tensor& value = context->input(1);
    const Tensor& weight = context->input(2);
    OP_REQUIRES(context, weight.dims() == 0,
                absl::InvalidArgumentError(
                    "weight must be a scalar, got shape " +
                    weight.shape().DebugString()));
    ::tensorflow::mutex_lock lock(*variable->mu());
    Tensor* total = variable->tensor();
    OP_REQUIRES(context, total->IsInitialized(),
                absl::FailedPreconditionError(
                    "the accumulator is not initialized"));
    OP_REQUIRES(context, total->dtype() == ::tensorflow::DT_FLOAT,
                absl::InvalidArgumentError(
                    "the accumulator must be float32, got " +
                    ::tensorflow::DataTypeString(total->dtype())));
    OP_REQUIRES(context, total->shape() == value.shape(),
                absl::InvalidArgumentError(
                    "the accumulator's shape " + total->shape().DebugString() +
                    " is not the value's " + value.shape().DebugString()));
    // A buffer still held by a reader is copied first, as TensorFlow's own
    // updates do.
    OP_REQUIRES_OK(context,
                   (::tensorflow::PrepareToUpdateVariable<
                       Eigen::ThreadPoolDevice, float>(
                       context, total, variable->copy_on_read_mode.load())));
    auto sums = total->flat<float>();
    const float scale = weight.scalar<float>()();
    sums.device(context->eigen_device<Eigen::ThreadPoolDevice>()) =
        sums + value.flat<T>().template cast<float>() * scale;
  }
};

REGISTER_KERNEL_BUILDER(Name("EaAccumulate")
                            .Device(::tensorflow::DEVICE_CPU)
                            .TypeConstraint<Eigen::bfloat16>("T"),
                        AccumulateOp<Eigen::bfloat16>);
REGISTER_KERNEL_BUILDER(Name("EaAccumulate")
                            .Device(::tensorflow::DEVICE_CPU)
                            .TypeConstraint<Eigen::half>("T"),
                        AccumulateOp<Eigen::half>);

}  // namespace
}  // namespace estimator_accum
