"""The adversarial suite's long run (issue 23): many cases of every class, the table of
cases tried and held per class, and every case that did not hold.

    .venv/bin/python scripts/adversarial.py                 # the default counts
    .venv/bin/python scripts/adversarial.py --scale 10 --seed 7
    .venv/bin/python scripts/adversarial.py --only json_bodies,tensor_protos
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.adversarial import suite  # noqa: E402

LONG_RUN = {"driver_flags": 5000, "json_bodies": 2000, "tensor_protos": 5000,
            "run_dir_files": 1000, "int_division": 100, "fold_bounds": 12, "slow_clients": 6,
            "cache_entries": 400}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every count")
    parser.add_argument("--seed", type=int, default=23)
    parser.add_argument("--only", default="", help="comma-separated classes")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(LONG_RUN)
    unknown = sorted(set(names) - set(suite.CLASSES))
    if unknown:
        parser.error(f"unknown class(es) {unknown}; the classes: {', '.join(suite.CLASSES)}")
    counts = {n: max(1, round(LONG_RUN[n] * args.scale)) for n in names}
    results = suite.run(counts, seed=args.seed)
    print(suite.table(results))
    failed = [f"{n}: {f}" for n, r in results.items() for f in r.failures]
    for line in failed:
        print("NOT HELD", line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
