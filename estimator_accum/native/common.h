// What the native kernels' sources share: TensorFlow's headers, the names
// they use from it, work split over TensorFlow's CPU threads, a tensor's
// rows and width, and the check that two inputs have one shape. In an anonymous namespace: each
// unit of sources (built with its own vector flags) keeps its own copy.
#ifndef ESTIMATOR_ACCUM_NATIVE_COMMON_H_
#define ESTIMATOR_ACCUM_NATIVE_COMMON_H_

#ifndef EIGEN_USE_THREADS
#define EIGEN_USE_THREADS
#endif

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"
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

// `function(begin, end)` over [0, count), split over TensorFlow's CPU
// threads (`cost` each).
template <typename Function>
void Sharded(OpKernelContext* context, int64_t count, int64_t cost,
             Function function) {
  const auto* threads = context->device()->tensorflow_cpu_worker_threads();
  ::tensorflow::Shard(threads->num_threads, threads->workers, count, cost,
                      function);
}

// The rows (all but the last axis, flattened) and the width (the last
// axis) of `tensor`, the argument `name`; false, with an error on the
// context naming it, where it has no axis.
inline bool RowsAndWidth(OpKernelContext* context, const Tensor& tensor,
                         const char* name, int64_t* rows, int64_t* width) {
  if (tensor.dims() < 1) {
    context->CtxFailure(absl::InvalidArgumentError(
        std::string(name) + " must have rank >= 1, got shape " +
        tensor.shape().DebugString()));
    return false;
  }
  *width = tensor.dim_size(tensor.dims() - 1);
  *rows = *width == 0 ? 0 : tensor.NumElements() / *width;
  return true;
}

// Whether `a` and `b` have one shape; else false, with an error on the
// context: "<a_name> and <b_name> must have the same shape, got ...".
inline bool SameShape(OpKernelContext* context, const Tensor& a,
                      const char* a_name, const Tensor& b,
                      const char* b_name) {
  if (a.shape() == b.shape()) return true;
  context->CtxFailure(absl::InvalidArgumentError(
      std::string(a_name) + " and " + b_name +
      " must have the same shape, got " + a.shape().DebugString() +
      " and " + b.shape().DebugString()));
  return false;
}

}  // namespace
}  // namespace estimator_accum

#endif  // ESTIMATOR_ACCUM_NATIVE_COMMON_H_
