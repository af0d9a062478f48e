"""The streaming vocoder's codec calls timed, for a frame's split between engine and codec.

Why: a speech benchmark's wall time per frame at concurrency 1 is the
engine's decode call plus the codec's share plus what lies between them.
The engines' calls are timed by ``roofline.DecodeWatch``; this times the
other side. It wraps the stage's ``DecodeBatcher.decode_batch``, the call
that runs on the compute thread and ends with the batch's audio copied to
the host, so on a GPU its wall time holds its kernels (the engine and the
codec take turns on one compute thread, so none of the engine's are inside).
That is the figure a GPU lease needs to say whether the codec is worth
capturing as CUDA graphs, as both peers do.
"""

from __future__ import annotations

import time
from typing import Any


class CodecWatch:
    """Times ``vocoder.batcher``'s decode calls until :meth:`close`.

    ``frames``: codec frames decoded (rows x frames of each call, left
    context included where the vocoder re-decodes it); ``seconds``: their wall
    time; ``calls``: how many calls.
    """

    def __init__(self, vocoder: Any):
        self.batcher = vocoder.batcher
        self.method = self.batcher.decode_batch
        self.seconds, self.frames, self.calls = 0.0, 0, 0

        def timed(codes: Any, payloads: list[Any]) -> Any:
            begin = time.perf_counter()
            out = self.method(codes, payloads)
            self.seconds += time.perf_counter() - begin
            self.frames += int(codes.shape[0]) * int(codes.shape[-1])
            self.calls += 1
            return out

        self.batcher.decode_batch = timed

    def close(self) -> None:
        self.batcher.decode_batch = self.method

    def per_frame_s(self) -> float:
        """Mean codec seconds per decoded frame (0 before any call)."""
        return self.seconds / self.frames if self.frames else 0.0
