"""Every op type `neuronish-cc list-operators` prints has conformance cases."""

from __future__ import annotations

from neuronish.cc.ops.registry import LOWERINGS
from tests.cc import test_conformance_array, test_conformance_nn, test_conformance_sequence

# Placeholder is the graph's input, never compiled on its own; NoOp has no outputs
# and is only reachable through control edges, which the compiler ignores.
NOT_COMPUTATIONS = {"Placeholder", "NoOp"}


def test_every_registered_op_has_a_conformance_case() -> None:
    covered = {c.op_type for c in test_conformance_nn.CASES + test_conformance_array.CASES
               + test_conformance_sequence.CASES}
    missing = sorted(set(LOWERINGS) - covered - NOT_COMPUTATIONS)
    assert not missing, f"ops without a conformance case: {missing}"


def test_issue_op_list_is_registered() -> None:
    required = """Placeholder Const Identity IdentityN NoOp StopGradient Snapshot Conv2D
    DepthwiseConv2dNative MatMul BatchMatMulV2 BiasAdd FusedBatchNormV3 MaxPool AvgPool Mean Sum
    Max Min Prod Softmax LogSoftmax Relu Relu6 LeakyRelu Elu Selu Sigmoid Tanh Softplus Erf Erfc
    Exp Log Sqrt Rsqrt Square Pow Abs Neg Reciprocal Floor AddV2 Add Sub Mul RealDiv Maximum
    Minimum SquaredDifference Greater GreaterEqual Less LessEqual Equal NotEqual LogicalAnd
    LogicalOr LogicalNot Select SelectV2 Cast Reshape Squeeze ExpandDims Transpose ConcatV2 Pack
    Unpack Split SplitV Slice StridedSlice Pad PadV2 MirrorPad Tile BroadcastTo GatherV2 OneHot
    Fill ZerosLike OnesLike Shape Range ArgMax ArgMin ResizeBilinear ResizeNearestNeighbor
    AddN Einsum""".split()
    assert not sorted(set(required) - set(LOWERINGS))
