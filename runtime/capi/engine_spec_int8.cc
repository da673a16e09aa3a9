// runtime/native/spec_int8.py in C++ (engine_spec_parts.h): quantize, binary_quantize and
// the int8 convolution and matmul; the floats carry the scales as the numpy reference uses them.
#include <algorithm>

#include "engine_spec_parts.h"

namespace nr::spec::detail {

Out quantize(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &) {
  const Ref &x = ins[0];
  if (x.shape.empty() || x.shape.size() > 6) return std::nullopt;
  Ints ints{OP_QUANTIZE};
  put(ints, x); put(ints, outs[0]);
  return made(ints, {double(float(1.0 / a.f("scale")))});  // kernels.quantized.inverse
}

Out binary_quantize(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &) {
  const Ref &y = outs[0];
  size_t rank = std::max<size_t>(y.shape.size(), 1);
  if (rank > 8) return std::nullopt;
  Ints ints{OP_QBINARY, loop_fn(a.s("fn")), ins.size() == 3, a.s("activation", "none") == "relu"};
  for (const Ref &r : ins) put(ints, r, padded(r.shape, rank));
  put(ints, y, padded(y.shape, rank));
  return made(ints, {double(float(1.0 / a.f("scale")))});
}

Out conv2d_int8(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &c) {
  auto act = activation(a);
  if (!act || !c[1]) return std::nullopt;
  bool residual = a.truth("residual");
  bool has_bias = int64_t(ins.size()) - residual == 4;
  Ints ints{OP_QCONV, has_bias, residual, a.truth("depthwise")};
  for (const Ref &r : ins) put(ints, r);
  put(ints, outs[0]);
  append(ints, a.ints("strides")); append(ints, a.ints("dilations")); append(ints, a.ints("pads"));
  std::vector<double> floats;
  epilogue(*act, ints, floats);
  floats.insert(floats.end(), {a.f("x_scale"), a.f("y_scale", 1.0), a.f("residual_scale", 1.0)});
  return made(ints, floats);
}

Out matmul_int8(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &c) {
  auto act = activation(a);
  size_t rank = outs[0].shape.size();
  if (!act || !c[1] || rank > 6) return std::nullopt;
  bool residual = a.truth("residual");
  Ints ints{OP_QMATMUL, int64_t(ins.size()) - residual > 3, residual};
  put(ints, ins[0]); put(ints, ins[1], padded(ins[1].shape, rank)); put(ints, ins[2]);
  for (size_t i = 3; i < ins.size(); ++i) put(ints, ins[i]);
  put(ints, outs[0]);
  std::vector<double> floats;
  epilogue(*act, ints, floats);
  floats.insert(floats.end(), {a.f("a_scale"), a.f("y_scale", 1.0)});
  return made(ints, floats);
}

}  // namespace nr::spec::detail
