"""Which CPU kernel runs a decode-shaped linear layer fastest on this machine, measured once.

Why: the routes in :mod:`.cpu_linear` were measured on one Intel machine
(MKL's float32 kernel faster up to three rows, ``torch.mv`` and the
transposed product faster than ``F.linear`` for bf16 rows), and they do not
hold elsewhere. On an AMD EPYC (Zen 4, 2 threads) ``bench_cpu_linear.py``
measured the opposite for every one of them: oneDNN twice MKL's speed at one
float32 row (28 against 14 GB/s), ``F.linear`` 1.1-1.8x the bf16 routes, and
bf16 weights reordered to oneDNN's blocked layout 1.9x ``F.linear`` (a fourth
route, :func:`blocked_faster`, which the Intel machine did not gain from), and
those blocked products faster at four rows than at one or two (a fifth,
:func:`padding_pays`: a lone request's row is padded with zeros). A
user's machine is neither, so the first stage process that packs weights
times each pair of kernels on 1024x3072 layers, as many as four times the
last-level cache holds so that they stream from memory (0.7 s on a 2-core
AMD EPYC), and keeps the answer in ``$XDG_CACHE_HOME/omni/cpu_kernels.json``,
keyed by the processor, torch's version and the thread count, so later
starts read it (stages that start together may each measure once; the file
keeps the last answer, written whole).

``OMNI_CPU_KERNELS``: ``measure`` (the default) as above; ``default`` takes
the shipped routes without measuring (the test suite, for numbers that do
not depend on the machine); ``remeasure`` measures again and rewrites the
entry. Only speed depends on the answer; the products' values differ by
float rounding at most (another summation order).
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F

from .cpu_blocked_weight import PADDED_ROWS, block_weight, blocked_product, blocking_available
from .cpu_cache import last_level_cache_bytes

MODE_VAR = "OMNI_CPU_KERNELS"
MODES = ("measure", "default", "remeasure")
#: Rows timed for each choice: a lone request, small batches, a decode batch's widths.
FLOAT32_ROWS = (1, 2, 3, 4, 8, 16)
BF16_ROWS = (2, 4, 8, 16, 32, 64)
SHAPE = (3072, 1024)  # a gate/up projection of a 0.6B talker: 12.6 MB of float32


@dataclass(frozen=True)
class KernelChoice:
    """The routes :mod:`.cpu_linear` takes; the defaults are the shipped (Intel) ones."""

    mkl_max_rows: int = 3  # float32: MKL up to this many rows, oneDNN beyond (0: oneDNN always)
    bf16_mv_one_row: bool = True  # bfloat16: a lone row through torch.mv, else F.linear
    bf16_transposed_max_rows: int = 64  # bfloat16: mm(weight, x.T) up to this many rows
    # bfloat16: weights reordered once to oneDNN's blocked layout, every product through it
    bf16_blocked: bool = False
    # bfloat16 blocked: a product of fewer rows padded to this many (0: never)
    bf16_blocked_min_rows: int = 0
    source: str = "default"  # default, measured, or the cache file it came from


Timer = Callable[[Callable[[], object]], float]
#: The fields a cache entry holds: every route (not where the answer came from).
CACHED_FIELDS = {f.name for f in fields(KernelChoice)} - {"source"}


def best_time(call: Callable[[], object], repeats: int = 3, calls: int = 1) -> float:
    """The fastest of ``repeats`` timings of ``calls`` calls (seconds per call), after one
    untimed call: the least disturbed by the rest of the machine."""
    call()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - started) / calls)
    return best


#: How much faster a route must time to displace the shipped one: closer calls keep what
#: :class:`KernelChoice` ships. On a shared machine two runs of the same measuring, minutes
#: apart, flipped MKL against oneDNN at one float32 row and blocked bf16 against dense,
#: where the two were within a few percent of each other.
MARGIN = 0.05


def beats(candidate: float, other: float, shipped: bool) -> bool:
    """Whether the route timed ``candidate`` seconds is taken over the one timed ``other``:
    the faster, unless they are within :data:`MARGIN` of each other, where ``shipped``
    (whether the shipped routes take the candidate) decides."""
    if abs(candidate - other) <= MARGIN * max(candidate, other):
        return shipped
    return candidate < other


def leading_wins(rows: tuple[int, ...], faster: Callable[[int], bool]) -> int:
    """The most rows up to which ``faster(rows)`` held from the first count on (0: not even
    the first): a route is taken for a prefix of row counts, never with holes."""
    won = 0
    for count in rows:
        if not faster(count):
            break
        won = count
    return won


#: The most one timed pass reads. A virtual machine's sysfs may report its host's whole
#: L3: a 2-vCPU Xeon guest says 260 MiB, yet its reads slow to memory speed past 64 MB;
#: four times that report made the first start's measuring take 18.6 s instead of ~9.
#: 512 MB still exceeds the largest L3 a core shares today (320 MB).
MAX_PASS_BYTES = 512 << 20


def layer_count(cache_bytes: int | None, layer_bytes: int) -> int:
    """How many distinct layers one timed pass reads: four times the last-level cache (at
    least 64 MB, at most :data:`MAX_PASS_BYTES`), so that every pass streams its weights
    from memory as a decode step does, rather than finding them in the cache (one 12.6 MB
    layer fits a 32 MB L3)."""
    target = min(max(4 * (cache_bytes or 0), 64 << 20), MAX_PASS_BYTES)
    return max(1, -(-target // layer_bytes))


@torch.inference_mode()
def measure(timer: Timer = best_time, onednn: bool = True) -> KernelChoice:
    """Time each route against ``F.linear`` on :data:`SHAPE` layers in this process."""
    generator = torch.Generator().manual_seed(0)
    count = layer_count(last_level_cache_bytes(), SHAPE[0] * SHAPE[1] * 4)
    # a constant fill: the kernels' speed does not depend on the values, and drawing
    # hundreds of MB of random numbers would cost more than the timing
    weights = [torch.full(SHAPE, SHAPE[1] ** -0.5) for _ in range(count)]

    def over(
        layers: list[torch.Tensor], product: Callable[[torch.Tensor], object]
    ) -> Callable[[], object]:
        return lambda: [product(w) for w in layers]

    shipped = KernelChoice()
    mkl_max_rows = FLOAT32_ROWS[-1]
    if onednn:
        pointwise = torch.ops.mkldnn._linear_pointwise

        def mkl_faster(rows: int) -> bool:
            x = torch.randn(rows, SHAPE[1], generator=generator)
            mkl = timer(over(weights, lambda w: F.linear(x, w)))
            dnn = timer(over(weights, lambda w: pointwise(x, w, None, "none", [], "")))
            return beats(mkl, dnn, rows <= shipped.mkl_max_rows)

        mkl_max_rows = leading_wins(FLOAT32_ROWS, mkl_faster)
    weights.clear()  # the float32 layers are done with: free them before the bf16 timings
    # as many bf16 layers as float32 ones would be half the bytes, partly in the cache:
    # at twice the last-level cache the blocked kernel read 19 GB/s, at six times 14.6
    count = layer_count(last_level_cache_bytes(), SHAPE[0] * SHAPE[1] * 2)
    halves = [torch.full(SHAPE, SHAPE[1] ** -0.5, dtype=torch.bfloat16) for _ in range(count)]
    row = torch.randn(SHAPE[1], generator=generator).to(torch.bfloat16)
    mv = timer(over(halves, lambda w: torch.mv(w, row)))
    linear = timer(over(halves, lambda w: F.linear(row[None], w)))
    mv_faster = beats(mv, linear, shipped.bf16_mv_one_row)

    def transposed_faster(rows: int) -> bool:
        x = torch.randn(rows, SHAPE[1], generator=generator).to(torch.bfloat16)
        transposed = timer(over(halves, lambda w: torch.mm(w, x.t()).t().contiguous()))
        linear = timer(over(halves, lambda w: F.linear(x, w)))
        return beats(transposed, linear, rows <= shipped.bf16_transposed_max_rows)

    transposed_max_rows = leading_wins(BF16_ROWS, transposed_faster)
    blocked, min_rows = False, 0
    if onednn and blocking_available():
        layers = [block_weight(w) for w in halves]
        blocked = blocked_faster(
            layers, halves, mv_faster, transposed_max_rows, timer, over, generator
        )
        del layers
        halves.clear()  # free before the padding's layers are built
        if blocked and padding_pays(timer, generator):
            min_rows = PADDED_ROWS
    return KernelChoice(
        mkl_max_rows, mv_faster, transposed_max_rows, blocked, min_rows, source="measured"
    )


def blocked_faster(
    blocked: list[torch.Tensor],
    halves: list[torch.Tensor],
    mv_faster: bool,
    transposed_max_rows: int,
    timer: Timer,
    over: Callable[..., Callable[[], object]],
    generator: torch.Generator,
) -> bool:
    """Whether bf16 weights in oneDNN's blocked layout beat the routes chosen for dense ones
    at one row and at eight (a lone request's step, a batch's): they must win both.

    Measured on a 2-core AMD EPYC (Zen 4): 26.5 against 14.0 GB/s at one row,
    24.4 against 12.5 at eight, 32.0 against 34.1 ms at 2048 rows; the Intel
    machine the shipped routes come from read them no faster.
    """

    def wins(rows: int) -> bool:
        x = torch.randn(rows, SHAPE[1], generator=generator).to(torch.bfloat16)
        # the route a dense layer takes at this row count (cpu_linear.row_linear)
        if rows == 1 and mv_faster:
            dense = over(halves, lambda w: torch.mv(w, x[0]))
        elif 1 < rows <= transposed_max_rows:
            dense = over(halves, lambda w: torch.mm(w, x.t()).t().contiguous())
        else:
            dense = over(halves, lambda w: F.linear(x, w))
        candidate = timer(over(blocked, lambda w: blocked_product(x, w)))
        return beats(candidate, timer(dense), KernelChoice().bf16_blocked)

    return wins(1) and wins(8)


def decoder_layer_shapes(hidden: int, intermediate: int) -> list[tuple[int, int]]:
    """The products of one Qwen3-style decoder layer at a 0.6B talker's proportions (q/k/v
    as one product of 2 + 1 + 1 heads' widths, o, gate, up, down), ``[out, in]`` each."""
    return [
        (4 * hidden, hidden),
        (hidden, 2 * hidden),
        (intermediate, hidden),
        (intermediate, hidden),
        (hidden, intermediate),
    ]


def padding_pays(timer: Timer, generator: torch.Generator) -> bool:
    """Whether blocked products of one and of two rows, together, run faster padded
    to :data:`~.cpu_blocked_weight.PADDED_ROWS` rows, through decoder layers'
    worth of products (:func:`decoder_layer_shapes` at :data:`SHAPE`'s widths),
    four times the last-level cache of them.

    Why whole layers: the gain depends on the shape (more with a wider input),
    so one shape alone can tie where a model gains. Why one and two rows
    together: at one row the gain is within this kind of machine's noise
    (measured on a 2-core AMD EPYC, Zen 4, eight passes over 5 layers: 0.96
    to 1.05 of the unpadded time; over 8 layers 0.92-0.93), at two it is
    clear (0.82-0.90), and a Qwen3-TTS 0.6B frame at one request took
    293-305 ms padded against 319-330 unpadded, alternated.
    """
    shapes = decoder_layer_shapes(SHAPE[1], SHAPE[0])
    layer_bytes = 2 * sum(rows * cols for rows, cols in shapes)
    count = layer_count(last_level_cache_bytes(), layer_bytes)
    scale = SHAPE[1] ** -0.5
    products = [
        block_weight(torch.full(shape, scale, dtype=torch.bfloat16))
        for _ in range(count)
        for shape in shapes
    ]

    def added(rows: int) -> float:
        """Seconds padding adds to a pass at ``rows`` rows (negative: what it saves)."""
        inputs = {
            cols: torch.randn(rows, cols, generator=generator).to(torch.bfloat16)
            for _, cols in shapes
        }

        def through(min_rows: int) -> Callable[[], object]:
            return lambda: [
                blocked_product(inputs[shape[1]], weight, None, min_rows)
                for shape, weight in zip(shapes * count, products, strict=True)
            ]

        return timer(through(PADDED_ROWS)) - timer(through(0))

    return added(1) + added(2) < 0


def cache_path() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "omni" / "cpu_kernels.json"


def machine_key() -> str:
    """What the answer depends on: the processor, torch's build and its thread count."""
    return f"{processor_name()} | torch {torch.__version__} | {torch.get_num_threads()} threads"


def processor_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def read_cached(path: Path, key: str) -> KernelChoice | None:
    try:
        entry = json.loads(path.read_text()).get(key)
        if entry is None or set(entry) != CACHED_FIELDS:
            return None  # absent, or written before a route was added: measure it
        return KernelChoice(**{**entry, "source": str(path)})
    except (OSError, ValueError, TypeError, AttributeError):
        return None  # unreadable or from another version: measure again


def write_cached(path: Path, key: str, choice: KernelChoice) -> None:
    """Add ``choice`` under ``key``, atomically (a reader never sees half a file); a cache
    that cannot be written only costs the next start its half second."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            entries = json.loads(path.read_text())
            if not isinstance(entries, dict):
                entries = {}
        except (OSError, ValueError):
            entries = {}
        entries[key] = {k: v for k, v in asdict(choice).items() if k != "source"}
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entries, indent=1))
        tmp.replace(path)
    except OSError:
        pass


def mode() -> str:
    value = os.environ.get(MODE_VAR, "measure").strip().lower() or "measure"
    if value not in MODES:
        raise ValueError(f"{MODE_VAR}={value!r}: use one of {', '.join(MODES)}")
    return value


_chosen: KernelChoice | None = None


def kernel_choice(onednn: bool = True) -> KernelChoice:
    """This process's routes: the shipped ones, the cached ones, or measured now."""
    global _chosen
    if _chosen is None:
        how = mode()
        if how == "default":
            _chosen = KernelChoice()
        else:
            path, key = cache_path(), machine_key()
            cached = read_cached(path, key) if how == "measure" else None
            if cached is None:
                cached = measure(onednn=onednn)
                write_cached(path, key, cached)
            _chosen = cached
    return _chosen
