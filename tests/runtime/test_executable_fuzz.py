"""Executables are untrusted input: thousands of re-sealed mutants of real executables,
each loaded and run in a child process, never crash, hang or raise anything but the
runtime's own errors. The harness itself is checked to catch all three."""

from __future__ import annotations

import pytest

from tests.runtime import executable_fuzz as fz


def test_harness_pins_crashes_hangs_and_foreign_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    # Canaries in the child: a SIGSEGV at mutant 2, a hang at 4, a TypeError at 6. Each
    # must be reported against its own mutant, and a fresh child must go on after it.
    monkeypatch.setenv("NEURONISH_FUZZ_CANARY", "crash=2,hang=4,foreign=6")
    golden = fz.GOLDEN.read_bytes()
    items = [(f"golden copy {i}", golden) for i in range(8)]
    report = fz.Report()
    fz.run_batch(items, timeout=3.0, report=report)
    assert report.total == 8
    assert [c.split(":")[0] for c in report.crashes] == ["#2 golden copy 2"]
    assert "signal 11" in report.crashes[0]
    assert report.hangs == ["#4 golden copy 4"]
    assert len(report.foreign) == 1 and report.foreign[0].startswith("#6 golden copy 6: "
                                                                     "foreign:TypeError")
    assert report.outcomes["ok"] == 5 and not report.leaks


@pytest.mark.parametrize("engine,count", [("native", 4000), ("numpy", 2000)])
def test_mutated_executables_never_crash_hang_or_escape(engine: str, count: int) -> None:
    # Both engines: the native one (oneDNN) by default, and the numpy reference that
    # runs whatever the native one leaves to it or when it cannot be built.
    if engine == "native":  # built here, once, before the children start
        from neuronish.runtime.native import library

        assert library.load() is not None, library.why_not()
    report = fz.fuzz(count, seed={"native": 0, "numpy": 1}[engine], children=2,
                     timeout=20.0, engine=engine)
    print(report.summary())
    assert report.total == count
    assert not report.failures, report.summary()
    # The mutants reach both sides: most are refused, some still load and run.
    assert report.outcomes["runtime:ExecutableError"] > count // 2
    assert report.outcomes["ok"] > count // 20
