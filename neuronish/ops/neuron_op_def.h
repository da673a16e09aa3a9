// The NeuronOp op: its registration (attributes, shape function, doc), shared by the
// two kernels' libraries, neuron_op.cc (the Python host: it calls
// neuronish/kernel_bridge.py) and neuron_op_native.cc (any host: it calls the C runtime,
// runtime/include/neuronish_runtime.h). One library is loaded into a process, never
// both: each registers the op. Include it from one translation unit per library.
#ifndef NEURONISH_OPS_NEURON_OP_DEF_H_
#define NEURONISH_OPS_NEURON_OP_DEF_H_

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace neuronish {
namespace {

// ---------------------------------------------------------------------------
// The op. Not stateful: a NeuronOp is a pure function of its inputs, so CSE may
// merge two identical calls and, in a tf.function, stateful ops would get
// automatic control edges that serialize independent NeuronOps. Constant
// folding could only fire if every input were a constant, which the partitioner
// never produces (it would have compiled those constants into the executable).

absl::Status NeuronOpShape(tensorflow::shape_inference::InferenceContext* c) {
  std::vector<tensorflow::PartialTensorShape> shapes;
  std::vector<int64_t> axes;
  TF_RETURN_IF_ERROR(c->GetAttr("output_shapes", &shapes));
  TF_RETURN_IF_ERROR(c->GetAttr("output_batch_axis", &axes));
  if (static_cast<int>(shapes.size()) != c->num_outputs() ||
      axes.size() != shapes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NeuronOp: ", c->num_outputs(), " output_dtypes but ",
        shapes.size(), " output_shapes and ", axes.size(), " output_batch_axis"));
  }
  for (int i = 0; i < c->num_outputs(); ++i) {
    tensorflow::shape_inference::ShapeHandle s;
    TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shapes[i], &s));
    // The batch axis takes whatever size the call has: the kernel splits it.
    if (axes[i] >= 0 && axes[i] < shapes[i].dims()) {
      TF_RETURN_IF_ERROR(c->ReplaceDim(s, axes[i], c->UnknownDim(), &s));
    }
    c->set_output(i, s);
  }
  return absl::OkStatus();
}

REGISTER_OP("NeuronOp")
    .Input("input_tensors: Tin")
    .Input("external_files: n_external * string")
    .Output("output_tensors: output_dtypes")
    .Attr("graph_def: string")
    .Attr("input_names: list(string)")
    .Attr("output_names: list(string)")
    .Attr("input_shapes: list(shape)")
    .Attr("output_shapes: list(shape)")
    .Attr("Tin: list(type) >= 0")
    .Attr("output_dtypes: list(type) >= 0")
    .Attr("executable: string")
    .Attr("input_batch_axis: list(int)")
    .Attr("output_batch_axis: list(int)")
    .Attr("model_config: list(int)")
    .Attr("n_external: int >= 0 = 0")
    .Attr("dynamic_shapes: string = ''")
    .SetShapeFn(NeuronOpShape)
    .Doc(R"doc(
A subgraph compiled for the neuronish device; `executable` is the program.
Inputs and outputs follow input_names / output_names; a call whose batch (on
input_batch_axis) differs from the compiled one is split and padded.
external_files: paths (SavedModel assets) of the executable and graph_def when
those attrs hold a `neuronish-external:` reference instead of the bytes.
dynamic_shapes: empty, or JSON saying which dims (-1 in the shape attrs) are free
and their bounds; the bridge then runs each call's shape on an executable compiled
for it (neuronish/shape_specialize.py) and says the outputs' shapes.
)doc");

}  // namespace
}  // namespace neuronish

#endif  // NEURONISH_OPS_NEURON_OP_DEF_H_
