"""The start-up benchmarks (a cold inductor compile, stage processes' start), in ``--smoke``
mode: about 40 s between them here, a module of their own so that xdist runs them beside
``light``'s others rather than after them."""

from __future__ import annotations

GROUP = "start"


def test_benchmark_smoke(run_smoke, benchmark: str) -> None:
    run_smoke(benchmark).check()
