"""The import rules of docs/contracts.md ("The parts and what they may import"), read
from the source: each part's modules, every import statement, relative ones resolved."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# folder -> its import name (pyproject's package-dir)
PARTS = {"neuronish": "neuronish", "cc": "neuronish.cc", "runtime": "neuronish.runtime"}


def imports_of(folder: str) -> list[tuple[str, int, str]]:
    """(file, line, imported module) for every import in the part's Python files."""
    found = []
    base = PARTS[folder]
    for path in sorted((ROOT / folder).rglob("*.py")):
        rel = path.relative_to(ROOT / folder)
        package = ".".join([base, *rel.parent.parts]) if rel.parent.parts else base
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level:  # resolved against this file's package
                    parts = package.split(".")
                    module = ".".join(parts[:len(parts) - node.level + 1] + [module]).strip(".")
                # `from a import b` may import module a.b: record that name
                names = [f"{module}.{a.name}" for a in node.names]
            else:
                continue
            found += [(f"{folder}/{rel}", node.lineno, n) for n in names]
    return found


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("folder", ["cc", "runtime"])
def test_the_compiler_and_the_runtime_never_import_tensorflow(folder: str) -> None:
    bad = [i for i in imports_of(folder) if _under(i[2], ("tensorflow", "keras", "tf_keras"))]
    assert not bad, f"{folder}/ must never import TensorFlow (docs/contracts.md): {bad}"


def test_the_tensorflow_side_never_imports_the_compiler_in_process() -> None:
    bad = [i for i in imports_of("neuronish") if _under(i[2], ("neuronish.cc",))]
    assert not bad, ("neuronish/ runs the compiler as its own process and shares only "
                     f"neuronish.contracts / neuronish.common with it: {bad}")


def test_the_compiler_imports_only_the_shared_modules_of_neuronish() -> None:
    allowed = ("neuronish.cc", "neuronish.contracts", "neuronish.common",
               "neuronish.runtime")
    bad = [i for i in imports_of("cc")
           if _under(i[2], ("neuronish",)) and not _under(i[2], allowed)]
    assert not bad, f"cc/ may import only {allowed} of neuronish: {bad}"


def test_the_runtime_imports_nothing_of_the_other_parts() -> None:
    bad = [i for i in imports_of("runtime")
           if _under(i[2], ("neuronish",)) and not _under(i[2], ("neuronish.runtime",))]
    assert not bad, f"runtime/ must stand alone (docs/contracts.md): {bad}"


def test_the_import_reader_sees_relative_imports() -> None:
    # the rules above mean nothing if relative imports were missed: runtime/kernels/conv.py
    # imports `from .. import isa`
    assert ("runtime/kernels/conv.py", "neuronish.runtime.isa") in {
        (f, m) for f, _, m in imports_of("runtime")}
