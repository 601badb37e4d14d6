// google-research/bert's AdamWeightDecay update of one variable in one
// pass, in place: the window's gradient times its scale (clipping and the
// reduction's factor), the moments, the step with its weight decay, and the
// writes of the variable and both slots. TensorFlow's ops take about ten
// passes for it (a product, a square, adds, a square root, a quotient, each
// a tensor of its own), and XLA, which makes one pass of them, compiles for
// about 2 s at a run's start. The same values bit for bit: each step is the
// one Eigen functor TensorFlow's op runs, rounded to float32 in the same
// order (built without fused multiply-add, as TensorFlow's wheels build
// Eigen). Built and loaded by estimator_accum/native/__init__.py against
// the running TensorFlow.

#include "common.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/kernels/training_op_helpers.h"

namespace estimator_accum {
namespace {

REGISTER_OP("EaAdamWeightDecay")
    .Input("variable: resource")
    .Input("m: resource")
    .Input("v: resource")
    .Input("gradient: float")
    .Input("scale: float")
    .Input("learning_rate: float")
    .Input("beta_1: float")
    .Input("one_minus_beta_1: float")
    .Input("beta_2: float")
    .Input("one_minus_beta_2: float")
    .Input("epsilon: float")
    .Input("weight_decay_rate: float")
    .Attr("decay: bool")
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs);

// The scalar inputs from `scale` on, in order.
constexpr const char* kScalars[] = {
    "scale",  "learning_rate",    "beta_1",  "one_minus_beta_1",
    "beta_2", "one_minus_beta_2", "epsilon", "weight_decay_rate"};
constexpr int kFirstScalar = 4;
constexpr int kScalarCount = sizeof(kScalars) / sizeof(kScalars[0]);

class AdamWeightDecayOp : public OpKernel {
 public:
  explicit AdamWeightDecayOp(OpKernelConstruction* context)
      : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("decay", &decay_));
  }

  void Compute(OpKernelContext* context) override {
    float scalars[kScalarCount];
    for (int i = 0; i < kScalarCount; ++i) {
      const Tensor& scalar = context->input(kFirstScalar + i);
      OP_REQUIRES(context, scalar.dims() == 0,
                  absl::InvalidArgumentError(
                      std::string(kScalars[i]) +
                      " must be a scalar, got shape " +
                      scalar.shape().DebugString()));
      scalars[i] = scalar.scalar<float>()();
    }
    static constexpr const char* kVariables[] = {"variable", "m", "v"};
    // Each variable initialized and float32 before any is touched: the
    // update below reads their buffers as floats.
    for (int i = 0; i < 3; ++i) {
      ::tensorflow::core::RefCountPtr<::tensorflow::Var> variable;
      OP_REQUIRES_OK(context,
                     ::tensorflow::LookupResource(
                         context, ::tensorflow::HandleFromInput(context, i),
                         &variable));
      ::tensorflow::tf_shared_lock lock(*variable->mu());
      OP_REQUIRES(context, variable->tensor()->IsInitialized(),
                  absl::FailedPreconditionError(
                      std::string(kVariables[i]) + " is not initialized"));
      OP_REQUIRES(context,
                  variable->tensor()->dtype() == ::tensorflow::DT_FLOAT,
                  absl::InvalidArgumentError(
                      std::string(kVariables[i]) + " must be float32, got " +
                      ::tensorflow::DataTypeString(
                          variable->tensor()->dtype())));
    }
    using Device = Eigen::ThreadPoolDevice;
    // The three variables' locks, taken in address order, as TensorFlow's
    // own updates take them.
    auto locks = ::tensorflow::MaybeLockVariableInputMutexesInOrder<
        Device, float>(context, /*do_lock=*/true, /*sparse=*/false,
                       {0, 1, 2});
    Tensor tensors[3];
    for (int i = 0; i < 3; ++i) {
      // A buffer still held by a reader is copied first, as TensorFlow's
      // own updates do.
      OP_REQUIRES_OK(context,
                     (::tensorflow::GetInputTensorFromVariable<Device, float>(
                         context, i, /*lock_held=*/true, /*sparse=*/false,
                         &tensors[i])));
      // Checked again under the update's locks (another op may have
      // assigned the variable since).
      OP_REQUIRES(context,
                  tensors[i].IsInitialized() &&
                      tensors[i].dtype() == ::tensorflow::DT_FLOAT,
                  absl::FailedPreconditionError(
                      std::string(kVariables[i]) +
                      " changed while the update waited for it"));
    }
    const Tensor& gradient = context->input(3);
    for (int i = 0; i < 3; ++i) {
      if (!SameShape(context, tensors[i], kVariables[i], gradient,
                     "gradient")) {
        return;
      }
    }
    Update update{gradient.flat<float>().data(),
                  tensors[0].flat<float>().data(),
                  tensors[1].flat<float>().data(),
                  tensors[2].flat<float>().data(),
                  scalars,
                  decay_};
    // About 12 float operations and 28 bytes moved an element.
    Sharded(context, gradient.NumElements(), 40,
            [&update](int64_t begin, int64_t end) { update(begin, end); });
  }

 private:
  // Elements [begin, end): in chunks that stay in the first caches, each
  // step a whole chunk's, with Eigen's packet functors (TensorFlow's ops'
  // own: pmul, padd, psub, pdiv, psqrt).
  struct Update {
    const float* gradient;
    float* variable;
    float* m;
    float* v;
    const float* scalars;
    bool decay;

    void operator()(int64_t begin, int64_t end) const {
      constexpr int64_t kChunk = 1024;
      alignas(64) float scaled_buffer[kChunk];
      alignas(64) float step_buffer[kChunk];
      const float scale = scalars[0], learning_rate = scalars[1],
                  beta_1 = scalars[2], one_minus_beta_1 = scalars[3],
                  beta_2 = scalars[4], one_minus_beta_2 = scalars[5],
                  epsilon = scalars[6], weight_decay_rate = scalars[7];
      using Array = Eigen::Array<float, Eigen::Dynamic, 1>;
      for (int64_t start = begin; start < end; start += kChunk) {
        const int64_t count = std::min(kChunk, end - start);
        Eigen::Map<const Array> g(gradient + start, count);
        Eigen::Map<Array> p(variable + start, count);
        Eigen::Map<Array> first(m + start, count);
        Eigen::Map<Array> second(v + start, count);
        Eigen::Map<Array> scaled(scaled_buffer, count);
        Eigen::Map<Array> step(step_buffer, count);
        // The window's gradient as the optimizer is handed it.
        scaled = g * scale;
        // beta_1 * m + (1 - beta_1) * g; beta_2 * v + (1 - beta_2) * g^2.
        first = beta_1 * first + one_minus_beta_1 * scaled;
        second = beta_2 * second + one_minus_beta_2 * scaled.square();
        // next_m / (sqrt(next_v) + epsilon), plus decay * p.
        step = first / (second.sqrt() + epsilon);
        if (decay) step = step + weight_decay_rate * p;
        p = p - learning_rate * step;
      }
    }
  };

  bool decay_ = false;
};

REGISTER_KERNEL_BUILDER(Name("EaAdamWeightDecay")
                            .Device(::tensorflow::DEVICE_CPU),
                        AdamWeightDecayOp);

}  // namespace
}  // namespace estimator_accum
