#!/usr/bin/env python3
"""Executable fuzzing, the larger run (CI runs 6000 in tests/runtime/test_executable_fuzz.py).

    .venv/bin/python scripts/fuzz_executables.py --count 50000 --seed 1 --children 2

Builds re-sealed mutants of real executables (field- and byte-level, see
tests/runtime/executable_fuzz.py), loads and runs each in a child process under a per-mutant
deadline, and prints the outcome counts and every crash, hang, foreign exception and
leak. Exit status 1 if there was any.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.runtime.executable_fuzz import fuzz  # noqa: E402 (after the path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20000, help="mutants (default 20000)")
    parser.add_argument("--seed", type=int, default=1, help="mutation RNG seed (default 1)")
    parser.add_argument("--children", type=int, default=2,
                        help="child processes running at once (default 2)")
    parser.add_argument("--timeout", type=float, default=20.0,
                        help="seconds one mutant may take before it counts as a hang")
    parser.add_argument("--engine", choices=("native", "numpy"),
                        help="NEURONISH_ENGINE for the children (default: the environment's)")
    parser.add_argument("--examples", action="store_true",
                        help="also print a few mutants of every outcome")
    args = parser.parse_args()
    report = fuzz(args.count, seed=args.seed, children=args.children, timeout=args.timeout,
                  engine=args.engine)
    print(report.summary())
    if args.examples:
        for outcome, labels in sorted(report.examples.items()):
            print(f"\n{outcome}:")
            for label in labels:
                print(f"  {label[:300]}")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
