"""A bounded sample of the adversarial suite (tests/adversarial/suite.py): every class of
attack on the bounds of requests, graphs, cache entries and files, generated from a fixed
seed; every case must hold. `scripts/adversarial.py` runs the long version and prints the
figures."""

from __future__ import annotations

import pytest

from tests.adversarial import suite

CI_SAMPLE = {"driver_flags": 200, "json_bodies": 60, "tensor_protos": 200,
             "run_dir_files": 60, "int_division": 6, "fold_bounds": 2, "slow_clients": 1,
             "cache_entries": 40}


@pytest.mark.parametrize("name", list(CI_SAMPLE))
def test_every_case_holds(name: str) -> None:
    result = suite.run({name: CI_SAMPLE[name]})[name]
    print(f"\n{name}: {result.held}/{result.tried} held in {result.seconds:.1f} s")
    assert result.tried == CI_SAMPLE[name]
    assert result.held == result.tried, "\n".join(result.failures[:10])
