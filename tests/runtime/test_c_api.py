"""The C runtime's C API (docs/c-api.md): a real C program, built with gcc
against libneuronish_runtime.so, loads executables and prints what it read.

- Executables the real neuronish-cc (a subprocess) wrote, and the golden file, give
  the same signatures and program summaries as runtime.executable's Python reading.
- Damaged files are refused with a status and a message naming the field.
- Differential: on fuzzed mutants (tests/runtime/executable_fuzz.py), the C loader accepts
  exactly what runtime/validate.py accepts with the shape rules of the kinds not yet
  ported to C left out (isa_table.NATIVE_RULES; the count let through is printed),
  refuses everything else naming a field, and never crashes (it runs in a child).
- The same under AddressSanitizer and UndefinedBehaviorSanitizer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from runtime import executable, validate
from runtime.capi import isa_table
from runtime.errors import ExecutableError
from tests.runtime import c_programs, executable_fuzz
from tests.runtime.c_programs import TSAN

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "tests" / "c_api" / "nr_inspect.c"
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None,
                                reason="gcc is needed to build the C test program")


def _build_program(out: Path, flags: tuple[str, ...] = ()) -> Path:
    return c_programs.build(PROGRAM, out, flags, std="c11")


@pytest.fixture(scope="module")
def inspect_c(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build_program(tmp_path_factory.mktemp("capi") / "nr_inspect")


def _run(program: Path, paths: list[Path], env: dict | None = None) -> list[dict]:
    r = subprocess.run([str(program), *map(str, paths)], capture_output=True, text=True,
                       timeout=300, env=env)
    lines = r.stdout.splitlines()
    assert r.returncode == 0, (f"the C program exited with {r.returncode} after "
                               f"{len(lines)} of {len(paths)} files (the next one: "
                               f"{paths[len(lines)] if len(lines) < len(paths) else '-'})\n"
                               f"{r.stderr[-3000:]}")
    assert len(lines) == len(paths)
    return [json.loads(line) for line in lines]


def _python_view(data: bytes) -> dict:
    """What the C program prints, from runtime.executable's reading of the same bytes."""
    exe = executable.from_bytes(data)
    dtypes = ["bool", "int8", "uint8", "int16", "int32", "int64", "float16", "bfloat16",
              "float32", "float64"]  # nr_dtype's order

    def sigs(ss: list) -> list[dict]:
        return [{"name": s.name, "dtype": s.dtype, "dtype_id": dtypes.index(s.dtype),
                 "shape": list(s.shape), "batch_axis": s.batch_axis} for s in ss]

    return {"status": "ok", "format_version": executable.FORMAT_VERSION,
            "compiler": {"name": exe.compiler.get("name", ""),
                         "version": exe.compiler.get("version", "")},
            "inputs": sigs(exe.inputs), "outputs": sigs(exe.outputs),
            "num_cores": exe.num_cores, "instructions_per_core": [len(p) for p in exe.programs],
            "kinds": [i.kind for p in exe.programs for i in p], "arena_bytes": exe.arena_bytes,
            "constants": {"count": len(exe.constants), "bytes": exe.constant_bytes}}


def _compile(tmp_path: Path, name: str, graph: object, *options: str) -> Path:
    pb = tmp_path / f"{name}.pb"
    pb.write_bytes(graph.graph_def)
    out = tmp_path / f"{name}.neff"
    r = subprocess.run([str(BIN / "neuronish-cc"), "compile", str(pb), "--framework",
                        "TENSORFLOW", "--io-config", json.dumps(graph.io_config), "--output",
                        str(out), *options], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out


def test_signatures_match_python(inspect_c: Path, tmp_path: Path) -> None:
    from tests import graphs

    files = [executable_fuzz.GOLDEN,
             _compile(tmp_path, "dense", graphs.dense_relu(batch=3)),
             _compile(tmp_path, "cnn_2cores", graphs.conv_bn_relu(batch=2),
                      "--neuroncore-pipeline-cores", "2"),
             _compile(tmp_path, "dense_bf16", graphs.dense_relu(batch=5, units=4),
                      "--auto-cast", "matmult", "--auto-cast-type", "bf16")]
    got = _run(inspect_c, files)
    for path, line in zip(files, got):
        assert line == _python_view(path.read_bytes()), path.name
    assert got[2]["num_cores"] == 2 and got[1]["inputs"][0]["shape"] == [3, 16]


def test_damaged_files_are_refused_naming_the_field(inspect_c: Path, tmp_path: Path) -> None:
    good = executable_fuzz.GOLDEN.read_bytes()
    body = good[executable.HEADER_SIZE:]
    cases = {
        "short": (good[:20], "header'"),
        "magic": (b"XXXXXXXX" + good[8:], "header.magic"),
        "newer": (executable_fuzz.seal(body, version=2), "header.version"),
        "zero_version": (executable_fuzz.seal(body, version=0), "header.version"),
        "truncated": (good[:-1], "header.length"),
        "padded": (good + b"\0", "header.length"),
        "checksum": (good[:-1] + bytes([good[-1] ^ 1]), "header.sha256"),
        "not_msgpack": (executable_fuzz.seal(b"\xc1"), "field 'body'"),
        "trailing": (executable_fuzz.seal(body + b"\x00"), "field 'body'"),
        "deep": (executable_fuzz.seal(b"\x91" * 100_000 + b"\xc0"), "nesting deeper"),
        "huge_count": (executable_fuzz.seal(b"\xdd\xff\xff\xff\xff"), "runs past the end"),
    }
    paths = []
    for name, (data, _) in cases.items():
        (tmp_path / name).write_bytes(data)
        paths.append(tmp_path / name)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    paths += [tmp_path, fifo, tmp_path / "missing"]
    got = _run(inspect_c, paths)
    for (name, (data, needle)), line in zip(cases.items(), got):
        assert line["status"] == "error" and needle in line["message"], (name, line)
        with pytest.raises(ExecutableError):  # and Python refuses it too
            executable.from_bytes(data)
    assert got[2]["code_name"] == "unsupported"
    for line in got[len(cases):]:
        assert line["code_name"] == "I/O error", line
    assert "not a regular file" in got[len(cases) + 1]["message"]


def test_a_binarys_activation_is_checked_alike(inspect_c: Path, tmp_path: Path) -> None:
    """A binary's `activation` holds only where one pass computes it (isa.py's binary):
    both loaders refuse the rest naming the field, and take the one that is."""
    import msgpack
    import numpy as np

    from runtime.program import one_instruction_program

    arrays = [np.ones((2, 3, 8), np.float32), np.ones((3, 8), np.float32)]
    program, _ = one_instruction_program("binary", arrays, {"fn": "add", "activation": "relu"},
                                         [((2, 3, 8), "float32")])
    body = msgpack.unpackb(executable.to_bytes(program.exe)[executable.HEADER_SIZE:],
                           strict_map_key=False)
    cases = {"fused": ({}, None), "pow": ({"fn": "pow"}, "fn one of"),
             "sub_of_the_broadcast": ({"fn": "sub", "swap": True}, "of y's shape"),
             "comparison": ({"fn": "less"}, "float32 or bfloat16 output")}
    paths = []
    for name, (change, _) in cases.items():
        mutant = msgpack.unpackb(msgpack.packb(body), strict_map_key=False)
        (ins,) = executable_fuzz._instructions(mutant)
        if change.pop("swap", False):
            ins["in"] = ins["in"][::-1]
        ins["attrs"].update(change)
        (tmp_path / name).write_bytes(executable_fuzz.seal(msgpack.packb(mutant)))
        paths.append(tmp_path / name)
    for (name, (_, needle)), path, line in zip(cases.items(), paths, _run(inspect_c, paths)):
        if needle is None:
            assert line.get("status") != "error", line
            executable.from_bytes(path.read_bytes())
            continue
        assert line["status"] == "error" and needle in line["message"], (name, line)
        assert "activation" in line["message"], (name, line)
        with pytest.raises(ExecutableError, match=needle):
            executable.from_bytes(path.read_bytes())


# (attrs, output dtype, cases: name -> (attrs changed, c's (shape, dtype), refusal's words))
_ADDEND_CASES = {
    "binary": ({"fn": "mul", "activation": "relu"}, "float32", {
        "fused": (None, None, None), "pow": ({"fn": "pow"}, None, "fn one of"),
        "c_too_long": (None, ([3], "float32"), "broadcast to y"),
        "c_of_another_dtype": (None, ([8], "bfloat16"), "broadcast to y"),
        "comparison": ({"fn": "less", "activation": "none"}, None,
                       "float32 or bfloat16 output")}),
    "binary_quantize": ({"fn": "mul", "activation": "relu", "scale": 0.1, "to": "uint8"},
                        "uint8", {
        "fused": (None, None, None), "c_of_one_value": (None, ([], "float32"), None),
        "sigmoid": ({"activation": "sigmoid"}, None, "activation"),
        "c_too_long": (None, ([3], "float32"), "broadcast to y"),
        "c_of_another_dtype": (None, ([8], "bfloat16"), "broadcast to y")}),
}


@pytest.mark.parametrize("kind", _ADDEND_CASES)
def test_an_addend_is_checked_alike(kind: str, inspect_c: Path, tmp_path: Path) -> None:
    """The third input c of a binary holds only where one pass adds it (isa.py's binary);
    a binary_quantize's, wherever it broadcasts to y: both loaders refuse the rest naming
    the input (or the attribute), and take the ones that are."""
    import msgpack
    import numpy as np

    from runtime.program import one_instruction_program

    attrs, out_dtype, cases = _ADDEND_CASES[kind]
    arrays = [np.ones((2, 3, 8), np.float32), np.ones((8,), np.float32),
              np.ones((8,), np.float32)]
    program, _ = one_instruction_program(kind, arrays, attrs, [((2, 3, 8), out_dtype)])
    body = msgpack.unpackb(executable.to_bytes(program.exe)[executable.HEADER_SIZE:],
                           strict_map_key=False)
    paths = []
    for name, (change, c_type, _) in cases.items():
        mutant = msgpack.unpackb(msgpack.packb(body), strict_map_key=False)
        (ins,) = executable_fuzz._instructions(mutant)
        ins["attrs"].update(change or {})
        if c_type:  # (the value and the input signature that declare c)
            value = mutant["values"][ins["in"][2]]
            value[1], value[2] = c_type
            sig = next(i for i in mutant["inputs"] if i["value"] == ins["in"][2])
            sig["shape"], sig["dtype"] = c_type
        (tmp_path / name).write_bytes(executable_fuzz.seal(msgpack.packb(mutant)))
        paths.append(tmp_path / name)
    for (name, (_, _, needle)), path, line in zip(cases.items(), paths, _run(inspect_c, paths)):
        if needle is None:
            assert line.get("status") != "error", (name, line)
            executable.from_bytes(path.read_bytes())
            continue
        assert line["status"] == "error" and needle in line["message"], (name, line)
        with pytest.raises(ExecutableError, match=needle):
            executable.from_bytes(path.read_bytes())


def _accepts(check: object, data: bytes) -> bool:
    try:
        check(data)
        return True
    except ExecutableError:
        return False


_FULL_CHECK = validate._check_instruction


def _without_shape_rules(ins: object, exe: object, where: str) -> None:
    """validate._check_instruction, minus the shape rule of the kinds whose rule the C
    loader does not have yet (arity and attributes only): what the C loader checks."""
    if ins.kind in isa_table.NATIVE_RULES:
        return _FULL_CHECK(ins, exe, where)
    kind = validate.isa.KINDS[ins.kind]
    if not kind.arity_ok(len(ins.inputs)):
        raise validate._fail(f"{where}: wrong number of inputs (field 'in')")
    try:
        kind.with_defaults(ins.attrs)
    except validate.isa.IsaError as e:
        raise validate._fail(f"{where}: {e.reason}") from None


def _differential(program: Path, tmp_path: Path, count: int, seed: int,
                  env: dict | None = None) -> Counter:
    mutants = executable_fuzz.mutants(executable_fuzz.seed_executables(), count, seed)
    paths = []
    for i, (_, data) in enumerate(mutants):
        paths.append(tmp_path / f"m{i}.neff")
        paths[-1].write_bytes(data)
    got = _run(program, paths, env)
    full = [_accepts(executable.from_bytes, data) for _, data in mutants]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(validate, "_check_instruction", _without_shape_rules)
        no_rules = [_accepts(executable.from_bytes, data) for _, data in mutants]
    outcomes: Counter = Counter()
    for (what, _), line, py_full, py_no_rules in zip(mutants, got, full, no_rules):
        c_ok = line["status"] == "ok"
        assert c_ok == py_no_rules, (what, line, py_no_rules)
        if not c_ok:
            assert "field '" in line["message"], (what, line["message"])
        outcomes["accepted" if c_ok and py_full else "refused" if not c_ok else
                 "accepted by C, refused by Python's shape rules"] += 1
    return outcomes


def test_fuzzed_mutants_agree_with_validate(inspect_c: Path, tmp_path: Path) -> None:
    outcomes = _differential(inspect_c, tmp_path, 600, seed=25)
    print("C loader on 600 mutants:", dict(outcomes))
    assert outcomes["accepted"] > 20 and outcomes["refused"] > 300


def test_under_sanitizers(tmp_path: Path) -> None:
    flags = ("-fsanitize=address,undefined", "-fno-sanitize-recover=all",
             "-fno-omit-frame-pointer")
    program = _build_program(tmp_path / "nr_inspect_asan", flags)
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
           "UBSAN_OPTIONS": "print_stacktrace=1"}
    outcomes = _differential(program, tmp_path, 200, seed=2025, env=env)
    print("under ASan+UBSan, 200 mutants:", dict(outcomes))


def test_concurrent_loads_and_queries_under_thread_sanitizer(tmp_path: Path) -> None:
    program = c_programs.build("nr_threads.c", tmp_path / "nr_threads", TSAN, std="c11")
    r = subprocess.run([str(program), str(executable_fuzz.GOLDEN)], capture_output=True,
                       text=True, timeout=300,
                       env={**os.environ, "TSAN_OPTIONS": "halt_on_error=1"})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
    assert "ThreadSanitizer" not in r.stderr


@pytest.mark.parametrize("dtype", ["float32", "f4", "\x00", None, "", "complex64", "int",
                                   "S8", 5])
def test_constant_dtype_spellings_agree_with_numpy(inspect_c: Path, tmp_path: Path,
                                                   dtype: object) -> None:
    """from_bytes reads a constant's dtype with np.dtype(), which knows more spellings
    than the compiler writes; the C loader must accept and refuse the same ones."""
    import msgpack

    body = msgpack.unpackb(executable_fuzz.GOLDEN.read_bytes()[executable.HEADER_SIZE:],
                           strict_map_key=False)
    body["constants"][0]["dtype"] = dtype
    data = executable_fuzz.seal(msgpack.packb(body, use_bin_type=True))
    (tmp_path / "m.neff").write_bytes(data)
    [line] = _run(inspect_c, [tmp_path / "m.neff"])
    assert (line["status"] == "ok") == _accepts(executable.from_bytes, data), line


def test_every_kind_has_a_native_shape_rule() -> None:
    """A kind added to isa.py needs its rule in runtime/capi/shape_rules.cc (and in
    isa_table.NATIVE_RULES); until then the C loader checks less than validate.py."""
    assert isa_table.NATIVE_RULES == set(validate.isa.KINDS)


def test_int8_mutants_agree_with_validate(inspect_c: Path, tmp_path: Path) -> None:
    """The fuzz seeds hold no int8 instructions: mutants of a quantized CNN (conv2d_int8,
    matmul_int8, quantize) exercise their rules."""
    import numpy as np

    from neuronish.cc.compiler import compile_executable
    from tests.runtime.test_int8 import _small_cnn

    g = _small_cnn()
    rng = np.random.default_rng(0)
    calib = [[rng.standard_normal((4, 8, 8, 3)).astype(np.float32)] for _ in range(2)]
    seed = executable.to_bytes(compile_executable(g.graph_def, g.io_config, calibration=calib))
    kinds = {i.kind for p in executable.from_bytes(seed).programs for i in p}
    assert {"conv2d_int8", "matmul_int8", "quantize"} <= kinds, kinds
    real = executable_fuzz.seed_executables
    try:
        executable_fuzz.seed_executables = lambda: {"int8_cnn": seed}
        outcomes = _differential(inspect_c, tmp_path, 300, seed=8)
    finally:
        executable_fuzz.seed_executables = real
    print("C loader on 300 int8 mutants:", dict(outcomes))
    assert outcomes["accepted"] > 10 and outcomes["refused"] > 100


def test_messages_quote_long_non_ascii_names_in_whole_characters(inspect_c: Path,
                                                                 tmp_path: Path) -> None:
    """Values are quoted shortened; a cut inside a UTF-8 character would make the
    message itself invalid text."""
    import msgpack

    body = msgpack.unpackb(executable_fuzz.GOLDEN.read_bytes()[executable.HEADER_SIZE:],
                           strict_map_key=False)
    body["programs"][0][0]["kind"] = "é" * 60
    (tmp_path / "m.neff").write_bytes(executable_fuzz.seal(msgpack.packb(body,
                                                                         use_bin_type=True)))
    [line] = _run(inspect_c, [tmp_path / "m.neff"])
    assert line["code_name"] == "unsupported" and "é" * 20 + "...'" in line["message"], line
