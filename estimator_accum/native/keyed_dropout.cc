// keyed_dropout in one pass: each element's lowbias32 hash of (its row's
// word ^ its column's word), kept where the hash is at least `threshold`
// and then scaled. The same masks as estimator_accum.window.keyed_dropout's
// TensorFlow ops, bit for bit; its gradient is the same op on the incoming
// gradient (the mask and the scale are the same). Built and loaded by
// estimator_accum/native/__init__.py against the running TensorFlow.
#include "common.h"

namespace estimator_accum {
namespace {

REGISTER_OP("EaKeyedDropout")
    .Input("inputs: float")
    .Input("rows: uint32")
    .Input("columns: uint32")
    .Attr("threshold: int")
    .Attr("scale: float")
    .Output("outputs: float")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    });

class KeyedDropoutOp : public OpKernel {
 public:
  explicit KeyedDropoutOp(OpKernelConstruction* context)
      : OpKernel(context) {
    DropoutAttrs(context, &threshold_, &scale_);
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& inputs = context->input(0);
    const Tensor& rows = context->input(1);
    const Tensor& columns = context->input(2);
    int64_t height, width;
    if (!RowsAndWidth(context, inputs, "inputs", &height, &width) ||
        !DropoutWordsFit(context, inputs, "inputs", rows, columns, width)) {
      return;
    }
    Tensor* outputs = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, inputs.shape(), &outputs));
    if (height == 0) return;
    const float* in = inputs.flat<float>().data();
    const uint32_t* row_words = rows.flat<uint32_t>().data();
    const uint32_t* column_words = columns.flat<uint32_t>().data();
    float* out = outputs->flat<float>().data();
    const uint32_t threshold = threshold_;
    const float scale = scale_;
    auto rows_from_to = [in, row_words, column_words, out, threshold, scale,
                         width](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const uint32_t word = row_words[row];
        const float* __restrict x = in + row * width;
        float* __restrict y = out + row * width;
        const uint32_t* __restrict column = column_words;
        for (int64_t c = 0; c < width; ++c) {
          y[c] = Dropped(x[c], scale, KeepMask(word, column[c], threshold));
        }
      }
    };
    Sharded(context, height, /*cost=*/width * 8, rows_from_to);
  }

 private:
  uint32_t threshold_;
  float scale_;
};

REGISTER_KERNEL_BUILDER(
    Name("EaKeyedDropout").Device(::tensorflow::DEVICE_CPU),
    KeyedDropoutOp);

}  // namespace
}  // namespace estimator_accum
