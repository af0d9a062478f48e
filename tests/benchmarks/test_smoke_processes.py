"""The benchmarks that start whole servers or clusters (soak, Ray), in ``--smoke`` mode."""

from __future__ import annotations

GROUP = "processes"


def test_benchmark_smoke(run_smoke, benchmark: str) -> None:
    run_smoke(benchmark).check()
