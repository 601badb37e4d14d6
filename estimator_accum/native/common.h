// What the native kernels' sources share: TensorFlow's headers, the names
// they use from it, work split over TensorFlow's CPU threads, a tensor's
// rows and width, the checks that two inputs have one shape and that a
// vector has a tensor's width, keyed dropout's keep test and attributes,
// and bfloat16's conversions. In an anonymous namespace: each unit of sources
// (built with its own vector flags) keeps its own copy.
#ifndef ESTIMATOR_ACCUM_NATIVE_COMMON_H_
#define ESTIMATOR_ACCUM_NATIVE_COMMON_H_

#ifndef EIGEN_USE_THREADS
#define EIGEN_USE_THREADS
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
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
using ::tensorflow::bfloat16;
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

// Whether `vector` (the argument `name`) is a vector of `width`, the last
// dimension of the argument `of`; else false, with an error on the
// context: "<name> must be a vector of the <of>' last dimension ...".
inline bool IsVectorOfWidth(OpKernelContext* context, const Tensor& vector,
                            const char* name, const char* of,
                            int64_t width) {
  if (vector.dims() == 1 && vector.dim_size(0) == width) return true;
  context->CtxFailure(absl::InvalidArgumentError(
      std::string(name) + " must be a vector of the " + of +
      "' last dimension " + std::to_string(width) + ", got shape " +
      vector.shape().DebugString()));
  return false;
}

// Shape functions: merges the last dimension of `shape` (rank >= 1, or
// unknown) with the length of `vector` (rank 1).
inline absl::Status MergeLastDimension(InferenceContext* c, ShapeHandle shape,
                                       ShapeHandle vector) {
  if (!c->RankKnown(shape)) return absl::OkStatus();
  ::tensorflow::shape_inference::DimensionHandle width;
  return c->Merge(c->Dim(shape, -1), c->Dim(vector, 0), &width);
}

// Whether `status` is OK; else false, with it on the context (a kernel's
// or its construction's).
template <typename Context>
bool Ok(Context* context, const absl::Status& status) {
  if (status.ok()) return true;
  context->CtxFailure(status);
  return false;
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

// Column sums over rows, over fixed blocks of 64 rows on TensorFlow's
// threads, the blocks' sums (double) then added in order: the same sums
// on any number of threads. `block(begin, end, sums)` adds rows
// [begin, end)'s `count` vectors of `width` into sums[c * width + j]
// (zeros at first); `outputs[c]` (`width` floats) get the totals. `cost`
// is an element's.
template <typename Block>
void ColumnSums(OpKernelContext* context, int64_t rows, int64_t width,
                int count, int64_t cost, float* const* outputs, Block block) {
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (rows + kBlock - 1) / kBlock;
  const int64_t stride = count * width;
  std::vector<double> partial(blocks * stride, 0.0);
  Sharded(context, blocks, kBlock * width * cost,
          [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      block(b * kBlock, std::min(rows, (b + 1) * kBlock),
            partial.data() + b * stride);
    }
  });
  for (int c = 0; c < count; ++c) {
    for (int64_t j = 0; j < width; ++j) {
      double total = 0.0;
      for (int64_t b = 0; b < blocks; ++b) {
        total += partial[b * stride + c * width + j];
      }
      outputs[c][j] = static_cast<float>(total);
    }
  }
}

// bfloat16's bits widened to float (exact), and a float rounded to the
// nearest bfloat16, ties to even, NaN to a quiet NaN of its sign: Eigen's
// conversions (TensorFlow's Cast), in plain arithmetic the compiler
// vectorizes.
inline float Widen(uint16_t bits) {
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

inline uint16_t Narrow(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  const uint32_t rounded = (word + 0x7fffu + ((word >> 16) & 1u)) >> 16;
  const uint32_t nan = ((word >> 16) & 0x8000u) | 0x7fc0u;
  // A select, not a branch: the loops around it stay vectorized.
  return static_cast<uint16_t>((word & 0x7fffffffu) > 0x7f800000u ? nan
                                                                  : rounded);
}

// Keyed dropout's keep test (estimator_accum.window.keyed_dropout): all
// ones where lowbias32 of a row's word xor a column's word, without its
// last xor-shift (the test reads the high bits), is at least `threshold`,
// else zero: a mask for a float's bits (a dropped element is +0.0, inf
// and NaN too, as tf.where's), branch-free for the loops around it.
inline uint32_t KeepMask(uint32_t row_word, uint32_t column_word,
                         uint32_t threshold) {
  uint32_t h = row_word ^ column_word;
  h ^= h >> 16;
  h *= 0x7FEB352Du;
  h ^= h >> 15;
  h *= 0x846CA68Bu;
  return 0u - static_cast<uint32_t>(h >= threshold);
}

// `value` * `scale` where `keep` (KeepMask) is all ones, else +0.0.
inline float Dropped(float value, float scale, uint32_t keep) {
  return __builtin_bit_cast(float,
                            __builtin_bit_cast(uint32_t, value * scale) & keep);
}

// Keyed dropout's attributes: `threshold` (the keep test's bound, in
// [0, 2**32)) and `scale`; false, with an error naming the threshold and
// its value, where it is out of range.
inline bool DropoutAttrs(OpKernelConstruction* context, uint32_t* threshold,
                         float* scale) {
  int64_t value;
  if (!Ok(context, context->GetAttr("threshold", &value)) ||
      !Ok(context, context->GetAttr("scale", scale))) {
    return false;
  }
  if (value < 0 || value > 0xFFFFFFFFll) {
    context->CtxFailure(absl::InvalidArgumentError(
        "threshold must be in [0, 2**32), got " + std::to_string(value)));
    return false;
  }
  *threshold = static_cast<uint32_t>(value);
  return true;
}

// Whether keyed dropout's `rows` words hold one for each row of `of` (the
// argument `of_name`: its shape without the last axis) and its `columns`
// words one for each of its `width` columns; else false, with an error
// naming them.
inline bool DropoutWordsFit(OpKernelContext* context, const Tensor& of,
                            const char* of_name, const Tensor& rows,
                            const Tensor& columns, int64_t width) {
  if (columns.dims() != 1 || columns.dim_size(0) != width) {
    context->CtxFailure(absl::InvalidArgumentError(
        std::string("columns must hold one word a column of ") + of_name +
        ", got shape " + columns.shape().DebugString()));
    return false;
  }
  bool fits = rows.dims() == of.dims() - 1;
  for (int axis = 0; fits && axis < rows.dims(); ++axis) {
    fits = rows.dim_size(axis) == of.dim_size(axis);
  }
  if (fits) return true;
  context->CtxFailure(absl::InvalidArgumentError(
      std::string("rows must have the shape of ") + of_name +
      " without its last axis, got " + rows.shape().DebugString() +
      " for " + of.shape().DebugString()));
  return false;
}

// A bfloat16 tensor's elements as their bits.
inline const uint16_t* Bits(const Tensor& tensor) {
  return reinterpret_cast<const uint16_t*>(tensor.flat<bfloat16>().data());
}

inline uint16_t* Bits(Tensor* tensor) {
  return reinterpret_cast<uint16_t*>(tensor->flat<bfloat16>().data());
}

}  // namespace
}  // namespace estimator_accum

#endif  // ESTIMATOR_ACCUM_NATIVE_COMMON_H_
