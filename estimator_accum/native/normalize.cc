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
//
// EaResidualLayerNorm is a transformer's residual block after its dense
// product, in the same passes: the product (bfloat16, widened, with its
// bias; or float32, its bias added by oneDNN's product), keyed dropout
// (EaKeyedDropout's masks), the residual's add and the layer norm; its
// gradient gives the residual's, the product's (in its dtype) and the
// bias's, gamma's and beta's. The values of EaBiasWiden, EaKeyedDropout,
// AddV2 and EaLayerNorm bit for bit, forward and backward (the bias's
// gradient summed as EaBiasWidenGrad sums it).
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

// A layer norm's outputs' shapes: the inputs' (the output and its twins),
// the rows' mean and rstd, then `sums` more of the inputs' shape.
absl::Status LayerNormOutputs(InferenceContext* c, ShapeHandle inputs,
                              int sums) {
  ShapeHandle rows;
  TF_RETURN_IF_ERROR(RowShape(c, inputs, &rows));
  const int outputs = c->num_outputs();
  for (int i = 0; i < outputs; ++i) {
    const bool statistic = i >= outputs - 2 - sums && i < outputs - sums;
    c->set_output(i, statistic ? rows : inputs);
  }
  return absl::OkStatus();
}

// The layer norm's shapes: `inputs` (rank >= 1), its gamma and beta
// vectors of its last dimension; outputs the inputs' shape (`twins` + 1
// of them) then the rows' statistics.
absl::Status LayerNormShape(InferenceContext* c) {
  ShapeHandle inputs, gamma, beta;
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &inputs));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &gamma));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &beta));
  TF_RETURN_IF_ERROR(c->Merge(gamma, beta, &gamma));
  TF_RETURN_IF_ERROR(MergeLastDimension(c, inputs, gamma));
  return LayerNormOutputs(c, inputs, /*sums=*/0);
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

// The residual layer norm's shapes: `products` (rank >= 1), a `bias`
// vector of its last dimension where `biases` is 1, the `residual` of its
// shape, gamma and beta vectors of its last dimension, dropout's `rows`
// words (its shape without the last axis) and `columns` words (a vector
// of its last dimension); outputs its shape (`twins` + 1 of them), the
// rows' statistics, then its shape (the sum the layer norm normalized).
absl::Status ResidualLayerNormShape(InferenceContext* c) {
  int biases;
  TF_RETURN_IF_ERROR(c->GetAttr("biases", &biases));
  ShapeHandle inputs, vector, leading;
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &inputs));
  TF_RETURN_IF_ERROR(c->Merge(inputs, c->input(1 + biases), &inputs));
  for (int i = 0; i < biases; ++i) {
    TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &vector));
    TF_RETURN_IF_ERROR(MergeLastDimension(c, inputs, vector));
  }
  for (int i = 2 + biases; i <= 3 + biases; ++i) {
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &vector));
    TF_RETURN_IF_ERROR(MergeLastDimension(c, inputs, vector));
  }
  TF_RETURN_IF_ERROR(c->WithRank(c->input(5 + biases), 1, &vector));
  TF_RETURN_IF_ERROR(MergeLastDimension(c, inputs, vector));
  if (c->RankKnown(inputs)) {
    TF_RETURN_IF_ERROR(c->Subshape(inputs, 0, -1, &leading));
    TF_RETURN_IF_ERROR(c->Merge(leading, c->input(4 + biases), &leading));
  }
  return LayerNormOutputs(c, inputs, /*sums=*/1);
}

REGISTER_OP("EaResidualLayerNorm")
    .Input("products: T")
    .Input("bias: biases * float")
    .Input("residual: float")
    .Input("gamma: float")
    .Input("beta: float")
    .Input("rows: uint32")
    .Input("columns: uint32")
    .Attr("T: {float, bfloat16}")
    .Attr("biases: int >= 0 = 0")
    .Attr("epsilon: float")
    .Attr("threshold: int")
    .Attr("scale: float")
    .Attr("twins: int >= 0 = 0")
    .Output("outputs: float")
    .Output("narrow: twins * bfloat16")
    .Output("mean: float")
    .Output("rstd: float")
    .Output("sums: float")
    .SetShapeFn(ResidualLayerNormShape);

REGISTER_OP("EaResidualLayerNormGrad")
    .Input("gradients: float")
    .Input("narrow_gradients: twins * bfloat16")
    .Input("sums: float")
    .Input("gamma: float")
    .Input("mean: float")
    .Input("rstd: float")
    .Input("rows: uint32")
    .Input("columns: uint32")
    .Attr("T: {float, bfloat16}")
    .Attr("biases: int >= 0 = 0")
    .Attr("threshold: int")
    .Attr("scale: float")
    .Attr("twins: int >= 0 = 0")
    .Output("residual_gradient: float")
    .Output("products_gradient: T")
    .Output("bias_gradient: biases * float")
    .Output("gamma_gradient: float")
    .Output("beta_gradient: float")
    .SetShapeFn([](InferenceContext* c) {
      const int twins = c->num_inputs() - 7;
      ShapeHandle shape;
      TF_RETURN_IF_ERROR(c->Merge(c->input(0), c->input(1 + twins), &shape));
      const int outputs = c->num_outputs();
      c->set_output(0, shape);
      c->set_output(1, shape);
      for (int i = 2; i < outputs; ++i) {
        c->set_output(i, c->input(2 + twins));
      }
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

// The layer norm's output of `inputs` ([rows, width] floats) from its
// rows' `mean` and `rstd`: (x - mean) * rstd * gamma + beta, and where
// `narrow` is given, that rounded to bfloat16 (a Cast) into it.
void ScaleAndShift(OpKernelContext* context, const Tensor& inputs,
                   const float* mean, const float* rstd, const Tensor& gamma,
                   const Tensor& beta, Tensor* outputs, Tensor* narrow,
                   int64_t rows, int64_t width) {
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

// A layer norm gradient's first inputs: the output's gradient, the twin's
// (`twins` of them), the layer norm's input (the op's argument `name`),
// gamma and the rows' statistics; `Read` checks their shapes (false, with
// an error naming them, where one does not fit).
struct GradientInputs {
  const Tensor *gradients, *narrow, *inputs, *gamma, *mean, *rstd;
  int64_t rows, width;

  bool Read(OpKernelContext* context, int twins, const char* name) {
    gradients = &context->input(0);
    narrow = twins ? &context->input(1) : nullptr;
    inputs = &context->input(1 + twins);
    gamma = &context->input(2 + twins);
    mean = &context->input(3 + twins);
    rstd = &context->input(4 + twins);
    return SameShape(context, *gradients, "gradients", *inputs, name) &&
           (narrow == nullptr ||
            SameShape(context, *narrow, "narrow_gradients", *inputs,
                      name)) &&
           RowsAndWidth(context, *inputs, name, &rows, &width) &&
           IsVectorOfWidth(context, *gamma, "gamma", name, width) &&
           StatisticsFit(context, *inputs, *mean, *rstd);
  }
};

// The layer norm's backward pass over the rows of `in`: for each row i,
// its output's gradient (plus the bfloat16 twin's widened, where given),
// input, mean and rstd give the input's gradient into `dx`; gamma's and
// beta's gradients are summed in float over each block of rows, then in
// double over the blocks, into outputs[0] and outputs[1]. `after(i,
// dx_row, sum)` then reads the row's input gradient, with `sum` the
// block's doubles past gamma's and beta's (`extra` vectors of `width`
// more sums, outputs[2...]).
template <typename After>
void LayerNormBackward(OpKernelContext* context, const GradientInputs& in,
                       float* dx, float* const* outputs, int extra,
                       int64_t cost, After after) {
  const float* dy = in.gradients->flat<float>().data();
  const uint16_t* dn = in.narrow ? Bits(*in.narrow) : nullptr;
  const float* x = in.inputs->flat<float>().data();
  const float* gm = in.gamma->flat<float>().data();
  const float* mean = in.mean->flat<float>().data();
  const float* rstd = in.rstd->flat<float>().data();
  const int64_t rows = in.rows, width = in.width;
  ColumnSums(context, rows, width, 2 + extra, cost, outputs,
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
      after(i, dx + i * width, sum + 2 * width);
    }
    for (int64_t j = 0; j < 2 * width; ++j) sum[j] += block_sums[j];
  });
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
    ScaleAndShift(context, inputs, mean, rstd, gamma, beta, outputs, narrow,
                  rows, width);
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
    GradientInputs in;
    if (!in.Read(context, twins_, "inputs")) return;
    Tensor *backprops, *gamma_gradient, *beta_gradient;
    OP_REQUIRES_OK(context, context->allocate_output(0, in.inputs->shape(),
                                                     &backprops));
    OP_REQUIRES_OK(context, context->allocate_output(1, in.gamma->shape(),
                                                     &gamma_gradient));
    OP_REQUIRES_OK(context, context->allocate_output(2, in.gamma->shape(),
                                                     &beta_gradient));
    float* sums[] = {gamma_gradient->flat<float>().data(),
                     beta_gradient->flat<float>().data()};
    LayerNormBackward(context, in, backprops->flat<float>().data(), sums,
                      /*extra=*/0, /*cost=*/16,
                      [](int64_t, const float*, double*) {});
  }

 private:
  int twins_ = 0;
};

// A float32 or bfloat16 tensor's elements, and their conversions to and
// from float (bfloat16's as TensorFlow's Cast; float's none).
template <typename T>
struct Elements;

template <>
struct Elements<float> {
  using Type = float;
  static const float* Of(const Tensor& tensor) {
    return tensor.flat<float>().data();
  }
  static float* Of(Tensor* tensor) { return tensor->flat<float>().data(); }
  static float Load(float value) { return value; }
  static float Store(float value) { return value; }
};

template <>
struct Elements<bfloat16> {
  using Type = uint16_t;
  static const uint16_t* Of(const Tensor& tensor) { return Bits(tensor); }
  static uint16_t* Of(Tensor* tensor) { return Bits(tensor); }
  static float Load(uint16_t bits) { return Widen(bits); }
  static uint16_t Store(float value) { return Narrow(value); }
};

// The residual layer norm's attributes: `biases` and `twins` (0 or 1
// each), keyed dropout's `threshold` and `scale`; false with an error
// where one is out of range.
struct ResidualAttributes {
  int biases = 0;
  int twins = 0;
  uint32_t threshold = 0;
  float scale = 1.0f;

  bool Read(OpKernelConstruction* context) {
    if (!TwinsAttr(context, &twins) ||
        !Ok(context, context->GetAttr("biases", &biases)) ||
        !DropoutAttrs(context, &threshold, &scale)) {
      return false;
    }
    if (biases != 0 && biases != 1) {
      context->CtxFailure(absl::InvalidArgumentError(
          "biases must be 0 or 1 (a bias added to the products or none), "
          "got " + std::to_string(biases)));
      return false;
    }
    return true;
  }
};

// EaResidualLayerNorm: the layer norm of keyed dropout of (products
// widened, plus bias) plus the residual, `sums` that sum. The ops it
// replaces: EaBiasWiden (or a float32 product's BiasAdd, fused into it by
// Grappler, before this op), EaKeyedDropout, AddV2 and EaLayerNorm; their
// values bit for bit (the same float arithmetic, in their order).
template <typename T>
class ResidualLayerNormOp : public OpKernel {
 public:
  explicit ResidualLayerNormOp(OpKernelConstruction* context)
      : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("epsilon", &epsilon_));
    attributes_.Read(context);
  }

  void Compute(OpKernelContext* context) override {
    const int biases = attributes_.biases, twins = attributes_.twins;
    const Tensor& products = context->input(0);
    const Tensor& residual = context->input(1 + biases);
    const Tensor& gamma = context->input(2 + biases);
    const Tensor& beta = context->input(3 + biases);
    const Tensor& row_words = context->input(4 + biases);
    const Tensor& column_words = context->input(5 + biases);
    int64_t rows, width;
    if (!RowsAndWidth(context, products, "products", &rows, &width) ||
        (biases && !IsVectorOfWidth(context, context->input(1), "bias",
                                    "products", width)) ||
        !SameShape(context, residual, "residual", products, "products") ||
        !IsVectorOfWidth(context, gamma, "gamma", "products", width) ||
        !IsVectorOfWidth(context, beta, "beta", "products", width) ||
        !DropoutWordsFit(context, products, "products", row_words,
                         column_words, width)) {
      return;
    }
    Tensor *outputs, *narrow = nullptr, *sums;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, products.shape(), &outputs));
    if (twins) {
      OP_REQUIRES_OK(context,
                     context->allocate_output(1, products.shape(), &narrow));
    }
    OP_REQUIRES_OK(context, context->allocate_output(3 + twins,
                                                     products.shape(), &sums));
    using E = Elements<T>;
    const typename E::Type* p = E::Of(products);
    const float* b = biases ? context->input(1).flat<float>().data() : nullptr;
    const float* r = residual.flat<float>().data();
    const uint32_t* words = row_words.flat<uint32_t>().data();
    const uint32_t* column = column_words.flat<uint32_t>().data();
    float* x = sums->flat<float>().data();
    const uint32_t threshold = attributes_.threshold;
    const float scale = attributes_.scale;
    Sharded(context, rows, width * 12, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const typename E::Type* __restrict pi = p + i * width;
        const float* __restrict ri = r + i * width;
        float* __restrict xi = x + i * width;
        const uint32_t word = words[i];
        // As Cast and AddV2 (EaBiasWiden), EaKeyedDropout, then AddV2 of
        // the residual.
        if (b != nullptr) {
          for (int64_t j = 0; j < width; ++j) {
            xi[j] = Dropped(E::Load(pi[j]) + b[j], scale,
                            KeepMask(word, column[j], threshold)) +
                    ri[j];
          }
        } else {
          for (int64_t j = 0; j < width; ++j) {
            xi[j] = Dropped(E::Load(pi[j]), scale,
                            KeepMask(word, column[j], threshold)) +
                    ri[j];
          }
        }
      }
    });
    float *mean, *rstd;
    if (!Statistics(context, *sums, 1 + twins, epsilon_, rows, width, &mean,
                    &rstd) ||
        products.NumElements() == 0) {
      return;
    }
    ScaleAndShift(context, *sums, mean, rstd, gamma, beta, outputs, narrow,
                  rows, width);
  }

 private:
  float epsilon_;
  ResidualAttributes attributes_;
};

// Its gradient: EaLayerNormGrad's (the residual's gradient, gamma's and
// beta's), then the dropout's mask and scale on it (EaKeyedDropout) as
// the products' gradient, rounded to bfloat16 (EaBiasWidenGrad's Cast)
// where they are, and the bias's: that gradient's columns summed in double
// over the same blocks of rows as EaBiasWidenGrad's. The same values bit
// for bit as those ops'.
template <typename T>
class ResidualLayerNormGradOp : public OpKernel {
 public:
  explicit ResidualLayerNormGradOp(OpKernelConstruction* context)
      : OpKernel(context) {
    attributes_.Read(context);
  }

  void Compute(OpKernelContext* context) override {
    const int biases = attributes_.biases, twins = attributes_.twins;
    GradientInputs in;
    if (!in.Read(context, twins, "sums")) return;
    const Tensor& inputs = *in.inputs;
    const Tensor& gamma = *in.gamma;
    const int64_t width = in.width;
    const Tensor& row_words = context->input(5 + twins);
    const Tensor& column_words = context->input(6 + twins);
    if (!DropoutWordsFit(context, inputs, "sums", row_words, column_words,
                         width)) {
      return;
    }
    Tensor *backprops, *products_gradient, *bias_gradient = nullptr;
    Tensor *gamma_gradient, *beta_gradient;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, inputs.shape(), &backprops));
    OP_REQUIRES_OK(context, context->allocate_output(1, inputs.shape(),
                                                     &products_gradient));
    if (biases) {
      OP_REQUIRES_OK(context, context->allocate_output(2, gamma.shape(),
                                                       &bias_gradient));
    }
    OP_REQUIRES_OK(context, context->allocate_output(2 + biases,
                                                     gamma.shape(),
                                                     &gamma_gradient));
    OP_REQUIRES_OK(context, context->allocate_output(3 + biases,
                                                     gamma.shape(),
                                                     &beta_gradient));
    using E = Elements<T>;
    typename E::Type* dp = E::Of(products_gradient);
    const uint32_t* words = row_words.flat<uint32_t>().data();
    const uint32_t* column = column_words.flat<uint32_t>().data();
    const uint32_t threshold = attributes_.threshold;
    const float scale = attributes_.scale;
    float* sums[] = {gamma_gradient->flat<float>().data(),
                     beta_gradient->flat<float>().data(),
                     biases ? bias_gradient->flat<float>().data() : nullptr};
    LayerNormBackward(
        context, in, backprops->flat<float>().data(), sums, biases,
        /*cost=*/24,
        [&](int64_t i, const float* __restrict dx, double* __restrict sum) {
          typename E::Type* __restrict out = dp + i * width;
          const uint32_t word = words[i];
          if (biases) {
            for (int64_t j = 0; j < width; ++j) {
              const float d =
                  Dropped(dx[j], scale, KeepMask(word, column[j], threshold));
              out[j] = E::Store(d);
              sum[j] += d;
            }
          } else {
            for (int64_t j = 0; j < width; ++j) {
              out[j] = E::Store(
                  Dropped(dx[j], scale, KeepMask(word, column[j], threshold)));
            }
          }
        });
  }

 private:
  ResidualAttributes attributes_;
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

// The residual layer norm and its gradient, for a product's dtype.
#define EA_REGISTER_RESIDUAL_LAYER_NORM(T)                              \
  REGISTER_KERNEL_BUILDER(Name("EaResidualLayerNorm")                   \
                              .Device(::tensorflow::DEVICE_CPU)         \
                              .TypeConstraint<T>("T"),                  \
                          ResidualLayerNormOp<T>);                      \
  REGISTER_KERNEL_BUILDER(Name("EaResidualLayerNormGrad")               \
                              .Device(::tensorflow::DEVICE_CPU)         \
                              .TypeConstraint<T>("T"),                  \
                          ResidualLayerNormGradOp<T>)

EA_REGISTER_RESIDUAL_LAYER_NORM(float);
EA_REGISTER_RESIDUAL_LAYER_NORM(bfloat16);

}  // namespace
}  // namespace estimator_accum
