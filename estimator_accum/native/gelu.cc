// The exact (erf) GELU, 0.5 x (1 + erf(x / sqrt(2))), and its gradient,
// each in one pass over the tensor: TensorFlow's own ops take five passes
// forward (a product, the erf, a sum, two products) and seven backward.
// The same function as those ops to within float rounding (Eigen's erf and
// exp, as TensorFlow's own kernels use them; a few units in the last place
// apart where the compiler fuses a product and a sum). Built and loaded by
// estimator_accum/native/__init__.py against the running TensorFlow.

#include "common.h"
#include "unsupported/Eigen/SpecialFunctions"

namespace estimator_accum {
namespace {

// 1 / sqrt(2) and sqrt(2 / pi) = (2 / sqrt(pi)) / sqrt(2), rounded to
// float once: the constants Grappler folds TensorFlow's ops into.
constexpr float kInverseRootTwo = 0.70710678118654752440f;
constexpr float kRootTwoOverPi = 0.79788456080286535588f;

REGISTER_OP("EaGelu")
    .Input("inputs: float")
    .Output("outputs: float")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    });

REGISTER_OP("EaGeluGrad")
    .Input("gradients: float")
    .Input("inputs: float")
    .Output("backprops: float")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      ::tensorflow::shape_inference::ShapeHandle shape;
      TF_RETURN_IF_ERROR(c->Merge(c->input(0), c->input(1), &shape));
      c->set_output(0, shape);
      return absl::OkStatus();
    });

class GeluOp : public OpKernel {
 public:
  explicit GeluOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& inputs = context->input(0);
    Tensor* outputs = nullptr;
    OP_REQUIRES_OK(context, context->forward_input_or_allocate_output(
                                {0}, 0, inputs.shape(), &outputs));
    auto x = inputs.flat<float>();
    outputs->flat<float>().device(
        context->eigen_device<Eigen::ThreadPoolDevice>()) =
        (x * 0.5f) * ((x * kInverseRootTwo).erf() + 1.0f);
  }
};

class GeluGradOp : public OpKernel {
 public:
  explicit GeluGradOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& gradients = context->input(0);
    const Tensor& inputs = context->input(1);
    if (!SameShape(context, gradients, "gradients", inputs, "inputs")) return;
    Tensor* backprops = nullptr;
    OP_REQUIRES_OK(context, context->forward_input_or_allocate_output(
                                {0}, 0, inputs.shape(), &backprops));
    auto dy = gradients.flat<float>();
    auto x = inputs.flat<float>();
    auto u = x * kInverseRootTwo;
    // d/dx of 0.5 x (1 + erf(u)), u = x / sqrt(2):
    //   0.5 (1 + erf(u)) + 0.5 x sqrt(2 / pi) exp(-u^2),
    // each product in the order TensorFlow's gradients of the forward ops
    // take them once Grappler has folded their constants.
    backprops->flat<float>().device(
        context->eigen_device<Eigen::ThreadPoolDevice>()) =
        ((u.erf() + 1.0f) * dy) * 0.5f +
        (-(u * u)).exp() * (kRootTwoOverPi * (dy * (x * 0.5f)));
  }
};

REGISTER_KERNEL_BUILDER(Name("EaGelu").Device(::tensorflow::DEVICE_CPU),
                        GeluOp);
REGISTER_KERNEL_BUILDER(Name("EaGeluGrad").Device(::tensorflow::DEVICE_CPU),
                        GeluGradOp);

}  // namespace
}  // namespace estimator_accum
