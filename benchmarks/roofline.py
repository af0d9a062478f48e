"""A decode step's bytes against the machine's memory-bandwidth limit (shared by benchmarks).

Why: decoding at small batch sizes multiplies a few rows by every weight it
touches, so a step cannot be faster than the bytes it reads over the rate
at which memory delivers them. Benchmarks print both, and the percentage of
that limit a measured step reaches, so that a figure says how far a step is
from what the hardware allows, not only how it compares with a peer.

* :func:`read_bandwidth`: the limit, measured on the process's compute
  thread (``omni_core.engine.compute``), where the steps run, with its torch
  threads (the caller's until a script dedicates it): the faster of a plain
  ``sum`` and a float32 matrix-vector product over a buffer far larger than
  the caches (best of ten passes; scripts measure at the start and at the
  end of a run and keep the higher, :func:`best`);
* :class:`StepReads`: the bytes of weights one step actually reads, counted
  op by op (a torch dispatch mode, entered in the thread that runs the step):
  every operand that is one of the given modules' parameters, buffers or
  tensor attributes (oneDNN-packed weights, int8 weights and scales) counts
  with the bytes of the view the op reads, every time an op reads it (a
  weight used again in the same step, such as Qwen3-TTS's code predictor run
  15 times per frame, is read from memory again: it does not fit in the
  caches); a gather
  (``embedding``, ``index_select``, indexing) counts the rows it returns, not
  the table. So a mixture of experts counts the experts it ran, an output
  head scored on two rows counts two rows, and the dtype is whatever the
  weights are stored in;
  ``StepReads(..., record=True)`` also keeps each op that read a weight, with
  a copy of its other inputs, and :func:`kernel_seconds` runs those ops
  again back to back: the step's weight-reading kernels alone, without the
  rest of the step (norms, attention, sampling, the framework's Python), so
  a step's distance from the limit splits into what its kernels read below
  the limit and what the step adds around them (:func:`kernels_line`);
* :class:`DecodeWatch`: a step model's ``decode`` calls timed, one counted;
* :func:`kv_bytes`: the KV cache a step reads, from the model's shapes;
* :func:`limit_line`: the printed line; :func:`kernels_line`: the kernels' share.

Not a module of its own benchmark (no ``bench_`` prefix: the smoke tests'
glob skips it); the scripts import it from their own directory.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from omni_core.engine.compute import call_on_compute_thread, compute_thread
from omni_core.engine.huge_pages import granted_bytes

# Ops that read only the rows they return from their first (table) operand.
GATHERS = frozenset(
    {
        "aten::embedding",
        "aten::index_select",
        "aten::index",
        "aten::gather",
        "aten::take",
        "aten::embedding_bag",
        "aten::_embedding_bag",
    }
)


# The grouped product of stacked experts (``F.grouped_mm``; the thinker's float32 mixture).
GROUPED_PRODUCT = "aten::_grouped_mm"


@dataclass(frozen=True)
class Bandwidth:
    """The measured limit: GB/s (1e9 bytes), with how and with how many threads."""

    gb_s: float
    how: str
    threads: int
    #: the lowest of the measurements :func:`best` chose this one over (None: only one)
    lowest_gb_s: float | None = None
    #: the pages the read buffer got: "2 MB pages", "4 KB pages" (None: no /proc to say).
    #: Huge pages read faster (a 512 MB sum on a 2-core AMD EPYC VM: 19 -> 35 GB/s), and
    #: omni's CPU stage processes ask for them (omni_core.engine.huge_pages)
    pages: str | None = None
    #: every pass's rate of the chosen read, in all measurements :func:`best` merged
    passes: tuple[float, ...] = ()

    @property
    def sustained_gb_s(self) -> float | None:
        """The median pass: what memory gives most of the time (None: one pass or none).

        Why beside the best pass: on a shared cloud machine a pass now and then
        reads far faster than the rest, a burst a decode run lasting seconds
        never sees (2-core AMD EPYC VM, 512 MB ``sum``, 2 threads, forty passes
        over a minute: 50-54 GB/s but for three at 72-77), so the best pass alone
        makes every step look slower against it than it is. A step's share of
        both is printed; neither is hidden.
        """
        return statistics.median(self.passes) if len(self.passes) > 1 else None


def read_bandwidth(megabytes: int = 512, passes: int = 10) -> Bandwidth:
    """How fast this process streams ``megabytes`` of float32 from memory, in GB/s.

    The faster of two reads of the same buffer (a ``sum``, and a matrix-vector
    product as a decode step's linear layers do), each the best of ``passes``
    after a warm-up pass, with the torch threads the caller set. The buffer
    must be far larger than the last-level cache for the figure to be the
    memory's (512 MB is; ``--smoke`` runs pass a few MB and get the cache's).
    Measured on the compute thread, as the steps it is compared with run.
    """
    return compute_thread().submit(_read_bandwidth, megabytes, passes).result()


def _read_bandwidth(megabytes: int, passes: int) -> Bandwidth:
    columns = 4096
    rows = max(1, megabytes * (1 << 20) // (4 * columns))
    before = granted_bytes()
    big = torch.ones(rows, columns)
    after = granted_bytes()
    pages = None
    if before is not None and after is not None:
        pages = "2 MB pages" if after - before >= big.nbytes // 2 else "4 KB pages"
    x = torch.ones(1, columns)
    size = big.numel() * big.element_size()

    def rates_of(run: Any) -> tuple[float, ...]:
        run()
        rates = []
        for _ in range(passes):
            started = time.perf_counter()
            run()
            rates.append(size / (time.perf_counter() - started) / 1e9)
        return tuple(rates)

    with torch.inference_mode():
        rates = {
            "sum": rates_of(big.sum),
            "float32 matrix-vector": rates_of(lambda: F.linear(x, big)),
        }
    how = max(rates, key=lambda k: max(rates[k]))
    return Bandwidth(max(rates[how]), how, torch.get_num_threads(), pages=pages, passes=rates[how])


def best(*measured: Bandwidth) -> Bandwidth:
    """The highest of several measurements (taken at the start and the end of a run, say).

    On a shared machine a measurement can only come out too low (another
    process took the memory or the cores for a while), never too high. The
    lowest is kept beside it (``lowest_gb_s``) for :func:`limit_line` to show
    how far apart they were: on a 2-core cloud machine the same measurement
    read from 25 to 55 GB/s within an hour, and the percentage with it.
    """
    top = max(measured, key=lambda b: b.gb_s)
    lowest = min(b.gb_s if b.lowest_gb_s is None else b.lowest_gb_s for b in measured)
    passes = tuple(rate for b in measured for rate in b.passes)
    if lowest >= top.gb_s and passes == top.passes:
        return top
    return replace(top, lowest_gb_s=lowest if lowest < top.gb_s else None, passes=passes)


def _weight_tensors(modules: Iterable[nn.Module]) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    pending = [m for root in modules for m in root.modules()]
    seen: set[int] = set()
    while pending:
        module = pending.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        found.extend(module.parameters(recurse=False))
        found.extend(module.buffers(recurse=False))
        for value in vars(module).values():
            # tensors held as plain attributes, such as a oneDNN-packed weight, and
            # modules held so (a blocked q/k/v group's product, outside the module tree)
            if isinstance(value, torch.Tensor):
                found.append(value)
            elif isinstance(value, nn.Module):
                pending.append(value)
    return found


def _storage_key(tensor: torch.Tensor) -> int | None:
    if tensor.is_mkldnn or tensor.device.type == "meta":
        return None
    return tensor.untyped_storage().data_ptr()


#: The op that reads a float16 row copy (omni_core.engine.cpu_row_copy): counted by its shapes.
ROW_COPY_PRODUCT = "quantized::linear_dynamic_fp16"


@dataclass(frozen=True)
class RecordedOp:
    """One op of a step that read a weight: the weights by reference, its other inputs copied
    as they were when it ran (a later in-place op cannot change what a replay computes)."""

    func: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def run(self) -> Any:
        return self.func(*self.args, **self.kwargs)


class StepReads(TorchDispatchMode):
    """Counts the bytes of the given modules' weights that the ops run inside it read.

    Use: ``reads = StepReads(model)``, then ``with reads: step()`` in the
    thread that runs the step (dispatch modes are per thread); ``reads.bytes``
    holds the total of the latest ``with`` block. Every read counts, a weight
    read twice in a step twice. It slows the ops inside it a little
    (each one passes through Python), so count a step outside the timed ones
    where one can. ``record=True``: ``reads.ops`` keeps every op that read a
    weight (:class:`RecordedOp`), for :func:`kernel_seconds`; they hold the
    weights, so drop them before the model is meant to go.
    """

    def __init__(self, *modules: nn.Module, record: bool = False):
        super().__init__()
        tensors = _weight_tensors(modules)
        self._storages = {k for t in tensors if (k := _storage_key(t)) is not None}
        self._packed = {id(t) for t in tensors if t.is_mkldnn}
        self.bytes = 0
        self.record = record
        self.ops: list[RecordedOp] = []

    def __enter__(self) -> StepReads:
        self.bytes = 0
        self.ops = []
        super().__enter__()
        return self

    def _snapshot(self, func: Any, args: Any, kwargs: dict[str, Any]) -> RecordedOp:
        def keep(value: Any) -> Any:
            if not isinstance(value, torch.Tensor) or value.is_mkldnn or self._is_weight(value):
                return value
            return value.detach().clone()

        kept_args, kept_kwargs = tree_map(keep, (tuple(args), dict(kwargs)))
        return RecordedOp(func, kept_args, kept_kwargs)

    def _is_weight(self, tensor: torch.Tensor) -> bool:
        if tensor.is_mkldnn:
            return id(tensor) in self._packed
        return _storage_key(tensor) in self._storages

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = func._schema.name
        operands = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if (
            self.record
            and not getattr(func, "is_view", False)
            and (name == ROW_COPY_PRODUCT or any(self._is_weight(t) for t in operands))
        ):
            self.ops.append(self._snapshot(func, args, kwargs))  # before it runs: in-place ops
        out = func(*args, **kwargs)
        if getattr(func, "is_view", False):
            return out  # a view reads nothing; the op that uses it does
        if name in GATHERS and operands:
            table = operands[0]
            if self._is_weight(table):
                rows = sum(o.numel() for o in tree_leaves(out) if isinstance(o, torch.Tensor))
                self.bytes += min(rows, table.numel()) * table.element_size()
            operands = operands[1:]
        if name == GROUPED_PRODUCT and len(operands) >= 3 and self._is_weight(operands[1]):
            # a stack of experts' weights, [experts, in, out]: only the groups given rows
            # are read (the CPU's grouped product runs one product per non-empty group)
            weight, ends = operands[1], operands[2].tolist()
            given = sum(1 for end, start in zip(ends, [0, *ends[:-1]], strict=True) if end > start)
            self.bytes += given * weight[0].numel() * weight.element_size()
            operands = [operands[0], *operands[3:]]
        for tensor in operands:
            if self._is_weight(tensor):
                self.bytes += tensor.numel() * tensor.element_size()
        if name == ROW_COPY_PRODUCT and operands:
            # a float16 row copy (factory.fp16_row_weights): fbgemm's packed object, not a
            # tensor, and another Python wrapper at every call; [out, in] at two bytes each
            self.bytes += operands[0].shape[-1] * out.shape[-1] * 2
        return out


def kernel_seconds(ops: list[RecordedOp], passes: int = 5) -> float:
    """The median time of ``ops`` run back to back, after one untimed pass.

    Each op is called from Python, one after another, on the inputs it had
    in the step: the weight-reading kernels of a step without anything
    around them. The Python call adds a few microseconds an op, so this
    overstates the kernels' own time a little, never understates it. On the
    compute thread, with its torch threads, as the steps ran.
    """
    if not ops:
        return 0.0
    return call_on_compute_thread(_kernel_seconds, ops, passes)


def _kernel_seconds(ops: list[RecordedOp], passes: int) -> float:
    with torch.inference_mode():
        for op in ops:
            op.run()
        times = []
        for _ in range(passes):
            begin = time.perf_counter()
            for op in ops:
                op.run()
            times.append(time.perf_counter() - begin)
    return statistics.median(times)


def kernels_line(
    ops: int, weight_bytes: float, kernels_s: float, step_s: float, limit: Bandwidth
) -> str:
    """Where a step's time goes beside the limit: its weight-reading kernels, and the rest."""
    floor_s = weight_bytes / (limit.gb_s * 1e9)
    return (
        f"its {ops} weight-reading ops alone, run again back to back: {kernels_s * 1e3:.1f} ms "
        f"({weight_bytes / kernels_s / 1e9:.1f} GB/s of weights, {100 * floor_s / kernels_s:.0f}% "
        f"of the limit); the rest of the step (norms, attention, sampling, the framework "
        f"around them): {(step_s - kernels_s) * 1e3:.1f} ms"
    )


class DecodeWatch:
    """Times a step model's ``decode`` calls and counts the weight bytes of one of them.

    Wraps ``model.decode`` with an instance attribute (the engine looks the
    method up at every step) until :meth:`close`. Call ``count_at`` (0-based)
    runs under :class:`StepReads` over ``modules`` and is left out of
    ``seconds`` (counting slows it); every other call's wall time goes to
    ``seconds`` and the first sequence's cached positions to ``positions``.
    ``count_at=None`` counts nothing: a timed run whose bytes were counted in
    another, untimed one, so that the slow counted call is not in its wall time.
    ``record=True``: the counted call's weight-reading ops are kept in ``ops``
    (:class:`StepReads`), for :func:`kernel_seconds`.
    """

    def __init__(
        self, model: Any, *modules: nn.Module, count_at: int | None = 1, record: bool = False
    ):
        self.model = model
        self.seconds: list[float] = []
        self.positions: list[float] = []
        self.bytes, self.calls = 0, 0
        self.ops: list[RecordedOp] = []
        method = model.decode

        def decode(sequences: Any, cache: Any) -> Any:
            index, self.calls = self.calls, self.calls + 1
            if index == count_at:
                with StepReads(*modules, record=record) as reads:
                    out = method(sequences, cache)
                self.bytes, self.ops = reads.bytes, reads.ops
                return out
            begin = time.perf_counter()
            out = method(sequences, cache)
            self.seconds.append(time.perf_counter() - begin)
            self.positions.append(float(getattr(sequences[0], "cached", 0)))
            return out

        model.decode = decode

    def close(self) -> None:
        self.model.__dict__.pop("decode", None)

    def mean_s(self) -> float:
        return sum(self.seconds) / max(len(self.seconds), 1)

    def mean_positions(self) -> float:
        return sum(self.positions) / max(len(self.positions), 1)


def kv_bytes(
    layers: int, kv_heads: int, head_dim: int, positions: float, dtype: torch.dtype
) -> float:
    """Bytes of keys and values one sequence's step reads at ``positions`` cached positions."""
    element = torch.empty((), dtype=dtype).element_size()
    return 2.0 * layers * kv_heads * head_dim * positions * element


def limit_line(label: str, weight_bytes: float, kv: float, step_s: float, limit: Bandwidth) -> str:
    """``label: reads X GB (weights) + Y MB (KV) per step; limit Z GB/s -> T ms; step S ms: P%``."""
    total = weight_bytes + kv
    floor_s = total / (limit.gb_s * 1e9)
    line = (
        f"{label}: reads {weight_bytes / 1e9:.3f} GB of weights + {kv / 1e6:.2f} MB of KV per "
        f"step; at the limit ({limit.gb_s:.1f} GB/s, {limit.how}, {limit.threads} thread(s)"
        f"{', ' + limit.pages if limit.pages else ''}) "
        f"{floor_s * 1e3:.1f} ms; measured step {step_s * 1e3:.1f} ms: "
        f"{100 * floor_s / step_s:.0f}% of the memory-bandwidth limit"
    )
    if limit.lowest_gb_s is not None:
        lowest_floor_s = total / (limit.lowest_gb_s * 1e9)
        line += (
            f" ({100 * lowest_floor_s / step_s:.0f}% against the run's lowest measurement, "
            f"{limit.lowest_gb_s:.1f} GB/s)"
        )
    if limit.sustained_gb_s is not None:
        sustained_floor_s = total / (limit.sustained_gb_s * 1e9)
        line += (
            f"; {100 * sustained_floor_s / step_s:.0f}% of the sustained rate "
            f"(the median of {len(limit.passes)} passes, {limit.sustained_gb_s:.1f} GB/s)"
        )
    return line
