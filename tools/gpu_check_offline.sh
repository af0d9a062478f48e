#!/usr/bin/env bash
# The GPU check on a CUDA host with no network access, from the repository root:
#
#   tools/gpu_check_offline.sh [gpu_check.py's options, e.g. --out /tmp/gpu.json]
#
# It installs the wheelhouse that tools/wheelhouse.py made (WHEELS, default .whl) into a
# folder of its own (SITE, default /tmp/omni-site) with --no-index --no-deps, so that the
# host's Python (PYTHON, default python3) and its CUDA build of torch stay as they are, then
# runs benchmarks/gpu_check.py with that folder first on PYTHONPATH. Exit status: the check's
# (0 passed, 1 a phase failed, 2 no CUDA device), or 3 when the set-up itself failed.
set -uo pipefail

WHEELS=${WHEELS:-.whl}
SITE=${SITE:-/tmp/omni-site}
PYTHON=${PYTHON:-python3}

fail() { echo "gpu_check_offline: $*" >&2; exit 3; }

[ -f benchmarks/gpu_check.py ] || fail "run it from the repository root (no benchmarks/gpu_check.py here)"
compgen -G "$WHEELS/omni_core-*.whl" >/dev/null \
  || fail "no omni wheels in $WHEELS: run 'make wheelhouse' where pip reaches an index, and bring $WHEELS along"
"$PYTHON" -c "import torch" 2>/dev/null \
  || fail "$PYTHON cannot import torch: the wheelhouse brings no torch; point PYTHON at the host's Python with its CUDA build"

"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" "$WHEELS"/*.whl || fail "installing $WHEELS into $SITE failed (above)"

export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$SITE/bin:$PATH"
missing=$("$PYTHON" -m pip check 2>/dev/null | grep -E '^omni-' || true)
[ -z "$missing" ] || fail "the host lacks what omni needs and the wheelhouse did not bring it (list it in --present no more, and run 'make wheelhouse' again):
$missing"

exec "$PYTHON" benchmarks/gpu_check.py "$@"
