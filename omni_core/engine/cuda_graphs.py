"""One batch bucket's decode step captured as a CUDA graph, and replayed.

On a GPU a one-token decode step is a few hundred small kernels; launching
them from Python costs more than running them. Capturing the step once per
batch bucket and replaying it launches them all at once. A captured graph
reads and writes fixed addresses, so the step's inputs are copied into
buffers owned here before each replay, and its output is a buffer the next
replay overwrites (the caller takes what it needs before stepping again).
The KV cache the step writes is the engine's own, fixed for its lifetime.

Everything the step does must stay on the GPU (no ``.item()``, no host
tensors): a step that syncs cannot be captured, and the capture's error is
raised to the caller, who runs that model eagerly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

#: Eager runs on a side stream before capturing: the first runs allocate
#: workspaces (cuBLAS, inductor's buffers) that must not be allocated inside the capture.
WARMUP_RUNS = 2


class CapturedStep:
    """``fn(*inputs)`` captured once for inputs shaped like ``example``; call to replay it."""

    def __init__(
        self,
        fn: Callable[..., Any],
        example: Sequence[torch.Tensor],
        *,
        pool: Any = None,
    ):
        if not all(t.is_cuda for t in example):
            raise ValueError("a CUDA graph captures CUDA tensors only")
        self.inputs = [t.clone() for t in example]
        device = self.inputs[0].device
        # The calling thread's current device is cuda:0 unless set (the compute thread
        # never sets it), and torch.cuda.graph captures on a stream of the current
        # device: a model on cuda:1 would launch on its own device's stream, outside
        # the capture, and every replay would return the capture's stale output.
        with torch.cuda.device(device):
            side = torch.cuda.Stream(device=device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for _ in range(WARMUP_RUNS):
                    fn(*self.inputs)
            torch.cuda.current_stream(device).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, pool=pool, stream=torch.cuda.Stream(device)):
                self.output = fn(*self.inputs)
        self.device = device

    def replay(self) -> Any:
        """Replay on what :attr:`inputs` hold now (the caller filled them in place); the output."""
        with torch.cuda.device(self.device):
            self.graph.replay()
        return self.output

    def __call__(self, *inputs: torch.Tensor) -> Any:
        """Copy ``inputs`` (the captured shapes) into the graph's buffers and replay it."""
        # Inference mode: buffers made under it (the engine's warm-up) refuse an in-place
        # copy outside it, and a caller may step under no_grad only (model.generate).
        with torch.cuda.device(self.device), torch.inference_mode():
            for buffer, value in zip(self.inputs, inputs, strict=True):
                buffer.copy_(value, non_blocking=True)
            self.graph.replay()
        return self.output


def graph_pool(device: torch.device | str | None = None) -> Any:
    """A memory pool the buckets of one model share (captured largest first, as SGLang does);
    made on ``device`` (the model's), not the calling thread's current device."""
    if device is None:
        return torch.cuda.graph_pool_handle()
    with torch.cuda.device(device):
        return torch.cuda.graph_pool_handle()


class FixedAddressReplay:
    """A CUDA graph's contract without CUDA: ``fn`` recorded on input buffers of its own,
    each :meth:`replay` running it eagerly and writing into the same output tensors.

    Why: code that captures (a stream's chunks, a step) must fill the input buffers
    in place and copy what it keeps out of the outputs before the next replay
    overwrites them. On the CPU, tests run that code with this stand-in, where a
    mistake shows as wrong numbers, as it would on a GPU (``CapturedStep``).
    """

    def __init__(self, fn: Callable[..., Any], example: Sequence[torch.Tensor]):
        self.fn = fn
        self.inputs = [t.clone() for t in example]
        self.output = fn(*self.inputs)

    def replay(self) -> Any:
        """Run ``fn`` on the input buffers; its results land in the first run's outputs."""
        fresh = self.fn(*self.inputs)
        outputs = self.output if isinstance(self.output, tuple | list) else (self.output,)
        fresh = fresh if isinstance(fresh, tuple | list) else (fresh,)
        for buffer, value in zip(outputs, fresh, strict=True):
            buffer.copy_(value)
        return self.output
