"""Where activations stay in a blocked layout: a compiler decision, realized by the engine.

oneDNN's convolutions and pools run on NHWC, but some run faster on channel-blocked
activations (`nChw16c`: channels in blocks of 16 innermost), e.g. the 1x1 56x56x64->256
of ResNet (4.1 vs 5.3 ms, fp32). A reorder into the blocked layout and back costs about
as much as it saves, so a value pays only when it stays blocked from producer to every
consumer. This pass marks exactly those values: a 4-D float32 output of a windowed
instruction (conv2d, depthwise_conv2d, pool) whose channels are a multiple of 16 (so
the blocked tensor is the NHWC tensor's size and the memory plan holds either) and
whose every reader is a windowed instruction reading it as its image (or conv2d's
residual), never a graph output; and, since the engine reorders an NHWC input into a
blocked instruction, only where that input is blocked itself or small: a depthwise
convolution's input must be blocked, any other's blocked or at most 56x56. It sets the
producer's `layout` attribute (docs/isa.md); the IR dump shows it and `neuronish-cc
inspect` counts it.

Semantics do not change: `layout` is a hint about physical placement. The numpy
reference engine ignores it; the native engine keeps a marked value blocked only if it
runs the producer and every reader itself, and otherwise leaves it NHWC.
"""

from __future__ import annotations

import math

from neuronish.runtime import isa

from ..ir import Graph, Node, Value

BLOCKED = "nChw16c"
BLOCK = 16
# A blocked region may start (reorder its NHWC input) at images of at most 56x56.
_LARGEST_REGION_START = 56 * 56


def _float32_math(node: Node) -> bool:
    """Blocked layouts are for float32 kernels: oneDNN's bf16/fp16 convolutions (AMX,
    AVX512-BF16) are brgemm kernels on NHWC, 3.3x faster on ResNet50 than its blocked
    bf16 ones (benchmarks/compare_flags.py)."""
    return node.attrs.get("compute", "float32") == "float32"


def _reads_as_image(node: Node, v: Value) -> bool:
    """`node` reads `v` only where a blocked image may be: input 0, or the residual."""
    if not _float32_math(node):
        return False
    if node.kind not in isa.WINDOWED or node.inputs[0] is not v and not (
            node.kind == "conv2d" and node.attrs.get("residual") and node.inputs[-1] is v):
        return False
    return all(u is not v for u in node.inputs[1:len(node.inputs) - bool(
        node.attrs.get("residual"))])


def assign_layouts(graph: Graph) -> Graph:
    """Mark each windowed instruction whose output can stay channel-blocked.

    A reader whose own output stays NHWC reorders a blocked input back to NHWC (the
    engine runs a windowed instruction in one layout). Where that reorder is larger than
    the one the producer would need to write NHWC itself (its input is smaller, or NHWC:
    no reorder at all), the value is left NHWC and the marking redone until none is.
    EfficientNetB0's expand convolutions (x6 channels) wrote blocked outputs that their
    depthwise convolutions, NHWC because their squeeze-excite readers are not windowed,
    reordered back: 16 reorders of up to 8x1152x7x7 a call."""
    producers = [n for n in graph.nodes if n.kind in isa.WINDOWED and len(n.outputs) == 1]
    refused: set[int] = set()
    while True:
        blocked = _blocked_values(graph, refused)
        reordered = {n.outputs[0].id for n in producers if n.outputs[0].id in blocked
                     and any(r.outputs[0].id not in blocked for r in graph.uses(n.outputs[0]))
                     and (n.inputs[0].id not in blocked
                          or _size(n.outputs[0]) > _size(n.inputs[0]))}
        if not reordered:
            break
        refused |= reordered
    for node in producers:
        if node.outputs[0].id in blocked:
            node.attrs = {**node.attrs, "layout": BLOCKED}
    return graph


def _size(v: Value) -> int:
    return math.prod(v.shape)


def _blocked_values(graph: Graph, refused: set[int]) -> set[int]:
    """The outputs that may stay blocked, given values already `refused` (in order)."""
    outputs = {v.id for v in graph.outputs}
    blocked: set[int] = set()
    for node in graph.nodes:
        if node.kind not in isa.WINDOWED or len(node.outputs) != 1 or not _float32_math(node):
            continue
        y = node.outputs[0]
        readers = graph.uses(y)
        x = node.inputs[0]
        if (y.id not in refused and y.dtype == "float32" and len(y.shape) == 4
                and y.shape[3] % BLOCK == 0
                and y.id not in outputs and readers
                and all(_reads_as_image(r, y) for r in readers)
                # The producer's own image can be blocked too (a 3-channel input image
                # cannot: oneDNN has no fast kernel from it to a blocked output).
                and x.dtype == "float32" and len(x.shape) == 4 and x.shape[3] % BLOCK == 0
                # A depthwise convolution reads and writes one layout: blocking its output
                # when its input stays NHWC costs a reorder of the input, as large as the
                # output (MobileNetV2's 144-channel blocks between 24-channel ones: two
                # reorders of 8x144x56x56 each), and oneDNN's NHWC depthwise is as fast.
                and (node.kind != "depthwise_conv2d" or x.id in blocked)
                # Nor does any region start at an NHWC input above 56x56: the engine would
                # reorder that input (ResNet50's stem output into its max pool, 8x64x112x112;
                # MobileNetV2's 8x32x112x112 into its first 1x1), while NHWC kernels there
                # are about as fast (brgconv, brdgmm_dw, NHWC pooling).
                and (x.id in blocked or x.shape[1] * x.shape[2] <= _LARGEST_REGION_START)):
            blocked.add(y.id)
    return blocked
