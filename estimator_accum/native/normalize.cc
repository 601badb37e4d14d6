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
//
// EaLayerNorm is the whole layer norm, normalization * gamma + beta, in
// the same passes (TensorFlow's Mul and AddV2 after EaNormalize, their
// values bit for bit), with `twins: 1` also its output rounded to bfloat16
// (as a Cast) for the bfloat16 product that reads it. Its gradient takes
// both outputs' gradients (the twin's widened and added, as the Cast's
// gradient and an AddN) and gives the input's (EaNormalizeGrad's values
// on the gradient times gamma) and gamma's and beta's, summed in float
// within fixed blocks of 64 rows, then in double over the blocks (the
// same on any number of threads).
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

// The layer norm's shapes: `inputs` (rank >= 1), its gamma and beta
// vectors of its last dimension; outputs the inputs' shape (`twins` + 1
// of them) then the rows' statistics.
absl::Status LayerNormShape(InferenceContext* c) {
  ShapeHandle inputs, rows, gamma, beta;
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &inputs));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &gamma));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &beta));
  TF_RETURN_IF_ERROR(c->Merge(gamma, beta, &gamma));
  TF_RETURN_IF_ERROR(MergeLastDimension(c, inputs, gamma));
  TF_RETURN_IF_ERROR(RowShape(c, inputs, &rows));
  const int outputs = c->num_outputs();
  for (int i = 0; i < outputs - 2; ++i) c->set_output(i, inputs);
  c->set_output(outputs - 2, rows);
  c->set_output(outputs - 1, rows);
  return absl::OkStatus();
}

REGISTER_OP("EaLayerNorm")
    .Input("inputs: float")
    .Input("gamma: float")
    .Input("beta: float")
    .Attr("epsilon: float")
    .Attr("twins: int >= 0 = 0")
    .Output("outputs: float")
    .Output("narrow: twins * bfloat16")
    .Output("mean: float")
    .Output("rstd: float")
    .SetShapeFn(LayerNormShape);

REGISTER_OP("EaLayerNormGrad")
    .Input("gradients: float")
    .Input("narrow_gradients: twins * bfloat16")
    .Input("inputs: float")
    .Input("gamma: float")
    .Input("mean: float")
    .Input("rstd: float")
    .Attr("twins: int >= 0 = 0")
    .Output("backprops: float")
    .Output("gamma_gradient: float")
    .Output("beta_gradient: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle shape;
      TF_RETURN_IF_ERROR(c->Merge(c->input(0), c->input(c->num_inputs() - 4),
                                  &shape));
      c->set_output(0, shape);
      c->set_output(1, c->input(c->num_inputs() - 3));
      c->set_output(2, c->input(c->num_inputs() - 3));
      return absl::OkStatus();
    });

TensorShape RowStatisticsShape(const Tensor& inputs) {
  TensorShape shape = inputs.shape();
  shape.set_dim(shape.dims() - 1, 1);
  return shape;
}

// False, with an error, where `mean` and `rstd` are not the rows'
// statistics of `inputs`.
bool StatisticsFit(OpKernelContext* context, const Tensor& inputs,
                   const Tensor& mean, const Tensor& rstd) {
  const TensorShape statistics = RowStatisticsShape(inputs);
  if (mean.shape() == statistics && rstd.shape() == statistics) return true;
  context->CtxFailure(absl::InvalidArgumentError(
      "mean and rstd must have the shape " + statistics.DebugString() +
      " of inputs' rows, got " + mean.shape().DebugString() + " and " +
      rstd.shape().DebugString()));
  return false;
}

// A row of `width` floats as a 1-D Eigen tensor: its full sum runs the
// same InnerMostDimReducer, in the same lane order, as TensorFlow's sum of
// a matrix's rows.
using Row = Eigen::TensorMap<Eigen::Tensor<const float, 1, Eigen::RowMajor>>;

// Allocates the rows' mean and rstd (outputs `first` and `first` + 1)
// and fills them for `inputs` ([rows, width] floats, width > 0): the
// mean, then 1 / sqrt(variance + epsilon), as TensorFlow's ops compute
// them. False where an allocation failed (the error is on the context).
bool Statistics(OpKernelContext* context, const Tensor& inputs, int first,
                float epsilon, int64_t rows, int64_t width, float** mean,
                float** rstd) {
  Tensor *mean_out, *rstd_out;
  if (!Ok(context, context->allocate_output(
          first, RowStatisticsShape(inputs), &mean_out)) ||
      !Ok(context, context->allocate_output(
          first + 1, RowStatisticsShape(inputs), &rstd_out))) {
    return false;
  }
  *mean = mean_out->flat<float>().data();
  *rstd = rstd_out->flat<float>().data();
  if (inputs.NumElements() == 0) {
    // No element to normalize; rows of width 0 have a mean of 0/0.
    mean_out->flat<float>().setConstant(
        std::numeric_limits<float>::quiet_NaN());
    rstd_out->flat<float>().setConstant(
        std::numeric_limits<float>::quiet_NaN());
    return true;
  }
  const float* x = inputs.flat<float>().data();
  float *m_out = *mean, *r_out = *rstd;
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
      m_out[i] = m;
      sum = (row - row.constant(m)).square().sum();
      r_out[i] = sum() / count;
    }
  });
  // 1 / sqrt(variance + epsilon) over the rows as one vector, as
  // TensorFlow's AddV2 and Rsqrt take it (their vector lanes and last
  // scalars fall on the same rows).
  Column statistics(r_out, rows);
  statistics.device(context->eigen_device<Eigen::ThreadPoolDevice>()) =
      (statistics + epsilon).rsqrt();
  return true;
}

// One row's normalization gradient from its gradient `dy`, inputs `x`,
// mean `m` and rstd `r` (`width` of each), into `dx`: the closed form,
// the row's two means in double (it subtracts them from each element, so
// their rounding would reach every one).
void RowBackward(const float* __restrict dy, const float* __restrict x,
                 float m, float r, int64_t width, float* __restrict dx) {
  Eigen::Tensor<double, 0, Eigen::RowMajor> sum;
  Row g(dy, width), row(x, width);
  sum = g.cast<double>().sum();
  const float g_mean = static_cast<float>(sum() / width);
  sum = (g.cast<double>() * (row - row.constant(m)).cast<double>()).sum();
  const float c_scale =
      static_cast<float>(static_cast<double>(r) * r * (sum() / width));
  for (int64_t j = 0; j < width; ++j) {
    dx[j] = r * (dy[j] - g_mean - (x[j] - m) * c_scale);
  }
}

// False, with an error, where `twins` is neither 0 nor 1.
bool TwinsAttr(OpKernelConstruction* context, int* twins) {
  if (!Ok(context, context->GetAttr("twins", twins))) return false;
  if (*twins == 0 || *twins == 1) return true;
  context->CtxFailure(absl::InvalidArgumentError(
      "twins must be 0 or 1 (a bfloat16 copy of the output or none), got " +
      std::to_string(*twins)));
  return false;
}

// g = dy + the bfloat16 `narrow` widened, `width` of each.
void Widened(const float* __restrict dy, const uint16_t* __restrict narrow,
             int64_t width, float* __restrict g) {
  for (int64_t j = 0; j < width; ++j) g[j] = dy[j] + Widen(narrow[j]);
}

// One row of the layer norm's gradient `g` (inputs `x`, mean `m`, rstd
// `r`): adds gamma's (g times the normalized input: Mul, then Sum) and
// beta's (g: Sum) into the sums, and gives the normalization's gradient
// (g times gamma: Mul) in `h`.
void GammaBetaAndScaled(const float* __restrict g, const float* __restrict x,
                        float m, float r, const float* __restrict gamma,
                        int64_t width, float* __restrict gamma_sum,
                        float* __restrict beta_sum, float* __restrict h) {
  for (int64_t j = 0; j < width; ++j) {
    gamma_sum[j] += g[j] * ((x[j] - m) * r);
    beta_sum[j] += g[j];
    h[j] = g[j] * gamma[j];
  }
}

class NormalizeOp : public OpKernel {
 public:
  explicit NormalizeOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("epsilon", &epsilon_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& inputs = context->input(0);
    int64_t rows, width;
    if (!RowsAndWidth(context, inputs, "inputs", &rows, &width)) return;
    Tensor* outputs = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, inputs.shape(), &outputs));
    float *mean, *rstd;
    if (!Statistics(context, inputs, 1, epsilon_, rows, width, &mean, &rstd) ||
        inputs.NumElements() == 0) {
      return;
    }
    const float* x = inputs.flat<float>().data();
    float* y = outputs->flat<float>().data();
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
    if (!StatisticsFit(context, inputs, mean_in, rstd_in)) return;
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
      for (int64_t i = begin; i < end; ++i) {
        RowBackward(dy + i * width, x + i * width, mean[i], rstd[i], width,
                    dx + i * width);
      }
    });
  }
};

class LayerNormOp : public OpKernel {
 public:
  explicit LayerNormOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("epsilon", &epsilon_));
    if (!TwinsAttr(context, &twins_)) return;
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& inputs = context->input(0);
    const Tensor& gamma = context->input(1);
    const Tensor& beta = context->input(2);
    int64_t rows, width;
    if (!RowsAndWidth(context, inputs, "inputs", &rows, &width) ||
        !IsVectorOfWidth(context, gamma, "gamma", "inputs", width) ||
        !IsVectorOfWidth(context, beta, "beta", "inputs", width)) {
      return;
    }
    Tensor *outputs, *narrow = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, inputs.shape(), &outputs));
    if (twins_) {
      OP_REQUIRES_OK(context,
                     context->allocate_output(1, inputs.shape(), &narrow));
    }
    float *mean, *rstd;
    if (!Statistics(context, inputs, 1 + twins_, epsilon_, rows, width, &mean,
                    &rstd) ||
        inputs.NumElements() == 0) {
      return;
    }
    const float* x = inputs.flat<float>().data();
    const float* g = gamma.flat<float>().data();
    const float* b = beta.flat<float>().data();
    float* y = outputs->flat<float>().data();
    uint16_t* n = narrow ? Bits(narrow) : nullptr;
    Sharded(context, rows, width * 5, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const float m = mean[i], r = rstd[i];
        const float* __restrict in = x + i * width;
        float* __restrict out = y + i * width;
        // As Sub and Mul, then Mul by gamma and AddV2 of beta.
        for (int64_t j = 0; j < width; ++j) {
          out[j] = (in[j] - m) * r * g[j] + b[j];
        }
        if (n == nullptr) continue;
        uint16_t* __restrict twin = n + i * width;
        for (int64_t j = 0; j < width; ++j) twin[j] = Narrow(out[j]);
      }
    });
  }

 private:
  float epsilon_;
  int twins_ = 0;
};

class LayerNormGradOp : public OpKernel {
 public:
  explicit LayerNormGradOp(OpKernelConstruction* context)
      : OpKernel(context) {
    if (!TwinsAttr(context, &twins_)) return;
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& gradients = context->input(0);
    const Tensor* narrow = twins_ ? &context->input(1) : nullptr;
    const Tensor& inputs = context->input(1 + twins_);
    const Tensor& gamma = context->input(2 + twins_);
    const Tensor& mean_in = context->input(3 + twins_);
    const Tensor& rstd_in = context->input(4 + twins_);
    if (!SameShape(context, gradients, "gradients", inputs, "inputs")) return;
    if (narrow && !SameShape(context, *narrow, "narrow_gradients", inputs,
                             "inputs")) {
      return;
    }
    int64_t rows, width;
    if (!RowsAndWidth(context, inputs, "inputs", &rows, &width) ||
        !IsVectorOfWidth(context, gamma, "gamma", "inputs", width) ||
        !StatisticsFit(context, inputs, mean_in, rstd_in)) {
      return;
    }
    Tensor *backprops, *gamma_gradient, *beta_gradient;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, inputs.shape(), &backprops));
    OP_REQUIRES_OK(context, context->allocate_output(1, gamma.shape(),
                                                     &gamma_gradient));
    OP_REQUIRES_OK(context, context->allocate_output(2, gamma.shape(),
                                                     &beta_gradient));
    const float* dy = gradients.flat<float>().data();
    const uint16_t* dn = narrow ? Bits(*narrow) : nullptr;
    const float* x = inputs.flat<float>().data();
    const float* gm = gamma.flat<float>().data();
    const float* mean = mean_in.flat<float>().data();
    const float* rstd = rstd_in.flat<float>().data();
    float* dx = backprops->flat<float>().data();
    float* sums[] = {gamma_gradient->flat<float>().data(),
                     beta_gradient->flat<float>().data()};
    // gamma's and beta's sums in float over each block's rows, then in
    // double over the blocks.
    ColumnSums(context, rows, width, 2, /*cost=*/16, sums,
               [&](int64_t begin, int64_t end, double* __restrict sum) {
      // The block's sums (gamma's, then beta's: `sum`'s layout), then a
      // row's gradient with the twin's and its product with gamma.
      std::vector<float> buffers(4 * width, 0.0f);
      float* block_sums = buffers.data();
      float* __restrict gamma_sum = block_sums;
      float* __restrict beta_sum = block_sums + width;
      float* __restrict g = block_sums + 2 * width;
      float* __restrict h = g + width;
      for (int64_t i = begin; i < end; ++i) {
        const float* xi = x + i * width;
        const float* gi = dy + i * width;
        if (dn != nullptr) {
          // The output's gradient and (AddN) the twin's, widened (the
          // Cast's gradient).
          Widened(gi, dn + i * width, width, g);
          gi = g;
        }
        GammaBetaAndScaled(gi, xi, mean[i], rstd[i], gm, width, gamma_sum,
                           beta_sum, h);
        RowBackward(h, xi, mean[i], rstd[i], width, dx + i * width);
      }
      for (int64_t j = 0; j < 2 * width; ++j) sum[j] += block_sums[j];
    });
  }

 private:
  int twins_ = 0;
};

REGISTER_KERNEL_BUILDER(
    Name("EaNormalize").Device(::tensorflow::DEVICE_CPU), NormalizeOp);
REGISTER_KERNEL_BUILDER(
    Name("EaNormalizeGrad").Device(::tensorflow::DEVICE_CPU),
    NormalizeGradOp);
REGISTER_KERNEL_BUILDER(
    Name("EaLayerNorm").Device(::tensorflow::DEVICE_CPU), LayerNormOp);
REGISTER_KERNEL_BUILDER(
    Name("EaLayerNormGrad").Device(::tensorflow::DEVICE_CPU),
    LayerNormGradOp);

}  // namespace
}  // namespace estimator_accum
