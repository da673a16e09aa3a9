"""The C runtime library is compiled from the sources its cache key hashes (issue 25).

library.build() names the cached library by a hash of the sources; the compiler used to
read the tree again afterwards, so a source edited while a build ran could store a library
built from other text under the old key. Now the sources are read once and the compiler
reads that snapshot. The test edits a source after build() has read them (where the
compiler starts) and checks what the compiler would be given; nothing is compiled, and
the tree's sources are not touched (a copy stands in for them)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from runtime.capi import isa_table, library


def test_the_compiler_reads_the_snapshot_the_key_hashes(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    tree = tmp_path / "tree"
    (tree / "capi").mkdir(parents=True)
    (tree / "include").mkdir()
    for p in (*library.SOURCES, *library.HEADERS):
        shutil.copy(p, tree / ("include" if p.parent == library.INCLUDE else "capi") / p.name)
    monkeypatch.setattr(library, "INCLUDE", tree / "include")
    monkeypatch.setattr(library, "SOURCES", sorted((tree / "capi").glob("*.cc")))
    monkeypatch.setattr(library, "HEADERS", sorted((tree / "capi").glob("*.h"))
                        + [tree / "include" / "neuronish_runtime.h"])
    engine = tmp_path / "libengine.so"
    monkeypatch.setattr(library.engine_library, "build", lambda: engine)
    monkeypatch.setenv("NEURONISH_RUNTIME_CACHE", str(tmp_path / "cache"))
    keyed = {p.name: p.read_bytes() for p in (*library.SOURCES, *library.HEADERS)}
    edited = library.SOURCES[0]
    seen: dict[str, object] = {}

    def compile_now(self, name: str, command) -> Path:  # noqa: ANN001 - Cache.build's place
        edited.write_text(edited.read_text() + "\n#error edited after the key was read\n")
        cmd = command(str(tmp_path / "out.so"))
        sources = [Path(a) for a in cmd if a.endswith(".cc")]
        seen["sources"] = {p.name: p.read_bytes() for p in sources}
        seen["headers"] = {p.name: p.read_bytes() for p in sources[0].parent.glob("*.h")}
        seen["in_tree"] = [p for p in sources if p.is_relative_to(tree)]
        seen["name"] = name
        return tmp_path / "out.so"

    monkeypatch.setattr(library.Cache, "build", compile_now)
    library.build()
    assert seen["in_tree"] == [], "the compiler reads the tree, not the snapshot"
    assert len(seen["sources"]) == len(library.SOURCES)
    assert all(seen["sources"][n] == keyed[n] for n in seen["sources"])  # the edit unseen
    assert all(seen["headers"][n] == keyed[n] for n in seen["headers"] if n in keyed)
    files = {f"capi/{n}": keyed[n] for n in keyed if n != "neuronish_runtime.h"}
    files["include/neuronish_runtime.h"] = keyed["neuronish_runtime.h"]
    # (the key of what was compiled; the tree now hashes to another)
    assert seen["name"] == library.library_name(isa_table.header(), str(engine), (), files)
    assert seen["name"] != library.library_name(isa_table.header(), str(engine))
