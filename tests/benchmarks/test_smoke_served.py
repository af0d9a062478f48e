"""The benchmarks that serve a deployment (a runtime's processes, HTTP), in ``--smoke`` mode."""

from __future__ import annotations

GROUP = "served"


def test_benchmark_smoke(run_smoke, benchmark: str) -> None:
    run_smoke(benchmark).check()
