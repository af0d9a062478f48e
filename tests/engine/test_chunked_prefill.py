"""Long prompts prefilled in chunks (``engine.chunked_prefill_size``), on the toy decoder.

What must hold: a prompt longer than a step's budget is admitted and
prefilled over several steps, saying what it says prefilled whole; the
running sequences decode between its chunks; one prompt is chunked at a
time and nobody overtakes it; an abort or a failure mid-prompt frees its
slot; a chunked prompt's head is shared like any other; ``-1`` turns
chunking off, and a model that does not offer it keeps the old refusal.
"""

from __future__ import annotations

import math
from typing import Any

import anyio
import pytest

from omni_core.engine.backends import validate_engine_settings
from omni_core.engine.interface import EngineSettings, SamplingParams, SequenceError
from omni_core.engine.torch_engine import TorchEngine
from omni_core.engine.toy_model import TinyDecoder
from omni_core.errors import ConfigError, RequestError

pytestmark = pytest.mark.anyio

LONG = [(11 * i + 5) % 64 for i in range(50)]


class Recording(TinyDecoder):
    """The toy decoder, remembering each prefill's (request, start, end) per step."""

    def __init__(self, **kwargs: Any):
        super().__init__(vocab_size=64, dim=32, num_heads=2, num_layers=2, seed=0, **kwargs)
        self.prefills: list[list[tuple[str, int, int]]] = []
        self.decodes: list[list[str]] = []
        self.fail_at: dict[str, int] = {}  # request id -> the prefill start it fails at

    def prefill(self, sequences, cache):
        self.prefills.append(
            [(s.request_id, s.cached, s.prefill_end or len(s.prompt)) for s in sequences]
        )
        bad = [s.request_id for s in sequences if self.fail_at.get(s.request_id) == s.cached]
        if bad:
            raise SequenceError(bad, "refused on purpose")
        return super().prefill(sequences, cache)

    def decode(self, sequences, cache):
        self.decodes.append([s.request_id for s in sequences])
        return super().decode(sequences, cache)


def settings(**kwargs: Any) -> EngineSettings:
    kwargs.setdefault("max_running_requests", 4)
    kwargs.setdefault("max_total_tokens", 4 * 96)
    return EngineSettings(**kwargs)


def greedy(tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_new_tokens=tokens)


async def collect(engine: TorchEngine, rid: str, prompt: list[int], tokens: int) -> list[int]:
    async with engine.enqueue(rid, prompt, greedy(tokens)) as stream:
        return [token async for token in stream]


async def test_a_long_prompt_is_prefilled_in_chunks_and_says_what_it_says_whole() -> None:
    model = Recording()
    async with TorchEngine(model, settings(max_prefill_tokens=16)) as engine:
        chunked = await collect(engine, "long", LONG, 5)
        assert engine.prompt_positions == {"computed": 50, "cached": 0}
        assert engine.prefill_chunks == 3  # the fourth finishes the prompt
    assert [p[0][1:] for p in model.prefills] == [(0, 16), (16, 32), (32, 48), (48, 50)]
    whole_model = Recording()
    async with TorchEngine(whole_model, settings(max_prefill_tokens=64)) as engine:
        whole = await collect(engine, "long", LONG, 5)
    assert [p[0][1:] for p in whole_model.prefills] == [(0, 50)]
    assert chunked == whole and len(whole) == 5


async def test_chunked_prefill_size_bounds_a_chunk_below_the_step_budget() -> None:
    model = Recording()
    engine = TorchEngine(model, settings(max_prefill_tokens=64, chunked_prefill_size=20))
    async with engine:
        await collect(engine, "long", LONG, 2)
    assert [p[0][1:] for p in model.prefills] == [(0, 20), (20, 40), (40, 50)]


async def test_running_sequences_decode_between_the_chunks() -> None:
    model = Recording()
    async with TorchEngine(model, settings(max_prefill_tokens=10)) as engine:
        short = engine.enqueue("short", [1, 2, 3], greedy(12))
        first = await short.__anext__()  # "short" is running
        got = [first]
        long_tokens = await collect_while(engine, short, got)
    chunk_steps = [i for i, p in enumerate(model.prefills) if p[0][0] == "long"]
    assert [model.prefills[i][0][1:] for i in chunk_steps] == [
        (0, 10),
        (10, 20),
        (20, 30),
        (30, 40),
        (40, 50),
    ]
    # one decode of "short" beside every chunk: it never waited for the whole prompt
    assert sum(1 for d in model.decodes if d == ["short"]) >= len(chunk_steps)
    assert len(got) == 12 and len(long_tokens) == 3


async def collect_while(engine: TorchEngine, short: Any, got: list[int]) -> list[int]:
    async with anyio.create_task_group() as tg:

        async def rest() -> None:
            async for token in short:
                got.append(token)

        tg.start_soon(rest)
        return await collect(engine, "long", LONG, 3)


async def test_one_prompt_is_chunked_at_a_time_and_nobody_overtakes_it() -> None:
    model = Recording()
    other = LONG[::-1]
    async with TorchEngine(model, settings(max_prefill_tokens=20)) as engine:
        out: dict[str, list[int]] = {}

        async def one(rid: str, prompt: list[int]) -> None:
            out[rid] = await collect(engine, rid, prompt, 2)

        async with anyio.create_task_group() as tg:
            for rid, prompt in (("a", LONG), ("b", other), ("c", [4, 5])):
                tg.start_soon(one, rid, prompt)
                await anyio.sleep(0)
    order = [(rid, start, end) for step in model.prefills for rid, start, end in step]
    assert order[:3] == [("a", 0, 20), ("a", 20, 40), ("a", 40, 50)]
    # "b" starts in the step "a" ends in (10 positions were left), "c" waits behind it
    assert model.prefills[2] == [("a", 40, 50), ("b", 0, 10)]
    assert model.prefills[3:6] == [[("b", 10, 30)], [("b", 30, 50)], [("c", 0, 2)]]
    assert all(len(tokens) == 2 for tokens in out.values())


async def test_a_prompt_over_the_budget_is_refused_where_it_cannot_be_chunked() -> None:
    async with TorchEngine(Recording(), settings(max_prefill_tokens=16)) as engine:
        engine.enqueue("long", LONG, greedy(1))  # chunked: accepted
        assert engine.abort("long")
    off = settings(max_prefill_tokens=16, chunked_prefill_size=-1)
    async with TorchEngine(Recording(), off) as engine:
        with pytest.raises(RequestError) as info:
            engine.enqueue("long", LONG, greedy(1))
    assert "engine.max_prefill_tokens is 16 (engine.chunked_prefill_size is -1)" in str(info.value)

    class Whole(Recording):
        chunked_prefill = None  # a model that prefills every prompt in one step

    async with TorchEngine(Whole(), settings(max_prefill_tokens=16)) as engine:
        with pytest.raises(RequestError, match="this model prefills a prompt in one step"):
            engine.enqueue("long", LONG, greedy(1))
    # and a prompt longer than a slot is refused whatever the chunking
    async with TorchEngine(Recording(), settings(max_prefill_tokens=16)) as engine:
        with pytest.raises(RequestError, match="a cache slot holds 96"):
            engine.enqueue("huge", LONG * 2, greedy(1))


async def test_an_abort_mid_prompt_frees_its_slot_for_the_next() -> None:
    model = Recording()
    engine = TorchEngine(
        model, settings(max_running_requests=1, max_total_tokens=96, max_prefill_tokens=10)
    )
    async with engine:
        stream = engine.enqueue("long", LONG, greedy(3))
        while not model.prefills:
            await anyio.sleep(0.001)
        assert engine.abort("long")
        assert [t async for t in stream] == [] and stream.finish_reason == "abort"
        after = await collect(engine, "next", [1, 2, 3], 2)
        assert len(after) == 2 and engine.free_slots == 1
    assert len([p for p in model.prefills if p[0][0] == "long"]) < math.ceil(50 / 10)


async def test_a_failed_chunk_fails_its_request_alone_and_frees_the_slot() -> None:
    model = Recording()
    model.fail_at["long"] = 20
    async with TorchEngine(model, settings(max_prefill_tokens=20)) as engine:
        with pytest.raises(Exception, match="refused on purpose"):
            await collect(engine, "long", LONG, 2)
        assert len(await collect(engine, "ok", LONG[:30], 2)) == 2
        assert engine.free_slots == 4 and engine.num_running == 0


async def test_a_chunked_prompt_is_indexed_chunk_by_chunk_and_shared() -> None:
    model = Recording(share_prefixes=True)
    async with TorchEngine(model, settings(max_prefill_tokens=20)) as engine:
        first = await collect(engine, "first", LONG, 3)
        again = await collect(engine, "again", [*LONG[:40], 9, 9], 3)
        assert engine.prompt_positions["cached"] == 32  # two whole blocks of LONG
    starts = [(rid, start) for step in model.prefills for rid, start, _ in step]
    assert ("again", 32) in starts
    plain = Recording()
    async with TorchEngine(plain, settings(max_prefill_tokens=64)) as engine:
        assert await collect(engine, "first", LONG, 3) == first
        assert await collect(engine, "again", [*LONG[:40], 9, 9], 3) == again


def test_chunked_prefill_size_is_checked_and_follows_max_prefill_tokens() -> None:
    assert EngineSettings(max_prefill_tokens=100).prefill_chunk == 100
    assert EngineSettings(chunked_prefill_size=30).prefill_chunk == 30
    assert EngineSettings(chunked_prefill_size=-1).prefill_chunk is None
    with pytest.raises(ConfigError, match=r"chunked_prefill_size must be >= 1, or -1"):
        validate_engine_settings("thinker", {"chunked_prefill_size": 0})


async def test_requests_arriving_while_the_step_waits_for_the_compute_thread_join_it() -> None:
    """Admission happens when the step starts on the compute thread: requests that arrive
    while it waits behind other work there (their own prompts being built) join it."""
    import threading

    from omni_core.engine.compute import compute_thread

    model = Recording()
    held, started = threading.Event(), threading.Event()

    def busy() -> None:  # another stage's work, ahead of the engine's step
        started.set()
        held.wait(10)

    async with TorchEngine(model, settings()) as engine:
        blocker = compute_thread().submit(busy)
        await anyio.to_thread.run_sync(started.wait)
        streams = [engine.enqueue("first", [1, 2, 3], greedy(2))]
        for _ in range(5):
            await anyio.sleep(0)  # the scheduler has submitted its step by now
        streams += [engine.enqueue(f"then{i}", [4, 5, i], greedy(2)) for i in range(3)]
        held.set()
        blocker.result()
        outputs = []
        for stream in streams:
            outputs.append([t async for t in stream])
    assert [rid for rid, _, _ in model.prefills[0]] == ["first", "then0", "then1", "then2"]
    assert all(len(tokens) == 2 for tokens in outputs)


async def test_a_model_that_ends_a_request_at_its_first_chunk_ends_it() -> None:
    """A chunk's result that says finished (a talker with nothing to say) ends the request
    there: it is not continued, and its stream ends."""
    from omni_core.engine.interface import StepResult

    class EndsAtOnce(Recording):
        def prefill(self, sequences, cache):
            super().prefill(sequences, cache)
            return [StepResult(output=None, finished=True) for _ in sequences]

    model = EndsAtOnce()
    async with TorchEngine(model, settings(max_prefill_tokens=16)) as engine:
        async with engine.enqueue("quiet", LONG, greedy(3)) as stream:
            assert [t async for t in stream] == [None]
            assert stream.finish_reason == "stop"
        await collect(engine, "next", [1, 2], 1)  # a step after: the slot was freed
        assert engine.free_slots == 4 and engine.num_running == 0
    assert [step[0][1:] for step in model.prefills] == [(0, 16), (0, 2)]
