"""Start-up latency of the ``omni`` commands that load no model, against the interpreter.

DESIGN.md promises that ``omni config``, ``omni plan`` and ``omni plugins
list`` answer in a fraction of a second because the core imports no ML
framework. What is left is Python start-up, imports and pydantic schema
building, so the useful yardstick is the bare interpreter of the same
environment: each command's median is printed as a multiple of
``python -c pass`` (issue 11 aims at 4x). The row "import deps only" is
the floor no change to omni can go below while the CLI is typer and the
schema pydantic (importing pydantic alone is about 4x here); each omni row's
"+ms deps" is what omni's own code adds to it. Every command runs as a whole,
fresh process, the way a user runs it, and the commands take turns round by
round, so load that comes and goes falls on all of them (a loaded machine still
inflates the ratios: a longer process is preempted more often).

The example is the seed's worked example (``examples/qwen3_tts.toml``, the
deploy file ``tests/config`` checks: mem_fraction_static 0.6, max_batch_size
16) with ``--vocoder.factory.max_batch_size 32 --mem-fraction-static 0.7``.
When the reference system's environment exists (built by
``/work/shared/tools/anchor-sglang-omni-venv.sh``; ``--reference`` or
``$ANCHOR_VENV``, default ``/tmp/anchor-sglang-omni``), its ``config resolve``
of the same example, written as its YAML, is timed too, and the two outputs
are compared. It prints figures; it is not a test.

    .venv/bin/python benchmarks/bench_cli.py [--runs 15] [--reference VENV]

``--smoke`` runs each command once, without warm-ups or the reference.

To find where the time goes: ``.venv/bin/python -X importtime -m omni_core config resolve …``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import tomli

from omni_core.sigterm import run_script

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "examples" / "qwen3_tts.toml"
FLAGS = ["--vocoder.factory.max_batch_size", "32", "--mem-fraction-static", "0.7"]
EXPLAIN_PATH = "tts_engine.engine.mem_fraction_static"
AIM = 4.0  # times the bare interpreter
FLOOR = "python -c pass"
RESOLVE = "omni config resolve"
# What every command imports before any omni code runs: the part no change to omni can shave
# (typer itself imports pydantic when a command runs). "+ms deps" is each command's median
# minus this one's: what omni's own code costs.
DEPS_LABEL = "python: import deps only"
DEPS = "import importlib.metadata, pluggy, tomli, typer; from pydantic import BaseModel, Field"
# The reference's pipeline classes, by omni pipeline name (its YAML names the class).
REFERENCE_CLASSES = {"qwen3-tts": "Qwen3TTSPipelineConfig"}
DEFAULT_REFERENCE = "/tmp/anchor-sglang-omni"


@dataclass
class Command:
    label: str
    argv: list[str]
    env: dict[str, str] | None = None
    times: list[float] = field(default_factory=list)
    peak_kib: int = 0

    def run_once(self, record: bool) -> None:
        """One fresh process: wall seconds and peak RSS (the child's ``ru_maxrss``)."""
        with tempfile.TemporaryFile() as stderr:  # a file: a pipe could fill and block
            start = time.perf_counter()
            proc = subprocess.Popen(
                self.argv, env=self.env, stdout=subprocess.DEVNULL, stderr=stderr
            )
            _, status, usage = os.wait4(proc.pid, 0)
            elapsed = time.perf_counter() - start
            if os.waitstatus_to_exitcode(status) != 0:
                stderr.seek(0)
                said = stderr.read().decode(errors="replace")
                raise SystemExit(f"failed: {' '.join(self.argv)}\n{said}")
        if record:
            self.times.append(elapsed)
            self.peak_kib = max(self.peak_kib, usage.ru_maxrss)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def p90(self) -> float:
        if len(self.times) < 2:
            return self.times[0]
        return statistics.quantiles(self.times, n=10, method="inclusive")[-1]


def omni() -> list[str]:
    """The console script next to this interpreter (what users run), else ``-m omni_core``."""
    script = Path(sys.executable).with_name("omni")
    return [str(script)] if script.exists() else [sys.executable, "-m", "omni_core"]


def our_commands(env: dict[str, str]) -> list[Command]:
    deploy = str(DEPLOY)
    plan = ["plan", "--pipeline", "qwen3-omni", "--gpus", "2", "--gpu-memory", "80GiB"]
    rows = {
        FLOOR: [sys.executable, "-c", "pass"],
        DEPS_LABEL: [sys.executable, "-c", DEPS],
        RESOLVE: [*omni(), "config", "resolve", deploy, *FLAGS, "--show", "diff"],
        "omni config explain": [*omni(), "config", "explain", deploy, EXPLAIN_PATH, *FLAGS],
        "omni plan qwen3-omni": [*omni(), *plan, "--no-detect"],
        "omni plugins list --json": [*omni(), "plugins", "list", "--json"],
    }
    return [Command(label, argv, env) for label, argv in rows.items()]


def reference_yaml(deploy: Path, directory: Path) -> Path:
    """The deploy file in the reference's YAML (JSON is YAML): same keys, class by name."""
    data = tomli.loads(deploy.read_text())
    pipeline = data.pop("pipeline")
    if pipeline not in REFERENCE_CLASSES:
        raise SystemExit(f"no reference pipeline class known for {pipeline!r}")
    path = directory / f"{deploy.stem}.yaml"
    path.write_text(json.dumps({"config_cls": REFERENCE_CLASSES[pipeline], **data}, indent=2))
    return path


def reference_command(venv: Path, yaml_path: Path) -> Command:
    module = ["-m", "sglang_omni.cli", "config", "resolve"]
    argv = [str(venv / "bin" / "python"), *module, "--config", str(yaml_path), *FLAGS]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return Command("reference config resolve", [*argv, "--show", "diff"], env)


def stdout_of(command: Command) -> str:
    done = subprocess.run(command.argv, env=command.env, capture_output=True, text=True)
    return done.stdout.strip()


def bytecode_note() -> str:
    """How many of omni_core's modules start from cached bytecode (the rest compile each run).

    Editable installs get no bytecode from pip, and where PYTHONDONTWRITEBYTECODE
    is set Python never writes it, so this alone moves the figures by ~15%.
    """
    spec = importlib.util.find_spec("omni_core")  # finds the package without running it
    sources = [p for d in spec.submodule_search_locations for p in Path(d).rglob("*.py")]
    cached = sum(
        1
        for source in sources
        if (pyc := Path(importlib.util.cache_from_source(str(source)))).exists()
        and pyc.stat().st_mtime >= source.stat().st_mtime
    )
    writes = "off" if os.environ.get("PYTHONDONTWRITEBYTECODE") else "on"
    return (
        f"omni_core modules with cached bytecode: {cached}/{len(sources)} "
        f"(bytecode writes {writes}; `make install` compiles them)"
    )


def rounds(commands: list[Command], warmups: int, runs: int) -> None:
    """Warm-up rounds (file cache, bytecode), then timed rounds; commands take turns."""
    for index in range(warmups + runs):
        for command in commands:
            command.run_once(record=index >= warmups)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="timed runs per command")
    parser.add_argument("--warmups", type=int, default=2, help="untimed runs per command first")
    parser.add_argument(
        "--reference",
        default=os.environ.get("ANCHOR_VENV", DEFAULT_REFERENCE),
        help="the reference system's venv (default $ANCHOR_VENV or %(default)s)",
    )
    parser.add_argument(
        "--reference-runs", type=int, default=5, help="timed runs of the reference (~10 s each)"
    )
    parser.add_argument(
        "--max-ratio", type=float, default=None, help="exit 1 when a median is above this x floor"
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, one repeat: checks the script runs (make test)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.runs, args.warmups = 1, 0

    env = {k: v for k, v in os.environ.items() if k != "OMNI_PLUGINS"}
    commands = our_commands(env)
    print(
        f"python {sys.version.split()[0]} ({sys.executable}) on {os.cpu_count()} CPUs; "
        f"{args.runs} runs each after {args.warmups} warm-ups"
    )
    print(bytecode_note())
    print(f"example: {DEPLOY.relative_to(REPO)} {' '.join(FLAGS)}")
    rounds(commands, args.warmups, args.runs)

    ours_resolve = next(c for c in commands if c.label == RESOLVE)
    venv = Path(args.reference)
    reference = None
    with tempfile.TemporaryDirectory() as tmp:
        if not args.smoke and (venv / "bin" / "python").exists():
            reference = reference_command(venv, reference_yaml(DEPLOY, Path(tmp)))
            rounds([reference], 1, args.reference_runs)
            ours = stdout_of(ours_resolve)
            theirs = "\n".join(line for line in stdout_of(reference).splitlines() if "->" in line)
            same = "same output" if ours == theirs else f"OUTPUTS DIFFER:\n{ours}\n--\n{theirs}"

    floor = next(c for c in commands if c.label == FLOOR).median
    print(
        f"\n{'command':<28} {'runs':>4} {'median s':>9} {'p90 s':>7} {'x floor':>8} "
        f"{'peak MiB':>9} {'+ms deps':>8}  aim <= {AIM:g}x"
    )
    deps = next(c for c in commands if c.label == DEPS_LABEL).median
    over = False
    for command in [*commands, *([reference] if reference else [])]:
        ratio = command.median / floor
        verdict = ""
        if command.label.startswith("omni"):
            verdict = "ok" if ratio <= AIM else "over"
            over |= args.max_ratio is not None and ratio > args.max_ratio
        own = f"{(command.median - deps) * 1000:>8.0f}" if command.label.startswith("omni") else ""
        print(
            f"{command.label:<28} {len(command.times):>4} {command.median:>9.3f} "
            f"{command.p90:>7.3f} {ratio:>7.1f}x {command.peak_kib / 1024:>9.1f} {own:>8}  "
            f"{verdict}"
        )
    if reference:
        factor = reference.median / ours_resolve.median
        print(f"\nreference / omni, config resolve (median): {factor:.1f}x; {same}")
    elif args.smoke:
        print("\nreference row skipped: --smoke")
    else:
        print(
            f"\nreference row skipped: no venv at {venv} "
            "(build it with /work/shared/tools/anchor-sglang-omni-venv.sh, or pass --reference)"
        )
    return 1 if over else 0


if __name__ == "__main__":
    run_script(main)
