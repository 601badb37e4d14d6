// Attention over unpadded tokens in one op, forward and backward.
//
// The layer's queries, keys and values come as one [tokens, hidden] matrix
// each, the real tokens of a batch's examples one after the other
// (`starts`: example b's rows are starts[b] .. starts[b + 1] - 1). For each
// example and head, the op computes the scores (q . k / divisor), their
// softmax over the example's own keys, keyed dropout of the probabilities
// (the same masks as `estimator_accum.keyed_dropout`, bit for bit: each
// element's lowbias32 of its query row's word xor its key column's word)
// and the context, written straight into the [tokens, hidden] output: no
// padding, no transposes into heads and back, no scatter into padded rows
// and gather out of them. The padded layout's attention gives the same
// function: a padded key's probability there is exp(-10000 + ...) = 0 in
// float32. It keeps the probabilities (before dropout) for the gradient.
// Built and loaded by estimator_accum/native/__init__.py.
#include <type_traits>

#include "common.h"
#include "Eigen/Core"

namespace estimator_accum {
namespace {

using RowMajor =
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Strided = Eigen::Map<RowMajor, 0, Eigen::OuterStride<>>;
using ConstStrided = Eigen::Map<const RowMajor, 0, Eigen::OuterStride<>>;
using Block = Eigen::Map<RowMajor>;

REGISTER_OP("EaAttention")
    .Input("query: float")
    .Input("key: float")
    .Input("value: float")
    .Input("starts: int32")
    .Input("positions: int32")
    .Input("rows: uint32")
    .Input("columns: uint32")
    .Attr("heads: int")
    .Attr("divisor: float")
    .Attr("threshold: int")
    .Attr("scale: float")
    .Output("context: float")
    .Output("probs: float")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    });

REGISTER_OP("EaAttentionGrad")
    .Input("query: float")
    .Input("key: float")
    .Input("value: float")
    .Input("starts: int32")
    .Input("positions: int32")
    .Input("rows: uint32")
    .Input("columns: uint32")
    .Input("probs: float")
    .Input("gradient: float")
    .Attr("heads: int")
    .Attr("divisor: float")
    .Attr("threshold: int")
    .Attr("scale: float")
    .Output("query_gradient: float")
    .Output("key_gradient: float")
    .Output("value_gradient: float")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      c->set_output(1, c->input(1));
      c->set_output(2, c->input(2));
      return absl::OkStatus();
    });

// What the forward and backward kernels share: the attributes, the checked
// inputs and each example's place among the kept probabilities.
class Attention {
 public:
  explicit Attention(OpKernelConstruction* context) {
    OP_REQUIRES_OK(context, context->GetAttr("heads", &heads_));
    OP_REQUIRES(context, heads_ >= 1,
                absl::InvalidArgumentError("heads must be at least 1"));
    OP_REQUIRES_OK(context, context->GetAttr("divisor", &divisor_));
    DropoutAttrs(context, &threshold_, &scale_);
  }

  // Checks the inputs; fills the sizes and `offsets_` (each example's
  // first kept probability). False (with the context's status) if bad.
  bool Prepare(OpKernelContext* context) {
    const Tensor& query = context->input(0);
    const Tensor& key = context->input(1);
    const Tensor& value = context->input(2);
    const Tensor& starts = context->input(3);
    const Tensor& positions = context->input(4);
    const Tensor& rows = context->input(5);
    const Tensor& columns = context->input(6);
    auto bad = [context](const char* why) {
      context->CtxFailure(__FILE__, __LINE__, absl::InvalidArgumentError(why));
      return false;
    };
    if (query.dims() != 2 || query.shape() != key.shape() ||
        query.shape() != value.shape()) {
      return bad("query, key and value must be [tokens, hidden] alike");
    }
    tokens_ = query.dim_size(0);
    hidden_ = query.dim_size(1);
    if (hidden_ % heads_ != 0) return bad("hidden must divide into heads");
    head_size_ = hidden_ / heads_;
    if (starts.dims() != 1 || starts.dim_size(0) < 1) {
      return bad("starts must be a vector [examples + 1]");
    }
    examples_ = starts.dim_size(0) - 1;
    starts_ = starts.flat<int32_t>().data();
    if (starts_[0] != 0 || starts_[examples_] != tokens_) {
      return bad("starts must begin at 0 and end at the token count");
    }
    offsets_.assign(examples_ + 1, 0);
    for (int64_t b = 0; b < examples_; ++b) {
      const int64_t n = starts_[b + 1] - starts_[b];
      if (n < 0) return bad("starts must not decrease");
      offsets_[b + 1] = offsets_[b] + heads_ * n * n;
    }
    dropout_ = rows.NumElements() > 0;
    length_ = 0;
    if (dropout_) {
      if (rows.dims() != 3 || rows.dim_size(0) != examples_ ||
          rows.dim_size(1) != heads_ || columns.dims() != 1 ||
          rows.dim_size(2) != columns.dim_size(0)) {
        return bad("rows must be [examples, heads, length] and columns "
                   "[length]");
      }
      length_ = columns.dim_size(0);
      if (positions.dims() != 1 || positions.dim_size(0) != tokens_) {
        return bad("positions must hold one position a token");
      }
      positions_ = positions.flat<int32_t>().data();
      for (int64_t t = 0; t < tokens_; ++t) {
        if (positions_[t] < 0 || positions_[t] >= length_) {
          return bad("a position is outside the rows' length");
        }
      }
      rows_ = rows.flat<uint32_t>().data();
      columns_ = columns.flat<uint32_t>().data();
    }
    return true;
  }

  // Example b's words for head h: its query rows' (`row_words`) and its
  // key columns' (`column_words`), n each.
  void Words(int64_t b, int64_t h, int64_t n, uint32_t* row_words,
             uint32_t* column_words) const {
    const int64_t first = starts_[b];
    const uint32_t* head_rows = rows_ + (b * heads_ + h) * length_;
    for (int64_t i = 0; i < n; ++i) {
      row_words[i] = head_rows[positions_[first + i]];
      column_words[i] = columns_[positions_[first + i]];
    }
  }

  // out[j] = in[j] * scale_ where element (row, column j) is kept, else
  // +0.0 (as keyed_dropout.cc: the words' bits cleared; `in` may be
  // `out`), in a branch-free loop the compiler vectorizes.
  inline void Drop(uint32_t row_word, const uint32_t* __restrict columns,
                   const float* in, float* out, int64_t n) const {
    const uint32_t threshold = threshold_;
    const float scale = scale_;
    for (int64_t j = 0; j < n; ++j) {
      out[j] = Dropped(in[j], scale, KeepMask(row_word, columns[j], threshold));
    }
  }

  // Example b's rows of head h in a [tokens, hidden] matrix at `base`.
  template <typename Float>
  Eigen::Map<std::conditional_t<std::is_const_v<Float>, const RowMajor,
                                RowMajor>,
             0, Eigen::OuterStride<>>
  HeadRows(Float* base, int64_t b, int64_t h) const {
    return {base + starts_[b] * hidden_ + h * head_size_,
            starts_[b + 1] - starts_[b], head_size_,
            Eigen::OuterStride<>(hidden_)};
  }

  // Example b's head h: `dropped` = its kept probabilities `p` (n x n)
  // after dropout; with `gradient`, the same mask and scale on it too.
  void DropHead(int64_t b, int64_t h, int64_t n, const float* p,
                float* dropped, float* gradient = nullptr) const {
    std::vector<uint32_t> words(2 * n);
    Words(b, h, n, words.data(), words.data() + n);
    for (int64_t i = 0; i < n; ++i) {
      Drop(words[i], words.data() + n, p + i * n, dropped + i * n, n);
      if (gradient != nullptr) {
        Drop(words[i], words.data() + n, gradient + i * n, gradient + i * n,
             n);
      }
    }
  }

  // Runs work(b, h) for every example and head, on the CPU's threads.
  template <typename Work>
  void EachHead(OpKernelContext* context, Work work) const {
    const int64_t items = examples_ * heads_;
    if (items == 0) return;
    int64_t longest = 1;
    for (int64_t b = 0; b < examples_; ++b) {
      longest = std::max<int64_t>(longest, starts_[b + 1] - starts_[b]);
    }
    Sharded(context, items, /*cost=*/longest * longest * head_size_ * 8,
            [&](int64_t begin, int64_t end) {
              for (int64_t item = begin; item < end; ++item) {
                work(item / heads_, item % heads_);
              }
            });
  }

  int heads_;
  float divisor_;
  uint32_t threshold_;
  float scale_;
  int64_t tokens_ = 0, hidden_ = 0, head_size_ = 0, examples_ = 0;
  int64_t length_ = 0;
  bool dropout_ = false;
  const int32_t* starts_ = nullptr;
  const int32_t* positions_ = nullptr;
  const uint32_t* rows_ = nullptr;
  const uint32_t* columns_ = nullptr;
  std::vector<int64_t> offsets_;
};

class AttentionOp : public OpKernel {
 public:
  explicit AttentionOp(OpKernelConstruction* context)
      : OpKernel(context), attention_(context) {}

  void Compute(OpKernelContext* context) override {
    Attention a = attention_;
    if (!a.Prepare(context)) return;
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, context->input(0).shape(), &output));
    Tensor* probs = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(
                       1, TensorShape({a.offsets_[a.examples_]}), &probs));
    const float* query = context->input(0).flat<float>().data();
    const float* key = context->input(1).flat<float>().data();
    const float* value = context->input(2).flat<float>().data();
    float* out = output->flat<float>().data();
    float* kept = probs->flat<float>().data();
    a.EachHead(context, [&](int64_t b, int64_t h) {
      const int64_t n = a.starts_[b + 1] - a.starts_[b];
      if (n == 0) return;
      Strided context_h = a.HeadRows(out, b, h);
      ConstStrided q = a.HeadRows(query, b, h);
      ConstStrided k = a.HeadRows(key, b, h);
      ConstStrided v = a.HeadRows(value, b, h);
      Block p(kept + a.offsets_[b] + h * n * n, n, n);
      p.noalias() = q * k.transpose();
      p /= a.divisor_;
      for (int64_t i = 0; i < n; ++i) {
        auto row = p.row(i).array();
        const float largest = row.maxCoeff();
        row = (row - largest).exp();
        row *= 1.0f / row.sum();
      }
      if (!a.dropout_) {
        context_h.noalias() = p * v;
        return;
      }
      RowMajor dropped(n, n);
      a.DropHead(b, h, n, p.data(), dropped.data());
      context_h.noalias() = dropped * v;
    });
  }

 private:
  Attention attention_;
};

class AttentionGradOp : public OpKernel {
 public:
  explicit AttentionGradOp(OpKernelConstruction* context)
      : OpKernel(context), attention_(context) {}

  void Compute(OpKernelContext* context) override {
    Attention a = attention_;
    if (!a.Prepare(context)) return;
    const Tensor& probs = context->input(7);
    const Tensor& gradient = context->input(8);
    OP_REQUIRES(context,
                probs.dims() == 1 &&
                    probs.dim_size(0) == a.offsets_[a.examples_],
                absl::InvalidArgumentError(
                    "probs must be what EaAttention kept"));
    OP_REQUIRES(context, gradient.shape() == context->input(0).shape(),
                absl::InvalidArgumentError(
                    "gradient must have the query's shape"));
    Tensor* outputs[3];
    for (int i = 0; i < 3; ++i) {
      OP_REQUIRES_OK(context, context->allocate_output(
                                  i, context->input(i).shape(), &outputs[i]));
    }
    const float* query = context->input(0).flat<float>().data();
    const float* key = context->input(1).flat<float>().data();
    const float* value = context->input(2).flat<float>().data();
    const float* kept = probs.flat<float>().data();
    const float* incoming = gradient.flat<float>().data();
    float* dq_all = outputs[0]->flat<float>().data();
    float* dk_all = outputs[1]->flat<float>().data();
    float* dv_all = outputs[2]->flat<float>().data();
    a.EachHead(context, [&](int64_t b, int64_t h) {
      const int64_t n = a.starts_[b + 1] - a.starts_[b];
      if (n == 0) return;
      ConstStrided q = a.HeadRows(query, b, h);
      ConstStrided k = a.HeadRows(key, b, h);
      ConstStrided v = a.HeadRows(value, b, h);
      ConstStrided d_context = a.HeadRows(incoming, b, h);
      Strided dq = a.HeadRows(dq_all, b, h);
      Strided dk = a.HeadRows(dk_all, b, h);
      Strided dv = a.HeadRows(dv_all, b, h);
      Eigen::Map<const RowMajor> p(kept + a.offsets_[b] + h * n * n, n, n);
      // d(dropped probs) = dC V^T; dV = dropped^T dC.
      RowMajor dp = d_context * v.transpose();
      if (a.dropout_) {
        RowMajor dropped(n, n);
        a.DropHead(b, h, n, p.data(), dropped.data(), dp.data());
        dv.noalias() = dropped.transpose() * d_context;
      } else {
        dv.noalias() = p.transpose() * d_context;
      }
      // The softmax's gradient, then the division's.
      for (int64_t i = 0; i < n; ++i) {
        const float dot = (dp.row(i).array() * p.row(i).array()).sum();
        dp.row(i).array() = (dp.row(i).array() - dot) * p.row(i).array();
      }
      dp /= a.divisor_;
      dq.noalias() = dp * k;
      dk.noalias() = dp.transpose() * q;
    });
  }

 private:
  Attention attention_;
};

REGISTER_KERNEL_BUILDER(Name("EaAttention").Device(::tensorflow::DEVICE_CPU),
                        AttentionOp);
REGISTER_KERNEL_BUILDER(
    Name("EaAttentionGrad").Device(::tensorflow::DEVICE_CPU),
    AttentionGradOp);

}  // namespace
}  // namespace estimator_accum
