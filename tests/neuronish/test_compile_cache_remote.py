"""The compile cache's shared tier (many machines, one object store through fsspec).
Two "machines" here are two local cache directories sharing one store URL
(fsspec's `file://` driver: the code path an `s3://` or `gs://` URL takes, on a store
this machine has). The second machine compiles nothing; a forged or torn entry in the
store is a miss, never a wrong hit."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import neuronish.saved_model
from neuronish.errors import CompileWarning
from neuronish.remote_cache import RemoteCache
from tests.neuronish.test_compile_options import neuron_op_executables
from tests.neuronish.test_compile_recovery import small_model
from tests.neuronish.test_saved_model_compile import assert_matches_original


def _machine(monkeypatch: pytest.MonkeyPatch, local: Path, store: str,
             secret: Path | None = None) -> None:
    monkeypatch.setenv("NEURONISH_COMPILE_CACHE", str(local))
    monkeypatch.setenv("NEURONISH_COMPILE_CACHE_REMOTE", store)
    monkeypatch.delenv("NEURONISH_CC_FLAGS", raising=False)
    if secret is None:
        monkeypatch.delenv("NEURONISH_COMPILE_CACHE_REMOTE_SECRET", raising=False)
    else:
        monkeypatch.setenv("NEURONISH_COMPILE_CACHE_REMOTE_SECRET", str(secret))


def test_a_second_machine_takes_every_executable_from_the_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = small_model(tmp_path / "src")
    store = f"file://{tmp_path / 'store'}"
    _machine(monkeypatch, tmp_path / "machine-a", store)
    first = neuronish.saved_model.compile(src, str(tmp_path / "a"))
    n = len(first["NeuronOps"])
    assert n >= 1 and first["compile_cache"]["misses"] == n
    assert len(list((tmp_path / "store").glob("*.neff"))) == n

    _machine(monkeypatch, tmp_path / "machine-b", store)
    second = neuronish.saved_model.compile(src, str(tmp_path / "b"))
    assert second["compile_cache"]["hits"] == n and second["compile_cache"]["misses"] == 0
    assert second["compile_cache"]["shared_hits"] == n
    assert neuron_op_executables(tmp_path / "a") == neuron_op_executables(tmp_path / "b")
    assert len(list((tmp_path / "machine-b").glob("*.neff"))) == n  # now local too
    assert_matches_original(src, tmp_path / "b", tmp_path)


def test_an_entry_forged_without_the_secret_is_compiled_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = small_model(tmp_path / "src")
    secret = tmp_path / "secret"
    secret.write_bytes(b"0123456789abcdef0123456789abcdef")
    store = tmp_path / "store"
    _machine(monkeypatch, tmp_path / "machine-a", f"file://{store}", secret)
    neuronish.saved_model.compile(src, str(tmp_path / "a"))
    (entry,) = store.glob("*.neff")
    record = entry.with_suffix(".sum")
    key = entry.stem
    # Another executable under this key, with the record an attacker without the secret
    # can compute (the plain digest a store without a secret uses).
    forged = entry.read_bytes()[:-10] + bytes(10)
    entry.write_bytes(forged)
    message = bytes.fromhex(key) + hashlib.sha256(forged).digest()
    record.write_bytes(record.read_bytes()[:40] + hashlib.sha256(message).digest())

    _machine(monkeypatch, tmp_path / "machine-b", f"file://{store}", secret)
    report = neuronish.saved_model.compile(src, str(tmp_path / "b"))
    assert report["compile_cache"]["hits"] == 0 and report["compile_cache"]["misses"] == 1
    assert neuron_op_executables(tmp_path / "b") != [forged]
    assert_matches_original(src, tmp_path / "b", tmp_path)


def test_an_oversized_object_is_refused_before_it_is_read(tmp_path: Path) -> None:
    store = RemoteCache(f"file://{tmp_path}", max_entry_bytes=1000)
    key = "cd" * 32
    store.put(key, b"x" * 2000)
    with pytest.warns(CompileWarning, match="2000 bytes, more than the 1000"):
        assert store.get(key) is None
    store.put(key, b"y" * 500)
    assert store.get(key) == b"y" * 500


def test_an_unusable_store_url_is_a_warning_not_a_failure(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURONISH_COMPILE_CACHE_REMOTE", "nosuchprotocol://bucket/x")
    monkeypatch.delenv("NEURONISH_COMPILE_CACHE_REMOTE_SECRET", raising=False)
    with pytest.warns(CompileWarning, match="shared compile cache not used.*nosuchprotocol"):
        assert RemoteCache.from_env() is None


WRITER = r"""
import json, sys, warnings
from neuronish.remote_cache import RemoteCache
url, index, rounds, key = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
common = b"same executable " * 4096
own = b"writer %d " % index * 5000
payloads = {common} | {b"writer %d " % i * 5000 for i in range(6)}
store = RemoteCache(url)
hits = misses = 0
bad = 0
warnings.simplefilter("ignore")
for i in range(rounds):
    store.put(key, common if i % 2 else own)
    got = store.get(key)
    if got is None:
        misses += 1
    else:
        hits += 1
        bad += got not in payloads
print(json.dumps({"hits": hits, "misses": misses, "bad": bad}))
"""


def test_concurrent_writers_to_the_store_never_give_a_wrong_hit(tmp_path: Path) -> None:
    url, key = f"file://{tmp_path / 'store'}", "ef" * 32
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, url, str(i), "60", key],
                              stdout=subprocess.PIPE, text=True) for i in range(6)]
    results = [json.loads(p.communicate(timeout=600)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sum(r["bad"] for r in results) == 0
    assert sum(r["hits"] for r in results) > 0  # the race did not starve every reader
