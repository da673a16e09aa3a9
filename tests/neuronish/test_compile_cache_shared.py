"""The compile cache shared by many writers (many machines mounting one cache
directory, e.g. over NFS): several processes put the same key into one
directory at once, with the same executable (what a deterministic compile writes) and
with different ones, while looking it up. Every hit must be bytes some writer put
under that key, and the file handed out must hold exactly those bytes; a torn pair
(one writer's executable beside another's record) is a miss, never a wrong hit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

WRITERS = 6
ROUNDS = 150

WRITER = r"""
import json, os, sys, tempfile, warnings
from pathlib import Path
from neuronish.compile_cache import CacheStats, CompileCache

root, index, rounds, key, writers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
    sys.argv[4], int(sys.argv[5])
common = b"same executable " * 4096                 # what every writer compiles alike
own = b"writer %d " % index * 5000                  # a compile that came out different
payloads = {common} | {b"writer %d " % i * 5000 for i in range(writers)}
cache = CompileCache(root)
stats = CacheStats()
hits = misses = 0
bad = []
warnings.simplefilter("ignore")                     # a torn pair is warned about: a miss
with tempfile.TemporaryDirectory() as into:
    for i in range(rounds):
        cache.put(key, common if i % 2 else own, stats)
        found = cache.lookup(key, stats, into=into)
        if found is None:
            misses += 1
            continue
        data, file = bytes(found[0]), found[1]
        hits += 1
        if data not in payloads:
            bad.append("a hit with bytes nobody put")
        if Path(file).read_bytes() != data:
            bad.append("the linked file differs from the bytes checked")
        os.unlink(file)
print(json.dumps({"hits": hits, "misses": misses, "damaged": stats.damaged, "bad": bad[:5]}))
"""


def _payloads() -> set[bytes]:
    return {b"same executable " * 4096} | {b"writer %d " % i * 5000 for i in range(WRITERS)}


def test_concurrent_writers_of_one_key_never_give_a_wrong_hit(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    key = "ab" * 32
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(root), str(i), str(ROUNDS),
                               key, str(WRITERS)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for i in range(WRITERS)]
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))
    for r in reports:
        assert r["bad"] == [], r
    hits = sum(r["hits"] for r in reports)
    print(f"\n{WRITERS} writers x {ROUNDS} rounds: {hits} hits, "
          f"{sum(r['misses'] for r in reports)} misses, "
          f"{sum(r['damaged'] for r in reports)} torn pairs refused")
    assert hits > 0  # the race did not simply make every lookup miss
    # What is left is one consistent entry (or none), never a pair that mismatches.
    from neuronish.compile_cache import CacheStats, CompileCache
    stats = CacheStats()
    found = CompileCache(root).get(key, stats)
    assert found is None or found in _payloads()
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(".tmp-")) == []
    assert os.stat(root).st_mode & 0o777 == 0o700
