"""How long planning takes: each shipped pipeline, and generated pipelines that grow.

Planning runs before every ``omni serve`` and on every ``omni plan``; the
target is under 1 ms for the shipped pipelines (the reference system takes
1-2 ms) and near-linear growth with the number of stage instances. Configs
are built (and validated) outside the timed region: what is timed is
``plan_deployment`` alone, against a declared inventory, median of repeats.

Run: .venv/bin/python benchmarks/bench_plan.py (``--smoke``: a few repeats, chains of 10
and 100 stages)
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import ClassVar

from omni_core import EngineStageConfig, PipelineConfig, StageConfig
from omni_core.errors import ConfigError
from omni_core.plan import GpuInventory, plan_deployment
from omni_core.plugins import OmniPlugins
from omni_core.sigterm import run_script

GiB = 1024**3
GPUS = 8
STAGES_PER_PROCESS = 4
REPLICAS = 2


def timed(config, inventory, plugins, repeats: int) -> float:
    """Median seconds of ``repeats`` plans (after one warm-up)."""
    plan_deployment(config, inventory, plugins)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        plan_deployment(config, inventory, plugins)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def generated(n: int) -> PipelineConfig:
    """A chain of ``n`` stages, four per process, every process with two replicas.

    One stage in four is CPU work, the rest GPU stages (every fourth an
    engine) with declared shares small enough to fit anywhere.
    """
    processes = -(-n // STAGES_PER_PROCESS)
    share = int(0.9 / (n * REPLICAS) * 10**7) / 10**7  # fits even if all land on one GPU

    def stage(i: int) -> StageConfig:
        process = f"p{i // STAGES_PER_PROCESS}"
        wiring = {"terminal": True} if i == n - 1 else {"next": f"s{i + 1}"}
        if i % 4 == 0:
            return StageConfig(name=f"s{i}", factory_path="m:f", process=process, **wiring)
        cls = EngineStageConfig if i % 4 == 1 else StageConfig
        gpu = (i // STAGES_PER_PROCESS) % GPUS
        return cls(
            name=f"s{i}",
            factory_path="m:f",
            process=process,
            gpu=gpu,
            gpu_memory_fraction=share,
            **wiring,
        )

    class Generated(PipelineConfig):
        pipeline_name: ClassVar[str] = f"generated-{n}"
        entry_stage: ClassVar[str] = "s0"

        @classmethod
        def default_stages(cls) -> list[StageConfig]:
            return [stage(i) for i in range(n)]

    replicas = {
        f"p{p}": {
            "num_replicas": REPLICAS,
            "replica_devices": [(p + r) % GPUS for r in range(REPLICAS)],
        }
        for p in range(processes)
    }
    return Generated(processes=replicas, endpoints={"base_path": "/tmp/o"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, one repeat: checks the script runs (make test)",
    )
    args = parser.parse_args()
    shipped, auto_repeats, budget = (3, 3, 20) if args.smoke else (500, 200, 2000)
    plugins = OmniPlugins()
    inventory = GpuInventory.uniform(2, 80 * GiB, mps_available=True)
    print("shipped pipelines (declared policy, 2 x 80 GiB; auto where noted)")
    for name in sorted(plugins.pipelines()):
        cls = plugins.pipeline(name)
        config = cls()
        if cls.default_placement_policy == "colocate":
            shares = {
                "image_encoder": 0.03,
                "audio_encoder": 0.03,
                "thinker": 0.78,
                "talker_ar": 0.08,
                "code2wav": 0.02,
            }
            config = cls(
                stages=[
                    s.model_copy(update={"gpu_memory_fraction": shares.get(s.name)})
                    for s in cls.default_stages()
                ]
            )
        seconds = timed(config, inventory, plugins, shipped)
        auto = "-"  # the colocated pipeline is defined by its colocate policy
        if cls.default_placement_policy != "colocate":
            try:
                auto_seconds = timed(
                    cls(placement={"policy": "auto"}), inventory, plugins, auto_repeats
                )
                auto = f"{auto_seconds * 1e6:.1f} us"
            except ConfigError:  # a pipeline whose plugin estimates no memory (omni-hello)
                auto = "no estimate"
        flag = "ok" if seconds < 1e-3 else "OVER 1 ms"
        print(f"  {name:24s} {seconds * 1e6:8.1f} us   auto {auto:>9s}   {flag}")

    print(
        f"\ngenerated chains ({STAGES_PER_PROCESS} stages per process, {REPLICAS} replicas, "
        f"{GPUS} GPUs)"
    )
    wide = GpuInventory.uniform(GPUS, 80 * GiB, mps_available=True)
    previous = None
    for n in (10, 100) if args.smoke else (10, 100, 1000):
        config = generated(n)
        seconds = timed(config, wide, plugins, max(2, budget // n))
        instances = n * REPLICAS
        per = seconds / instances * 1e6
        growth = f"x{seconds / previous:5.1f} for x10 stages" if previous else ""
        print(
            f"  {n:5d} stages ({instances:5d} instances) {seconds * 1e3:8.2f} ms  "
            f"{per:6.2f} us/instance  {growth}"
        )
        previous = seconds


if __name__ == "__main__":
    run_script(main)
