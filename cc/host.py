"""What the compiling CPU can do, for the notes a compile report gives about it.

The simulated device computes on the host's CPU through oneDNN, so an executable's
reduced-precision instructions are as fast as that CPU's kernels for them. The compiler
does not change what it produces for the host (an executable runs the same everywhere);
it says when the host will run a choice slowly and what to do about it.
"""

from __future__ import annotations


def cpu_flags() -> set[str]:
    """/proc/cpuinfo's flags of the first CPU; empty where unknown (not Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def int8_note(weight_bits: int, flags: set[str] | None = None) -> str | None:
    """What a user compiling full 8-bit weights on a CPU without VNNI should know: the
    native engine computes those instructions in float32 there (exact, at float32 speed)."""
    flags = cpu_flags() if flags is None else flags
    if weight_bits != 8 or not flags or flags & {"avx512_vnni", "avx_vnni"}:
        return None
    return ("the compiling CPU has no VNNI, where oneDNN's int8 kernels saturate on "
            "full-range 8-bit weights, so int8 convolutions and matmuls compute in float32 "
            "there (exact, at float32 speed); --int8-weight-bits 7 lets them run on int8 "
            "kernels (docs/int8.md)")


# Flags under which oneDNN 3.2 has kernels of each 16-bit type (runtime/native/engine.cc,
# probe_half_kernels, asks oneDNN itself at load): bfloat16 from AVX-512 (avx512_core) and
# on AVX-NE-CONVERT; float16 with AVX512-FP16 or AVX-NE-CONVERT.
_HALF_KERNELS = {"bf16": {"avx512bw", "avx512_bf16", "amx_bf16", "avx_ne_convert"},
                 "fp16": {"avx512_fp16", "amx_fp16", "avx_ne_convert"}}


def auto_cast_note(cast_type: str, flags: set[str] | None = None) -> str | None:
    """What a user asking for --auto-cast on a CPU without kernels of that type should
    know: the executable runs no faster than the float32 one there. bfloat16 values
    inside a one-stage program stay float32 (runtime/native/engine.cc `widened_slot`), so
    they run at float32's speed with float32's precision between instructions; float16
    instructions compute in float32 with a conversion on each side, usually slower."""
    flags = cpu_flags() if flags is None else flags
    name = {"bf16": "bfloat16", "fp16": "float16"}[cast_type]
    if not flags or flags & _HALF_KERNELS[cast_type]:
        return None
    if cast_type == "bf16":
        how = ("its bfloat16 values stay float32 between instructions (the weights keep "
               "their bfloat16 rounding; a pipelined program's hand-offs are rounded): on "
               "this CPU the executable runs at the float32 one's speed, not faster")
    else:
        how = ("each float16 instruction computes in float32 here, its operands widened and "
               "its result rounded by passes of their own: on this CPU the executable runs "
               "no faster than without --auto-cast, usually slower")
    return (f"the compiling CPU has no {name} kernels (oneDNN has them from AVX-512 or "
            f"AVX-NE-CONVERT), so {how}. Compile without --auto-cast for such a CPU; keep "
            f"it for one with those kernels (docs/auto-cast.md)")
