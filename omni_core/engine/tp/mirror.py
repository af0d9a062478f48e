"""Rank 0 mirrors each forward pass to the other ranks; they run it on their shards.

The leader (rank 0) runs the stage as usual: the engine's scheduler, the
cache slots, the embeddings, sampling. Just before each forward pass of the
sharded network it calls :meth:`Mirror.step` with the pass's inputs
(embeddings, positions, mask, the slots and positions of the cache), then
runs the pass itself; every other rank, in :class:`FollowerStage`, receives
the same inputs and runs the same pass on its own shard and its own cache.
The all-reduces inside the pass keep them in lockstep, and since every rank
ends a pass holding the same hidden states, only rank 0 needs the heads.

The followers' cache has the leader's slots and slot length (sent once,
``SETUP``) and holds their share of the KV heads; the leader allocates and
frees slots, followers only write where they are told.
"""

from __future__ import annotations

import contextlib
import sys
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import anyio
import torch

from ..compute import ComputeThread
from ..interface import CacheLayout
from ..kv_cache import SlotKVCache
from .channel import StepChannel
from .group import TPGroup, TPGroupBroken

STEP, SETUP, STOP = 1, 2, 3


class Mirror:
    """The leader's side: tell the followers what the next pass is given."""

    def __init__(self, group: TPGroup):
        if not group.leader:
            raise ValueError(f"rank {group.rank} is not the leader of {group.name!r}")
        self.group = group
        self.channel = StepChannel(group)
        self.closed = False

    def setup(self, num_slots: int, slot_len: int) -> None:
        """The cache every rank allocates (the engine's plan), sent once after loading."""
        self.channel.send(SETUP, [int(num_slots), int(slot_len)])

    def step(self, value: Any) -> None:
        """Before a forward pass: its inputs, which every follower passes to its forward."""
        self.channel.send(STEP, value)

    def close(self) -> None:
        """After the engine stopped: the followers leave their loop (a dead one is skipped)."""
        if self.closed:
            return
        self.closed = True
        self.group.close()
        with contextlib.suppress(TPGroupBroken):
            self.channel.send(STOP, None)


Forward = Callable[[SlotKVCache, Any], Any]


class FollowerStage:
    """Ranks 1..N-1 as a stage: no requests, only the leader's passes, on a thread of their own.

    ``forward(cache, value)`` runs one pass of this rank's shard with the
    value the leader sent to :meth:`Mirror.step`.
    """

    def __init__(self, group: TPGroup, layout: CacheLayout, forward: Forward, *, stage: str):
        if group.leader:
            raise ValueError(f"rank 0 of {group.name!r} leads; it runs the stage itself")
        self.group, self.layout, self.forward, self.stage = group, layout, forward, stage
        self.channel = StepChannel(group)
        self.cache: SlotKVCache | None = None
        self.steps = 0
        self._serving: Future[None] | None = None

    async def start(self) -> None:
        await anyio.to_thread.run_sync(self._setup)
        # The passes hold their thread for good, so it is a compute thread of its
        # own, not the process's (whose jobs must end: the runtime's dedicate()
        # waits on it once the stages are built). It takes the planned thread
        # count the loop thread has now, and is the process's only busy team.
        self._serving = ComputeThread().submit(self._serve)

    def join(self) -> None:
        """Block until this rank leaves its loop (the leader stopped, or the group broke)."""
        if self._serving is not None:
            self._serving.result()

    def _setup(self) -> None:
        op, value = self.channel.recv()
        if op != SETUP:
            raise RuntimeError(f"rank {self.group.rank} expected the cache setup, got op {op}")
        num_slots, slot_len = value
        self.cache = SlotKVCache(self.layout, num_slots, slot_len)

    def _serve(self) -> None:
        assert self.cache is not None
        while True:
            try:
                op, value = self.channel.recv()
            except TPGroupBroken:
                return  # the group is over; the supervisor restarts it
            if op == STOP:
                return
            if op != STEP:
                print(f"rank {self.group.rank}: unknown op {op} ignored", file=sys.stderr)
                continue
            try:
                with torch.inference_mode():
                    self.forward(self.cache, value)
                self.steps += 1
            except TPGroupBroken:
                return
            except Exception:
                # The leader ran the same pass on the same inputs and most likely failed
                # the same way (that request fails there); stay in step for the next one.
                print(
                    f"rank {self.group.rank} of {self.group.name!r}: a forward pass failed:\n"
                    + traceback.format_exc(),
                    file=sys.stderr,
                    flush=True,
                )

    async def run(self, request: Any) -> Any:
        raise RuntimeError(
            f"stage {self.stage!r}: rank {self.group.rank} of a tensor-parallel group takes no "
            "requests; rank 0 does"
        )

    async def aclose(self) -> None:
        self.group.close()
