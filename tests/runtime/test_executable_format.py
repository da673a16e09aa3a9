"""The executable file: golden layout, and refusal of damaged or future files."""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
from pathlib import Path

import msgpack
import numpy as np
import pytest

from neuronish.cc.compiler import compile_graph
from neuronish.runtime import Device, ExecutableError, load
from neuronish.runtime.config import DeviceConfig
from neuronish.runtime.executable import FORMAT_VERSION, HEADER_SIZE, MAGIC, from_bytes, to_bytes

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
SPEC = json.loads((GOLDEN / "conv_bn.json").read_text())  # io-config and compile options


def _device() -> Device:
    return Device(DeviceConfig.from_env({"NEURONISH_NUM_CORES": "4"}))


def _used(device: Device) -> list[int]:
    return [m["used"] for m in device.memory_report().values()]


@pytest.fixture(scope="module")
def golden() -> bytes:
    return (GOLDEN / "conv_bn.neff").read_bytes()


def test_golden_header(golden: bytes) -> None:
    magic, version, reserved, length = struct.unpack_from("<8sIIQ", golden)
    assert (magic, version, reserved) == (MAGIC, FORMAT_VERSION, 0)
    assert length == len(golden) - HEADER_SIZE == len(golden) - 56


def test_golden_pins_memory_plan_scratch_and_cores(golden: bytes) -> None:
    """conv+bn+relu → mean on two pipeline cores: the file holds a real memory plan."""
    exe = from_bytes(golden)
    assert exe.compiler["options"]["pipeline_cores"] == 2
    assert [[i.kind for i in p] for p in exe.programs] == [["conv2d"], ["reduce"]]
    (conv,), (mean,) = exe.programs
    assert len(conv.inputs) == 3 and conv.attrs["activation"] == "relu"  # bn folded, relu fused
    assert set(conv.inputs[1:]) <= set(exe.constants)
    # The conv's output crosses cores through the arena, next to the conv's scratch.
    handoff = conv.outputs[0]
    assert mean.inputs == (handoff,) and handoff in exe.offsets
    assert conv.scratch is not None and conv.scratch[1] > 0
    regions = sorted([conv.scratch, (exe.offsets[handoff], 2 * 8 * 8 * 8 * 4)])
    assert regions[0][0] + regions[0][1] <= regions[1][0]  # both live at once: no overlap
    assert regions[1][0] + regions[1][1] <= exe.arena_bytes
    assert {*exe.input_values, *exe.output_values}.isdisjoint(exe.offsets)
    assert len(golden) < 4096


@pytest.mark.parametrize("batch", [2, 3])
def test_golden_runs(golden: bytes, batch: int) -> None:
    data = np.load(GOLDEN / "conv_bn.npz")
    x = np.concatenate([data["x"], data["x"]])[:batch]
    want = np.concatenate([data["y"], data["y"]])[:batch]
    device = _device()
    with load(golden, device=device) as model:
        assert len(model.core_groups[0]) == 2
        got = model.run({"x:0": x})["Identity:0"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_reader_and_writer_agree_byte_for_byte(golden: bytes) -> None:
    assert to_bytes(from_bytes(golden)) == golden


def test_compiler_still_writes_the_golden_layout(golden: bytes) -> None:
    """Recompiling the golden graph gives the same body, except run-dependent stats."""
    fresh = compile_graph((GOLDEN / "conv_bn.pb").read_bytes(), SPEC["io_config"],
                          **SPEC["options"])

    def body(b: bytes) -> dict:
        d = msgpack.unpackb(b[HEADER_SIZE:], strict_map_key=False)
        d["stats"].pop("compile_seconds", None)
        d["stats"].pop("device_model", None)  # optional; depends on $NEURONISH_DEVICE_MODEL
        d["stats"].pop("numpy_instructions", None)  # optional; what this engine lacks
        return d

    assert body(fresh) == body(golden)


def _damaged(golden: bytes) -> dict[str, bytes]:
    flipped = bytearray(golden)
    flipped[len(golden) // 2] ^= 0x10
    future = bytearray(golden)
    struct.pack_into("<I", future, 8, FORMAT_VERSION + 1)
    version_zero = bytearray(golden)
    struct.pack_into("<I", version_zero, 8, 0)
    reserved = bytearray(golden)
    struct.pack_into("<I", reserved, 12, 7)
    return {
        "version-zero": bytes(version_zero),
        "reserved-set": bytes(reserved),
        "truncated": golden[: len(golden) - 100],
        "header-only": golden[:30],
        "bit-flipped": bytes(flipped),
        "future-version": bytes(future),
        "not-an-executable": b"PK\x03\x04" + golden[4:],
        "empty": b"",
    }


@pytest.mark.parametrize("case, message", [
    ("version-zero", "version 0 does not exist"), ("reserved-set", "reserved field is 7"),
    ("truncated", "truncated"), ("header-only", "truncated"), ("bit-flipped", "checksum"),
    ("future-version", "newer"), ("not-an-executable", "not a neuronish executable"),
    ("empty", "truncated"),
])
def test_damaged_files_are_refused(golden: bytes, case: str, message: str, tmp_path: Path) -> None:
    data = _damaged(golden)[case]
    device = _device()
    with pytest.raises(ExecutableError, match=message):
        load(data, device=device)
    assert not any(_used(device))
    path = tmp_path / "bad.neff"
    path.write_bytes(data)
    r = subprocess.run([str(Path(sys.executable).parent / "neuronish-cc"), "inspect", str(path)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and message in r.stderr and "Traceback" not in r.stderr


def test_malformed_body_with_valid_checksum_is_refused(golden: bytes) -> None:
    import hashlib

    body = msgpack.packb({"compiler": {}}, use_bin_type=True)
    header = struct.pack("<8sIIQ32s", MAGIC, FORMAT_VERSION, 0, len(body),
                         hashlib.sha256(body).digest())
    with pytest.raises(ExecutableError, match="malformed"):
        load(header + body)


def _repacked(golden: bytes, edit: object) -> bytes:
    """The golden file with `edit(body)` applied and a valid checksum: consistent on the
    outside, inconsistent inside."""
    import hashlib

    body = msgpack.unpackb(golden[HEADER_SIZE:], strict_map_key=False)
    edit(body)  # type: ignore[operator]
    payload = msgpack.packb(body, use_bin_type=True)
    return struct.pack("<8sIIQ32s", MAGIC, FORMAT_VERSION, 0, len(payload),
                       hashlib.sha256(payload).digest()) + payload


def _set(path: str, value: object) -> object:
    """An edit that sets body[k1][k2]... (keys split on '.', list indices as ints)."""
    *parents, last = [int(k) if k.isdigit() else k for k in path.split(".")]

    def edit(body: dict) -> None:
        for k in parents:
            body = body[k]
        body[last] = value
    return edit


_INCONSISTENT = {
    # The memory plan: value ids, offsets and the arena's bounds.
    "offset-of-unknown-value": (lambda b: b["memory"]["offsets"].append([99, 0]),
                                "places value %99, which the file does not define"),
    "offset-past-arena": (lambda b: b["memory"]["offsets"][0].__setitem__(1, 24000),
                          "outside the 24640-byte arena"),
    "arena-too-small": (_set("memory.arena_bytes", 100), "outside the 100-byte arena"),
    "input-in-arena": (lambda b: b["memory"]["offsets"].append([0, 0]), "an input or output"),
    "scratch-past-arena": (_set("programs.0.0.scratch", [0, 10**9]), "has scratch"),
    "internal-value-not-placed": (_set("memory.offsets", []), "no place in the arena"),
    # Value ids that instructions and the signature name.
    "reads-unknown-value": (_set("programs.1.0.in", [42]), "reads value %42"),
    "writes-a-constant": (_set("programs.0.0.out", [1]), "writes value %1"),
    "output-of-unknown-value": (_set("outputs.0.value", 77), "names value %77"),
    "output-never-written": (_set("programs.1", []), "never written"),
    "input-type-disagrees": (_set("inputs.0.shape", [2, 8, 8, 4]), r"float32\[2, 8, 8, 4\]"),
    "huge-value-id": (lambda b: b["values"].append([10**12, [1], "float32"]), "out of range"),
    "bad-batch-axis": (_set("inputs.0.batch_axis", 4), "batch axis 4"),
    # Instruction kinds this runtime does not have.
    "unknown-kind": (_set("programs.0.0.kind", "fft"), "instruction kind 'fft'"),
}


@pytest.mark.parametrize("case", _INCONSISTENT)
def test_inconsistent_contents_are_refused_and_leak_nothing(golden: bytes, case: str,
                                                            tmp_path: Path) -> None:
    edit, message = _INCONSISTENT[case]
    data = _repacked(golden, edit)
    device = _device()
    with pytest.raises(ExecutableError, match=message):
        load(data, device=device)
    assert not any(_used(device)), "a failed load kept device memory"
    load(golden, device=device).unload()  # the device is still usable
    path = tmp_path / "bad.neff"
    path.write_bytes(data)
    r = subprocess.run([str(Path(sys.executable).parent / "neuronish-cc"), "inspect", str(path)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "inconsistent" in r.stderr or "instruction kind" in r.stderr, r.stderr


def test_a_load_that_fails_after_reserving_releases_the_memory(golden: bytes,
                                                               monkeypatch) -> None:
    """Binding the second duplicate's program fails: the first one's memory and the
    reservation of both are given back. A bug in binding says the load failed; the
    host running out of memory stays a MemoryError (TensorFlow: ResourceExhausted),
    not a damaged executable."""
    from neuronish.runtime import program

    real_init = program.LoadedProgram.__init__
    for error, raised, message in [(KeyError(7), ExecutableError, "cannot load the "
                                    "executable: KeyError"),
                                   (MemoryError("host allocation failed"), MemoryError,
                                    "host allocation failed")]:
        calls: list[int] = []

        def flaky(self: object, *args: object, error=error, calls=calls) -> None:
            calls.append(1)
            if len(calls) == 2:
                raise error
            real_init(self, *args)

        monkeypatch.setattr(program.LoadedProgram, "__init__", flaky)
        device = _device()
        with pytest.raises(raised, match=message):
            load(golden, duplicates=2, device=device)
        assert len(calls) == 2 and not any(_used(device))


def test_streamed_writer_is_msgpacks_own_encoding(golden: bytes, tmp_path: Path) -> None:
    """The writer emits the constants' bin headers itself (so the weights are written from
    the arrays, never copied into a buffer): for data of each bin size class (8, 16 and
    32-bit lengths) the body must be exactly what msgpack writes for the same map, and
    `write` must put the same bytes in a file as `to_bytes` returns."""
    from dataclasses import replace

    from neuronish.runtime.executable import write

    exe = from_bytes(golden)
    (vid, weights), *_ = sorted(exe.constants.items())
    for count in (3, 100, 20_000):  # 12 bytes, 400 bytes, 80 KB: bin8, bin16, bin32
        data = np.arange(count, dtype=weights.dtype)
        grown = replace(exe, constants={**exe.constants, vid: data})
        raw = to_bytes(grown)
        body = raw[HEADER_SIZE:]
        parsed = msgpack.unpackb(body, strict_map_key=False)
        assert body == msgpack.packb(parsed, use_bin_type=True)
        (stored,) = [c for c in parsed["constants"] if c["value"] == vid]
        assert stored["data"] == data.tobytes() and stored["shape"] == [count]
        path = tmp_path / f"{count}.neff"
        with open(path, "wb") as f:
            f.write(b"lead-in")  # the header goes where the executable starts
            assert write(grown, f) == len(raw)
        assert path.read_bytes() == b"lead-in" + raw
        stream = _Unseekable()  # a pipe: hashed first, then written in order
        assert write(grown, stream) == len(raw) and bytes(stream.data) == raw


class _Unseekable(io.RawIOBase):
    def __init__(self) -> None:
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b: object) -> int:
        self.data += b
        return len(memoryview(b))


def test_constants_are_views_of_the_file_and_the_body_reads_as_msgpack_reads_it(
        golden: bytes) -> None:
    """The reader walks the body to take each constant's data as a view of the file's
    bytes (no copy of the weights); it must read exactly what msgpack reads, for the
    golden file and for bodies laid out otherwise (keys reordered, duplicated)."""
    from neuronish.runtime.executable import _unpack_body

    exe = from_bytes(golden)
    assert all(not a.flags.writeable and not a.flags.owndata for a in exe.constants.values())
    body = msgpack.unpackb(golden[HEADER_SIZE:], strict_map_key=False)

    def same(raw: dict) -> None:
        packed = msgpack.packb(raw, use_bin_type=True)
        want = msgpack.unpackb(packed, strict_map_key=False)
        got = _unpack_body(memoryview(packed))
        got["constants"] = [{k: bytes(v) if isinstance(v, memoryview) else v
                             for k, v in c.items()} for c in got["constants"]]
        assert got == want

    same(body)
    same(dict(reversed(list(body.items()))))
    same({**body, "constants": body["constants"] * 20})  # an array16 of them
    same({"constants": [], **body, "extra": list(range(20))})
    bad = msgpack.packb(body, use_bin_type=True) + b"\x00"  # trailing bytes: msgpack refuses
    with pytest.raises(msgpack.ExtraData):
        _unpack_body(memoryview(bad))
