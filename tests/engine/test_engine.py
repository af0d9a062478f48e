"""TorchEngine: continuous batching, streaming, slots, abort, admission and errors.

Most tests drive a fake StepModel that records every batch it is given (the
scheduler's decisions are what is under test); the equivalence tests drive
the small real decoder in :mod:`omni_core.engine.toy_model`.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import pytest
import torch

from omni_core.engine.interface import (
    CacheLayout,
    EngineError,
    EngineSettings,
    SamplingParams,
    Sequence,
    SequenceError,
    StepResult,
)
from omni_core.engine.kv_cache import SlotKVCache
from omni_core.engine.torch_engine import EngineClosed, TorchEngine
from omni_core.engine.toy_model import TinyDecoder
from omni_core.errors import RequestError

pytestmark = pytest.mark.anyio


class FakeModel:
    """Outputs ``(request_id, step)``; records each batch as (iteration, phase, ids, slots).

    ``stop_at[id] = n`` finishes a request at its n-th output; ids in
    ``bad_prompts`` fail prefill; ``decode_error`` is raised by every decode
    while set; ``row_errors`` fail one row through ``StepResult.error``;
    ``gate``, when set, makes each step wait for a permit (``release``).
    """

    def __init__(self) -> None:
        self.engine: TorchEngine | None = None
        self.calls: list[tuple[int, str, list[str], list[int]]] = []
        self.stop_at: dict[str, int] = {}
        self.silent_stop: dict[str, int] = {}  # finishes at that step with no output
        self.bad_prompts: set[str] = set()
        self.decode_error: Exception | None = None
        self.row_errors: set[str] = set()
        self.gate: threading.Semaphore | None = None
        self.delay = 0.0

    def cache_layout(self) -> CacheLayout:
        return CacheLayout(1, 1, 2, torch.float32, torch.device("cpu"))

    def prompt_length(self, prompt: Any) -> int:
        return len(prompt)

    def _record(self, phase: str, sequences: list[Sequence]) -> None:
        iteration = self.engine.steps if self.engine else -1
        self.calls.append(
            (iteration, phase, [s.request_id for s in sequences], [s.slot for s in sequences])
        )
        if self.gate is not None:
            assert self.gate.acquire(timeout=10)
        if self.delay:
            time.sleep(self.delay)

    def _result(self, seq: Sequence) -> StepResult:
        if seq.request_id in self.row_errors:
            return StepResult(None, error=ValueError(f"row {seq.request_id} broke"))
        step = len(seq.state.setdefault("out", []))
        seq.state["out"].append(step)
        if self.silent_stop.get(seq.request_id) == step:  # an end-of-speech step: no output
            return StepResult(None, finished=True)
        return StepResult((seq.request_id, step), finished=self.stop_at.get(seq.request_id) == step)

    def prefill(self, sequences: list[Sequence], cache: SlotKVCache) -> list[StepResult]:
        self._record("prefill", sequences)
        for seq in sequences:
            if seq.request_id in self.bad_prompts:
                raise ValueError(f"cannot read the prompt of {seq.request_id}")
            seq.cached = len(seq.prompt)
        return [self._result(s) for s in sequences]

    def decode(self, sequences: list[Sequence], cache: SlotKVCache) -> list[StepResult]:
        self._record("decode", sequences)
        if isinstance(self.decode_error, SequenceError):
            error, self.decode_error = self.decode_error, None
            raise error
        if self.decode_error is not None:
            raise self.decode_error
        for seq in sequences:
            seq.cached += 1
        return [self._result(s) for s in sequences]


def engine_with(model: FakeModel, **settings: Any) -> TorchEngine:
    engine = TorchEngine(model, EngineSettings(**settings))
    model.engine = engine
    return engine


def params(n: int, **kwargs: Any) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, **kwargs)


async def collect(stream: Any) -> list[Any]:
    return [item async for item in stream]


async def test_outputs_stream_in_step_order_until_max_new_tokens() -> None:
    model = FakeModel()
    with anyio.fail_after(10):
        async with engine_with(model, max_running_requests=2, max_total_tokens=64) as engine:
            stream = engine.enqueue("a", [1, 2, 3], params(5))
            assert await collect(stream) == [("a", i) for i in range(5)]
    assert stream.finish_reason == "length"
    assert stream.steps == 5
    assert [c[1] for c in model.calls] == ["prefill"] + ["decode"] * 4


async def test_each_output_arrives_before_the_next_step_runs() -> None:
    model = FakeModel()
    model.gate = threading.Semaphore(1)  # the prefill may run; the first decode waits
    with anyio.fail_after(10):
        async with engine_with(model, max_running_requests=1, max_total_tokens=64) as engine:
            stream = engine.enqueue("a", [1], params(3))
            assert await stream.__anext__() == ("a", 0)
            while len(model.calls) < 2:
                await anyio.sleep(0.001)
            assert [c[1] for c in model.calls] == ["prefill", "decode"]  # decode 1 waits
            model.gate.release(2)
            assert await collect(stream) == [("a", 1), ("a", 2)]


async def test_the_model_finishing_a_sequence_ends_its_stream() -> None:
    model = FakeModel()
    model.stop_at["a"] = 2
    with anyio.fail_after(10):
        async with engine_with(model, max_running_requests=2, max_total_tokens=64) as engine:
            stream = engine.enqueue("a", [1], params(100))
            assert await collect(stream) == [("a", 0), ("a", 1), ("a", 2)]
    assert stream.finish_reason == "stop"


async def test_a_model_stopping_on_its_last_allowed_step_without_output_says_stop() -> None:
    """A speech model's end-of-speech code makes no frame: the cap did not cut that speech."""
    model = FakeModel()
    model.silent_stop["a"] = 2  # the third step, which max_new_tokens 3 also ends
    model.stop_at["b"] = 2  # an output on that step: the cap is the reason
    with anyio.fail_after(10):
        async with engine_with(model, max_running_requests=2, max_total_tokens=64) as engine:
            silent, loud = engine.enqueue("a", [1], params(3)), engine.enqueue("b", [1], params(3))
            assert await collect(silent) == [("a", 0), ("a", 1), None]
            assert len(await collect(loud)) == 3
    assert silent.finish_reason == "stop" and loud.finish_reason == "length"


async def test_a_full_slot_ends_the_sequence() -> None:
    model = FakeModel()
    with anyio.fail_after(10):
        async with engine_with(model, max_running_requests=2, max_total_tokens=16) as engine:
            stream = engine.enqueue("a", [0] * 5, params(100))  # slot of 8: 3 more positions
            outputs = await collect(stream)
    assert stream.finish_reason == "length"
    assert len(outputs) == 4  # prefill's output, then decodes at positions 5, 6, 7


async def test_a_request_joins_the_running_batch_between_steps() -> None:
    model = FakeModel()
    model.delay = 0.01
    with anyio.fail_after(10):
        async with engine_with(model, max_running_requests=4, max_total_tokens=256) as engine:
            first = engine.enqueue("a", [1, 2], params(12))
            early = [await first.__anext__() for _ in range(3)]
            second = engine.enqueue("b", [3], params(4))
            results: dict[str, list[Any]] = {}

            async def drain(name: str, stream: Any) -> None:
                results[name] = await collect(stream)

            async with anyio.create_task_group() as tg:
                tg.start_soon(drain, "a", first)
                tg.start_soon(drain, "b", second)
    assert early + results["a"] == [("a", i) for i in range(12)]
    assert results["b"] == [("b", i) for i in range(4)]
    joined = next(c for c in model.calls if c[1] == "prefill" and c[2] == ["b"])
    # b was prefilled in the same iteration as a decode of a, then decoded with it
    assert (joined[0], "decode", ["a"]) in [(c[0], c[1], c[2]) for c in model.calls]
    assert any(c[1] == "decode" and c[2] == ["a", "b"] for c in model.calls)


async def test_max_running_requests_bounds_the_batch_and_slots_are_reused() -> None:
    model = FakeModel()
    with anyio.fail_after(10):
        async with engine_with(model, max_running_requests=2, max_total_tokens=64) as engine:
            streams = [engine.enqueue(f"r{i}", [i], params(3 + i)) for i in range(5)]
            assert engine.num_waiting == 5
            outputs = [await collect(s) for s in streams]
            assert engine.free_slots == 2
    assert [len(o) for o in outputs] == [3, 4, 5, 6, 7]
    by_iteration: dict[int, list[tuple[str, int]]] = {}
    for iteration, _, ids, slots in model.calls:
        by_iteration.setdefault(iteration, []).extend(zip(ids, slots, strict=True))
    for pairs in by_iteration.values():
        assert len(pairs) <= 2
        assert len({slot for _, slot in pairs}) == len(pairs)  # no slot shared in a step
    used = {slot for pairs in by_iteration.values() for _, slot in pairs}
    assert used == {0, 1}  # five requests through two slots


async def test_prefill_is_limited_by_max_prefill_tokens_per_step() -> None:
    model = FakeModel()
    with anyio.fail_after(10):
        async with engine_with(
            model, max_running_requests=4, max_total_tokens=64, max_prefill_tokens=10
        ) as engine:
            streams = [engine.enqueue(f"r{i}", [0] * 6, params(2)) for i in range(3)]
            for stream in streams:
                await collect(stream)
    prefills = [c[2] for c in model.calls if c[1] == "prefill"]
    assert prefills == [["r0"], ["r1"], ["r2"]]  # 6 + 6 > 10: one prompt per step


async def test_a_prompt_that_can_never_fit_is_refused_at_submit() -> None:
    model = FakeModel()
    async with engine_with(
        model, max_running_requests=4, max_total_tokens=32, max_prefill_tokens=6
    ) as engine:
        with pytest.raises(RequestError, match=r"9 cache positions.*a cache slot holds 8"):
            engine.enqueue("long", [0] * 9, params(1))
        with pytest.raises(RequestError, match=r"engine\.max_prefill_tokens is 6"):
            engine.enqueue("wide", [0] * 7, params(1))
        assert engine.num_waiting == 0
        assert model.calls == []


async def test_bad_sampling_and_duplicate_ids_are_refused_at_submit() -> None:
    model = FakeModel()
    async with engine_with(model, max_running_requests=2, max_total_tokens=64) as engine:
        with pytest.raises(RequestError, match="top_p must be in"):
            engine.enqueue("x", [1], SamplingParams(top_p=0.0))
        engine.enqueue("a", [1], params(2))
        with pytest.raises(RequestError, match="already in the engine"):
            engine.enqueue("a", [1], params(2))


async def test_abort_stops_output_and_frees_the_slot_for_the_next_request() -> None:
    model = FakeModel()
    model.delay = 0.005
    with anyio.fail_after(10):
        async with engine_with(model, max_running_requests=1, max_total_tokens=64) as engine:
            first = engine.enqueue("a", [1], params(1000))
            waiting = engine.enqueue("b", [2], params(3))
            got = [await first.__anext__() for _ in range(3)]
            assert engine.abort("a")
            rest = await collect(first)
            assert await collect(waiting) == [("b", 0), ("b", 1), ("b", 2)]
            assert not engine.abort("a")  # already gone
    assert first.finish_reason == "abort"
    assert len(got) + len(rest) <= 4  # at most the output of the step in flight
    after = [c for c in model.calls if c[2] == ["b"]]
    assert after and all(c[3] == [0] for c in after)  # b got a's slot
    assert not any("a" in c[2] for c in model.calls if c[0] >= after[0][0])


async def test_aborting_a_waiting_request_and_closing_a_stream() -> None:
    model = FakeModel()
    model.delay = 0.005
    with anyio.fail_after(10):
        async with engine_with(model, max_running_requests=1, max_total_tokens=64) as engine:
            running = engine.enqueue("a", [1], params(1000))
            queued = engine.enqueue("b", [2], params(5))
            assert engine.abort("b")
            assert await collect(queued) == []
            await running.__anext__()
            await running.aclose()  # the consumer leaves: the request is aborted
            assert running.finish_reason == "abort"
            third = engine.enqueue("c", [3], params(2))
            assert await collect(third) == [("c", 0), ("c", 1)]
    assert all("b" not in c[2] for c in model.calls)


async def test_cancelling_the_consumer_aborts_its_request() -> None:
    model = FakeModel()
    model.delay = 0.005
    with anyio.fail_after(10):
        async with engine_with(model, max_running_requests=1, max_total_tokens=64) as engine:
            stream = engine.enqueue("a", [1], params(1000))
            with anyio.move_on_after(0.05):
                await collect(stream)
            assert stream.finish_reason == "abort"
            assert await collect(engine.enqueue("b", [1], params(2))) == [("b", 0), ("b", 1)]


def test_submitting_without_an_event_loop_is_refused() -> None:
    with pytest.raises(EngineError, match="needs a running event loop"):
        engine_with(FakeModel(), max_total_tokens=64).enqueue("a", [1], params(1))


async def test_a_failing_prefill_fails_only_the_request_it_belongs_to() -> None:
    model = FakeModel()
    model.bad_prompts.add("bad")
    with anyio.fail_after(10):
        async with engine_with(model, max_running_requests=4, max_total_tokens=64) as engine:
            streams = {n: engine.enqueue(n, [1], params(3)) for n in ("ok1", "bad", "ok2")}
            assert await collect(streams["ok1"]) == [("ok1", i) for i in range(3)]
            assert await collect(streams["ok2"]) == [("ok2", i) for i in range(3)]
            with pytest.raises(EngineError, match=r"'bad'.*prefill.*cannot read the prompt"):
                await collect(streams["bad"])
    assert streams["bad"].finish_reason == "error"
    # the batch failed, then each prompt was prefilled alone to find the culprit
    assert [c[2] for c in model.calls if c[1] == "prefill"][:4] == [
        ["ok1", "bad", "ok2"],
        ["ok1"],
        ["bad"],
        ["ok2"],
    ]


async def test_an_unattributed_decode_error_fails_every_running_request() -> None:
    model = FakeModel()
    with anyio.fail_after(10):
        async with engine_with(model, max_running_requests=4, max_total_tokens=64) as engine:
            streams = [engine.enqueue(n, [1], params(5)) for n in ("a", "b")]
            model.decode_error = RuntimeError("device lost")
            for stream in streams:
                with pytest.raises(EngineError, match="decode step failed: RuntimeError: device"):
                    await collect(stream)
            assert engine.free_slots == 4  # both slots freed
            model.decode_error = None
            again = engine.enqueue("c", [1], params(2))
            assert await collect(again) == [("c", 0), ("c", 1)]  # the engine goes on
            assert engine.free_slots == 4


async def test_an_attributed_decode_error_fails_only_the_named_request() -> None:
    model = FakeModel()
    with anyio.fail_after(10):
        async with engine_with(model, max_running_requests=4, max_total_tokens=64) as engine:
            a = engine.enqueue("a", [1], params(4))
            b = engine.enqueue("b", [1], params(4))
            model.decode_error = SequenceError(["b"], "nan in b's logits")
            assert await collect(a) == [("a", i) for i in range(4)]
            with pytest.raises(EngineError, match="nan in b's logits"):
                await collect(b)


async def test_a_row_error_fails_only_that_row() -> None:
    model = FakeModel()
    model.row_errors.add("b")
    with anyio.fail_after(10):
        async with engine_with(model, max_running_requests=4, max_total_tokens=64) as engine:
            a, b = engine.enqueue("a", [1], params(3)), engine.enqueue("b", [1], params(3))
            assert await collect(a) == [("a", i) for i in range(3)]
            with pytest.raises(EngineError, match="row b broke"):
                await collect(b)


async def test_aclose_fails_pending_requests_and_refuses_new_ones() -> None:
    model = FakeModel()
    model.delay = 0.005
    with anyio.fail_after(10):
        engine = engine_with(model, max_running_requests=1, max_total_tokens=64)
        running = engine.enqueue("a", [1], params(1000))
        queued = engine.enqueue("b", [1], params(1000))
        await running.__anext__()
        await engine.aclose()
        for stream in (running, queued):
            with pytest.raises(EngineClosed):
                await collect(stream)
        with pytest.raises(EngineClosed):
            engine.enqueue("c", [1], params(1))


async def test_the_event_loop_keeps_running_while_a_step_computes() -> None:
    model = FakeModel()
    model.delay = 0.2
    ticks = 0
    with anyio.fail_after(10):
        async with engine_with(model, max_running_requests=1, max_total_tokens=64) as engine:
            stream = engine.enqueue("a", [1], params(1))

            async def tick() -> None:
                nonlocal ticks
                while True:
                    ticks += 1
                    await anyio.sleep(0.01)

            async with anyio.create_task_group() as tg:
                tg.start_soon(tick)
                await collect(stream)
                tg.cancel_scope.cancel()
    assert ticks >= 10  # ~20 would fit in the 0.2 s step


async def test_the_cache_is_sized_from_the_memory_share_when_memory_is_known() -> None:
    model = FakeModel()  # 1 layer x 1 head x 2 dims x fp32 x (k, v) = 16 bytes a position
    settings = EngineSettings(max_running_requests=4, mem_fraction_static=0.5)
    engine = TorchEngine(model, settings, device_memory=64_000, used_memory=16_000)
    assert engine.plan.source == "memory"
    assert (engine.plan.num_slots, engine.plan.slot_len) == (4, 250)  # 16000 B / 16 / 4
    assert engine.cache.k.shape == (1, 4, 1, 250, 2)


async def test_a_device_that_contradicts_the_model_is_refused() -> None:
    with pytest.raises(EngineError, match=r"engine\.device says cuda"):
        TorchEngine(FakeModel(), EngineSettings(device="cuda"))


# -- the real small decoder ---------------------------------------------------

SAMPLINGS = [
    SamplingParams(temperature=0.0, max_new_tokens=12),
    SamplingParams(temperature=1.0, seed=1, max_new_tokens=9),
    SamplingParams(temperature=0.8, top_k=8, seed=2, max_new_tokens=14),
    SamplingParams(temperature=1.2, top_p=0.9, seed=3, max_new_tokens=11),
    SamplingParams(top_k=20, top_p=0.8, repetition_penalty=1.3, seed=4, max_new_tokens=13),
    SamplingParams(temperature=0.7, seed=5, max_new_tokens=10),
    SamplingParams(temperature=1.0, repetition_penalty=1.5, seed=6, max_new_tokens=12),
    SamplingParams(temperature=0.9, top_k=5, seed=7, max_new_tokens=8),
]


def prompts() -> list[list[int]]:
    noise = torch.Generator().manual_seed(0)
    return [torch.randint(0, 64, (3 + 2 * i,), generator=noise).tolist() for i in range(8)]


async def test_eight_concurrent_requests_equal_eight_sequential_ones() -> None:
    """Batching, joining mid-flight and reusing slots change no request's tokens."""
    model = TinyDecoder(vocab_size=64, dim=32, num_heads=2, num_layers=2, seed=0)
    settings = EngineSettings(max_running_requests=4, max_total_tokens=4 * 48)
    with anyio.fail_after(15):
        async with TorchEngine(model, settings) as engine:
            sequential = [
                await collect(engine.enqueue(f"s{i}", p, s))
                for i, (p, s) in enumerate(zip(prompts(), SAMPLINGS, strict=True))
            ]
            solo_steps = engine.steps
            concurrent: dict[int, list[int]] = {}

            async def one(i: int) -> None:
                concurrent[i] = await collect(engine.enqueue(f"c{i}", prompts()[i], SAMPLINGS[i]))

            async with anyio.create_task_group() as tg:
                for i in range(8):
                    tg.start_soon(one, i)
    assert [concurrent[i] for i in range(8)] == sequential
    assert [len(s) for s in sequential] == [s.max_new_tokens for s in SAMPLINGS]
    assert engine.steps - solo_steps < solo_steps / 2  # they really ran together


async def test_the_real_decoder_stops_at_its_eos_token() -> None:
    model = TinyDecoder(seed=0)
    with anyio.fail_after(10):
        async with TorchEngine(model, EngineSettings(max_total_tokens=512)) as engine:
            probe = SamplingParams(0.0, max_new_tokens=20)
            tokens = await collect(engine.enqueue("probe", [1, 2, 3], probe))
    eos_model = TinyDecoder(seed=0, eos_id=tokens[2])
    with anyio.fail_after(10):
        async with TorchEngine(eos_model, EngineSettings(max_total_tokens=512)) as engine:
            stream = engine.enqueue("x", [1, 2, 3], SamplingParams(0.0, max_new_tokens=50))
            ended = await collect(stream)
    assert ended == tokens[: tokens.index(tokens[2]) + 1]
    assert stream.finish_reason == "stop"


class FedModel(FakeModel):
    """A FakeModel whose sequences decode only when their stage has fed them an input."""

    def __init__(self) -> None:
        super().__init__()
        self.inputs: dict[str, int] = {}

    def ready(self, seq: Sequence) -> bool:
        return self.inputs.get(seq.request_id, 0) > 0

    def decode(self, sequences: list[Sequence], cache: SlotKVCache) -> list[StepResult]:
        for seq in sequences:
            assert self.ready(seq), f"{seq.request_id} was decoded without input"
            self.inputs[seq.request_id] -= 1
        return super().decode(sequences, cache)


async def test_sequences_waiting_for_input_sleep_and_the_ready_ones_go_on():
    model = FedModel()
    engine = engine_with(model, max_running_requests=4)
    async with engine:
        fed, starved = (
            engine.enqueue("fed", [1, 2], params(4)),
            engine.enqueue("starved", [1], params(3)),
        )
        model.inputs["fed"] = 3
        assert await collect(fed) == [("fed", 0), ("fed", 1), ("fed", 2), ("fed", 3)]
        steps = engine.steps
        await anyio.sleep(0.2)
        assert engine.steps == steps  # nothing ready: the scheduler sleeps instead of spinning
        model.inputs["starved"] = 2
        engine.wake()
        assert await collect(starved) == [("starved", 0), ("starved", 1), ("starved", 2)]
    decodes = [ids for _, phase, ids, _ in model.calls if phase == "decode"]
    assert all("starved" not in ids for ids in decodes[:3])
