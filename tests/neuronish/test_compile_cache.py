"""The compile cache (neuronish/compile_cache.py) and NEURONISH_CC_FLAGS: a second compile
of the same model reuses every subgraph, a damaged entry is recompiled (never loaded), the
cache stays under its size limit, and flags from the environment reach the compiler."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import neuronish.saved_model
from neuronish.cc_flags import CompilerFlagsError
from neuronish.compile_cache import CacheStats, CompileCache
from neuronish.errors import CompileWarning, SubgraphCompileError
from neuronish.runtime.executable import from_bytes
from tests.neuronish.test_compile_options import neuron_op_executables
from tests.neuronish.test_compile_recovery import small_model
from tests.neuronish.test_saved_model_compile import assert_matches_original


def _entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.neff"))


def test_second_compile_reuses_every_subgraph(tmp_path: Path,
                                              _fresh_compile_cache: Path) -> None:
    src = small_model(tmp_path / "src")
    first = neuronish.saved_model.compile(src, str(tmp_path / "a"))
    n = len(first["NeuronOps"])
    assert n >= 1 and first["compile_cache"]["hits"] == 0 and first["compile_cache"]["misses"] == n
    assert len(_entries(_fresh_compile_cache)) == n
    second = neuronish.saved_model.compile(src, str(tmp_path / "b"))
    assert second["compile_cache"]["hits"] == n and second["compile_cache"]["misses"] == 0
    assert all(op["cached"] for op in second["NeuronOps"])
    assert neuron_op_executables(tmp_path / "a") == neuron_op_executables(tmp_path / "b")
    assert f"compile cache: {n} hit(s), 0 miss(es)" in \
        neuronish.saved_model.format_report(second)
    assert_matches_original(src, tmp_path / "b", tmp_path)
    # Other flags are another key.
    third = neuronish.saved_model.compile(src, str(tmp_path / "c"),
                                          compiler_args=["--auto-cast", "all"])
    assert third["compile_cache"]["hits"] == 0 and third["compile_cache"]["misses"] == n


def test_an_int8_compile_is_found_again_by_its_calibration_set(
        tmp_path: Path, _fresh_compile_cache: Path) -> None:
    """The calibration file is written to a new scratch directory on every compile: the
    key holds its contents, not its path, so the same set is a hit and another is not."""
    import numpy as np

    src = small_model(tmp_path / "src")
    rng = np.random.default_rng(0)
    samples = [{"x": rng.standard_normal((1, 8)).astype(np.float32)} for _ in range(4)]
    first = neuronish.saved_model.compile(src, str(tmp_path / "a"), quantize="int8",
                                          calibration_data=samples)
    n = len(first["NeuronOps"])
    assert first["compile_cache"]["misses"] == n and first["compile_cache"]["hits"] == 0
    second = neuronish.saved_model.compile(src, str(tmp_path / "b"), quantize="int8",
                                           calibration_data=samples)
    assert second["compile_cache"]["hits"] == n and second["compile_cache"]["misses"] == 0
    assert neuron_op_executables(tmp_path / "a") == neuron_op_executables(tmp_path / "b")
    other = [{"x": s["x"] * 3} for s in samples]  # other ranges: other scales
    third = neuronish.saved_model.compile(src, str(tmp_path / "c"), quantize="int8",
                                          calibration_data=other)
    assert third["compile_cache"]["hits"] == 0 and third["compile_cache"]["misses"] == n
    assert neuron_op_executables(tmp_path / "c") != neuron_op_executables(tmp_path / "a")


def test_a_damaged_entry_is_recompiled_not_loaded(tmp_path: Path,
                                                  _fresh_compile_cache: Path) -> None:
    src = small_model(tmp_path / "src")
    neuronish.saved_model.compile(src, str(tmp_path / "a"))
    (entry,) = _entries(_fresh_compile_cache)
    data = bytearray(entry.read_bytes())
    data[-10] ^= 0xFF  # inside the executable: only the cache's own checksum sees it
    entry.write_bytes(bytes(data))
    with pytest.warns(CompileWarning, match="damaged"):
        report = neuronish.saved_model.compile(src, str(tmp_path / "b"))
    assert report["compile_cache"] == {"dir": str(_fresh_compile_cache), "hits": 0,
                                       "misses": 1, "damaged": 1, "evicted": 0}
    (exe,) = neuron_op_executables(tmp_path / "b")
    from_bytes(exe)  # a valid executable, compiled again
    assert entry.read_bytes()[-len(exe):] == exe  # and the entry was rewritten
    assert_matches_original(src, tmp_path / "b", tmp_path)


def test_size_limit_evicts_least_recently_used(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path / "c", max_bytes=3000)
    stats = CacheStats()
    keys = [f"{i:064x}" for i in range(4)]
    for key in keys:
        cache.put(key, bytes(900), stats)
        # mtime resolution: make the order explicit
        path = tmp_path / "c" / f"{key}.neff"
        os.utime(path, ns=(keys.index(key) * 10**9, keys.index(key) * 10**9))
    assert stats.evicted == 1
    assert cache.get(keys[0], stats) is None  # the oldest went
    assert cache.get(keys[3], stats) == bytes(900)
    assert sum(p.stat().st_size for p in (tmp_path / "c").glob("*.neff")) <= 3000
    cache.put("f" * 64, bytes(5000), stats)  # larger than the whole cache: not stored
    assert cache.get("f" * 64, stats) is None


def test_temporary_files_a_dead_writer_left_are_removed(tmp_path: Path) -> None:
    """A process killed while writing an entry leaves its .tmp- file, outside the size
    bound: the next write removes it once it is an hour old, and not before (another
    process may be writing it now)."""
    cache = CompileCache(tmp_path / "c")
    stats = CacheStats()
    cache.put("1" * 64, b"first", stats)
    old, fresh = tmp_path / "c" / ".tmp-dead", tmp_path / "c" / ".tmp-live"
    old.write_bytes(bytes(1000))
    fresh.write_bytes(bytes(1000))
    os.utime(old, (os.path.getmtime(old) - 7200,) * 2)
    cache.put("2" * 64, b"second", stats)
    assert not old.exists() and fresh.exists()
    assert cache.get("1" * 64, stats) == b"first" and cache.get("2" * 64, stats) == b"second"


def test_cache_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURONISH_COMPILE_CACHE", "off")
    src = small_model(tmp_path / "src")
    report = neuronish.saved_model.compile(src, str(tmp_path / "a"))
    assert report["compile_cache"]["hits"] == 0 and report["compile_cache"]["not_used"]


def test_env_flags_reach_every_compiler_invocation(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    src = small_model(tmp_path / "src")
    monkeypatch.setenv("NEURONISH_CC_FLAGS", "--auto-cast all --auto-cast-type fp16")
    neuronish.saved_model.compile(src, str(tmp_path / "a"), compiler_args=["--auto-cast",
                                                                           "matmult"])
    (exe,) = neuron_op_executables(tmp_path / "a")
    options = from_bytes(exe).compiler["options"]
    assert options["auto_cast"] == "all" and options["auto_cast_type"] == "fp16"


@pytest.mark.parametrize("flags, match", [
    ("--no-such-flag", r"bad_usage[\s\S]*NEURONISH_CC_FLAGS"),
    ("--output /tmp/x", "set by neuronish"),
    ("--auto-cast 'all", "cannot be split"),
    ("model.pb", "not a flag"),
])
def test_bad_env_flags_are_refused(flags: str, match: str, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    src = small_model(tmp_path / "src")
    monkeypatch.setenv("NEURONISH_CC_FLAGS", flags)
    with pytest.raises((SubgraphCompileError, CompilerFlagsError), match=match):
        neuronish.saved_model.compile(src, str(tmp_path / "a"))
    assert not (tmp_path / "a").exists()


def test_entries_and_assets_are_one_file_linked_not_copied(
        tmp_path: Path, _fresh_compile_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A miss links the compiler's executable into the cache, a hit links the entry into
    the new model's assets/: all the same file (the weights written once), each model
    loading and matching TensorFlow. An executable without its checksum record (a write
    cut short) is a miss, not a damaged entry."""
    from neuronish import external
    from tests.neuronish.test_external import _neuron_op_attrs

    monkeypatch.setenv("NEURONISH_EXTERNAL_THRESHOLD", "1KiB")
    src = small_model(tmp_path / "src")
    assets = []
    for name in ("a", "b"):
        neuronish.saved_model.compile(src, str(tmp_path / name))
        ((exe_ref, _, _),) = _neuron_op_attrs(tmp_path / name)
        digest, _ = external.parse_reference(exe_ref)
        assets.append(tmp_path / name / "assets" / f"{digest}.neff")
    (entry,) = _entries(_fresh_compile_cache)
    assert assets[0].samefile(entry) and assets[1].samefile(entry)
    assert entry.with_suffix(".sum").stat().st_size == 72
    for name in ("a", "b"):
        assert_matches_original(src, tmp_path / name, tmp_path)
    entry.with_suffix(".sum").unlink()
    stats = CacheStats()
    assert CompileCache(_fresh_compile_cache).get(entry.stem, stats) is None
    assert stats.damaged == 0


def test_key_of_a_graph_file_is_the_key_of_its_bytes(tmp_path: Path) -> None:
    """A job naming a file is keyed as if it carried the bytes (hashed while read, in
    one pass with the scan for traced-function debug info, which makes the bytes be
    parsed instead, wherever it lies: across the reader's 8 MiB pieces too)."""
    from neuronish.compile_cache import _key_from_file, cache_key
    from neuronish.compile_driver import CompileJob

    data = bytes(range(256)) * (40 << 10)  # 10 MiB, more than one piece
    path = tmp_path / "g.pb"
    path.write_bytes(data)
    io = {"inputs": {"x:0": [[1, 2], "float32"]}, "outputs": ["y:0"]}
    on_file, in_memory = CompileJob("a", path, io), CompileJob("a", data, io)
    assert cache_key(on_file, "cc 1", ["--x"]) == cache_key(in_memory, "cc 1", ["--x"])
    assert cache_key(on_file, "cc 1", []) != cache_key(on_file, "cc 2", [])
    for at in (0, (8 << 20) - 5, len(data) - 12):  # the mark across a piece boundary too
        marked = bytearray(data)
        marked[at:at + 12] = b"__inference_"
        path.write_bytes(marked)
        assert _key_from_file(path, on_file, "cc 1", []) is None
