"""Wheels that install omni on a CUDA host with no network access, next to the torch it has.

Run where pip reaches a package index (``make wheelhouse``)::

    .venv/bin/python tools/wheelhouse.py [--out .whl] [--python-version 3.12]
        [--present tools/gpu_image_packages.txt]

then carry the folder to the GPU host and run the GPU check there
(``tools/gpu_check_offline.sh``, which installs these wheels with
``--no-index --no-deps`` into a folder of their own and runs
``benchmarks/gpu_check.py``).

Why: GPU machines are often images with CUDA and PyTorch baked in and no
route to PyPI (this project's own GPU lender is one), so ``make gpu-check``,
which builds a virtual environment from the index, cannot start there. The
wheelhouse holds omni's own distributions (the core and every plugin under
``plugins/``) and the dependencies of theirs that the target lacks, resolved
for the target's Python and platform rather than this machine's. Packages the
target already has (``--present``: one name per line, a ``pip freeze`` works
too) are left out, torch among them: the image's CUDA build is the one to use,
and it weighs gigabytes. ``--present`` defaults to the package list of the
CUDA image our GPU check is planned on (``tools/gpu_image_packages.txt``).

The folder is written whole or not at all: wheels are gathered in a temporary
folder beside it and moved in at the end.
"""

from __future__ import annotations

import argparse
import email.parser
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PRESENT = REPO / "tools" / "gpu_image_packages.txt"
PLATFORMS = (  # what pip may pick for an x86-64 glibc host; it matches each tag exactly
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
#: omni's own extras that the GPU check uses: ``gpu`` reads GPU memory through NVML,
#: ``test`` holds what the test suite imports while pytest collects it (the check runs
#: ``pytest -m cuda`` over the whole suite, and a module that cannot be imported fails it).
EXTRAS = {"omni-core": ("gpu", "test")}
#: Left out unless asked for (``--leave-out`` replaces the list): the linter and the
#: playground's browser driver, which no run on a GPU host uses, and PyAV (33 MiB; the
#: server's mp3/opus/aac encoding and video input, which the GPU check does not ask
#: for, and every test that needs it skips itself without it).
LEFT_OUT = ("ruff", "playwright", "av")


def normalize(name: str) -> str:
    """A project name as PEP 503 compares them (``Foo_Bar`` == ``foo-bar``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """The project a requirement names (``pydantic<3,>=2.6`` -> ``pydantic``)."""
    return normalize(re.split(r"[=<>!~\[;( ]", requirement.strip(), maxsplit=1)[0])


def read_present(path: Path) -> set[str]:
    """Names listed in ``path``: one per line, ``#`` comments, ``==version`` ignored."""
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(requirement_name(line))
    return names


def wheel_name(path: Path) -> str:
    return normalize(path.name.split("-", 1)[0])


def requirements(wheel: Path, extras: tuple[str, ...]) -> list[str]:
    """The wheel's ``Requires-Dist`` lines that apply without extras, or with ``extras``."""
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        message = email.parser.Parser().parsestr(archive.read(meta).decode())
    wanted = []
    for line in message.get_all("Requires-Dist") or []:
        requirement, _, marker = line.partition(";")
        extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", marker)
        if extra is None or extra.group(1) in extras:
            wanted.append(requirement.strip())
    return wanted


def omni_sources() -> list[Path]:
    return [REPO, *sorted(p.parent for p in (REPO / "plugins").glob("*/pyproject.toml"))]


#: Never part of a distribution's source: setuptools' build output, caches, environments.
_NOT_SOURCE = ("build", "dist", "*.egg-info", "__pycache__", ".*", "plugins")


def copied_sources(into: Path) -> list[Path]:
    """Each of :func:`omni_sources` copied under ``into``, to be built there.

    Why: setuptools builds in the source tree (``build/``, ``*.egg-info``), and a
    stale ``build/lib`` from an earlier run can even put deleted modules into a
    wheel; a fresh copy leaves the checkout as it was and builds only what is there.
    """
    copies = []
    for source in omni_sources():
        copy = into / (source.name if source != REPO else "omni-core")
        shutil.copytree(source, copy, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
        copies.append(copy)
    return copies


def pip(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"wheelhouse: pip {args[0]} failed (exit {done.returncode}); see above")


def missing_requirements(ours: list[Path], skipped: set[str]) -> list[str]:
    """What ``ours`` require (with :data:`EXTRAS`), less ``skipped`` and omni's own."""
    wanted: dict[str, str] = {}
    for wheel in ours:
        for requirement in requirements(wheel, EXTRAS.get(wheel_name(wheel), ())):
            name = requirement_name(requirement)
            if name not in skipped and not name.startswith("omni-"):
                wanted.setdefault(name, requirement)
    return list(wanted.values())


def build(out: Path, python_version: str, skipped: set[str]) -> list[Path]:
    """Fill ``out`` (a new, empty folder) and return the wheels in it."""
    own, deps, sources = out / "own", out / "deps", out / "sources"
    pip(
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(own),
        *map(str, copied_sources(sources)),
    )
    shutil.rmtree(sources)
    ours = sorted(own.glob("*.whl"))
    wanted = missing_requirements(ours, skipped)
    deps.mkdir()
    if wanted:
        platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
        pip(
            "download",
            "-q",
            "--only-binary=:all:",
            "--implementation",
            "cp",
            "--python-version",
            python_version,
            *platforms,
            "-d",
            str(deps),
            *wanted,
        )
    # What the missing packages need in turn, the target may have too.
    kept = [w for w in sorted(deps.glob("*.whl")) if wheel_name(w) not in skipped]
    for wheel in [*ours, *kept]:
        wheel.rename(out / wheel.name)
    shutil.rmtree(own)
    shutil.rmtree(deps)
    return sorted(out.glob("*.whl"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO / ".whl",
        help="the folder to (re)write (default: .whl in the repository)",
    )
    parser.add_argument(
        "--python-version", default="3.12", help="the target's Python, major.minor (default: 3.12)"
    )
    parser.add_argument(
        "--present",
        type=Path,
        default=DEFAULT_PRESENT,
        help="packages the target has, one name per line (default: %(default)s)",
    )
    parser.add_argument(
        "--leave-out",
        action="append",
        metavar="NAME",
        help="a dependency not to carry; repeat for more (default: "
        + ", ".join(LEFT_OUT)
        + "; --leave-out '' carries them all)",
    )
    args = parser.parse_args(argv)
    left_out = {normalize(n) for n in (LEFT_OUT if args.leave_out is None else args.leave_out) if n}
    if not re.fullmatch(r"3\.\d+", args.python_version):
        parser.error(f"--python-version: {args.python_version!r} is not major.minor, e.g. 3.12")
    if not args.present.is_file():
        parser.error(f"--present: {args.present} is not a file")
    present = read_present(args.present)
    if "torch" not in present:
        parser.error(
            f"--present: {args.present} does not list torch; the wheelhouse is for a host "
            "whose torch is installed (a CUDA build, gigabytes), so it never carries one"
        )
    out = args.out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        wheels = build(staging, args.python_version, present | left_out)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    total = 0
    for wheel in wheels:
        size = (out / wheel.name).stat().st_size
        total += size
        print(f"{size / 2**20:7.2f} MiB  {wheel.name}")
    print(f"{len(wheels)} wheels, {total / 2**20:.1f} MiB in {out}")
    return 0


if __name__ == "__main__":
    from omni_core.sigterm import run_script

    run_script(main)  # SIGTERM: the staging folder is removed, .whl left as it was
