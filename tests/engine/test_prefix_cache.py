"""Prompt prefixes reused across requests (engine/prefix_cache.py), on the toy decoder.

What must hold: a request whose prompt head another slot holds computes only
the rest, and says the same as when it computes everything; requests that
arrive together compute a shared head once; a failed prefill leaves nothing
behind to reuse; ``engine.disable_radix_cache`` turns it all off.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import torch

from omni_core.engine.interface import EngineSettings, SamplingParams
from omni_core.engine.prefix_cache import (
    BLOCK,
    PrefixIndex,
    block_keys,
    reusable,
    shared_blocks,
)
from omni_core.engine.torch_engine import TorchEngine
from omni_core.engine.toy_model import TinyDecoder

pytestmark = pytest.mark.anyio

HEAD = [(7 * i + 3) % 60 for i in range(40)]  # 40 shared positions: two whole blocks


def test_block_keys_chain_over_the_whole_prefix() -> None:
    rows = torch.arange(50).remainder(13)
    other = rows.clone()
    other[20] = 99  # inside the second block
    keys, changed = block_keys(rows), block_keys(other)
    assert len(keys) == 50 // BLOCK
    assert keys[0] == changed[0] and keys[1] != changed[1]
    assert keys[2] != changed[2]  # a later block differs with any earlier one
    assert shared_blocks(keys, changed) == 1
    # rows of several channels hash as rows, and a channel count is part of the key
    wide = torch.stack([rows, rows], dim=1)
    assert block_keys(wide) != keys and len(block_keys(wide)) == len(keys)


def test_the_last_position_is_never_taken_from_the_cache() -> None:
    keys = block_keys(torch.arange(32))
    assert len(reusable(keys, 32)) == 1  # position 31 is the prefill's output
    assert len(reusable(keys, 33)) == 2


def test_the_index_finds_the_longest_held_prefix_and_prefers_the_own_slot() -> None:
    index = PrefixIndex()
    keys = block_keys(torch.arange(64))
    index.register(3, keys[:2])
    index.register(5, keys)
    assert index.longest(keys) == (4, 5)
    assert index.longest(keys[:2], prefer=3) == (2, 3)
    index.forget(5)
    assert index.longest(keys) == (2, 3) and index.held(5) == 0
    index.register(3, [])
    assert index.longest(keys) == (0, None) and index.blocks == 0


class Recording(TinyDecoder):
    """The toy decoder, remembering where each prefill started (what it computed)."""

    def __init__(self, **kwargs: Any):
        super().__init__(vocab_size=64, dim=32, num_heads=2, num_layers=2, seed=0, **kwargs)
        self.prefills: list[list[tuple[str, int, int]]] = []
        self.copies: list[tuple[int, int, int]] = []  # prefix_copied: the engine's hook
        self.fail: set[str] = set()

    def prefix_copied(self, source: int, slot: int, length: int) -> None:
        self.copies.append((source, slot, length))

    def prefill(self, sequences, cache):
        self.prefills.append([(s.request_id, s.cached, len(s.prompt)) for s in sequences])
        bad = [s.request_id for s in sequences if s.request_id in self.fail]
        if bad:
            from omni_core.engine.interface import SequenceError

            raise SequenceError(bad, "refused on purpose")
        return super().prefill(sequences, cache)


async def run(engine: TorchEngine, prompts: dict[str, list[int]], tokens: int = 6) -> dict:
    out: dict[str, Any] = {}

    async def one(rid: str, prompt: list[int]) -> None:
        got = []
        try:
            async with engine.enqueue(
                rid, prompt, SamplingParams(temperature=0.0, max_new_tokens=tokens)
            ) as s:
                async for token in s:
                    got.append(token)
            out[rid] = got
        except Exception as exc:
            out[rid] = exc

    async with anyio.create_task_group() as tg:
        for rid, prompt in prompts.items():
            tg.start_soon(one, rid, prompt)
    return out


def settings(**kwargs: Any) -> EngineSettings:
    return EngineSettings(max_running_requests=8, max_total_tokens=8 * 96, **kwargs)


async def test_requests_sharing_a_head_compute_it_once_and_say_what_they_would_alone() -> None:
    prompts = {f"r{i}": HEAD + [(5 * i + j) % 64 for j in range(3 + i)] for i in range(6)}
    model = Recording(share_prefixes=True)
    async with TorchEngine(model, settings()) as engine:
        shared = await run(engine, prompts)
        assert engine.prompt_positions == {
            "cached": 5 * 2 * BLOCK,
            "computed": sum(map(len, prompts.values())) - 5 * 2 * BLOCK,
        }
        # all six in one step: the first computes the head alone, the others in a
        # second wave of that step start past it, so they stay in step together
        assert engine.steps == 6
    assert model.prefills[0] == [("r0", 0, len(prompts["r0"]))]
    assert [start for _, start, _ in model.prefills[1]] == [2 * BLOCK] * 5
    assert len(model.prefills) == 2
    plain_model = Recording()
    async with TorchEngine(plain_model, settings()) as engine:
        plain = await run(engine, prompts)
        total = sum(map(len, prompts.values()))
        assert engine.prompt_positions == {"cached": 0, "computed": total}
    assert plain_model.prefills[0][0][1] == 0 and len(plain_model.prefills[0]) == 6
    assert shared == plain and all(len(tokens) == 6 for tokens in shared.values())


async def test_a_prompt_sent_again_reuses_its_own_freed_slot() -> None:
    model = Recording(share_prefixes=True)
    prompt = [*HEAD, 1, 2, 3]
    async with TorchEngine(model, settings()) as engine:
        first = await run(engine, {"a": prompt})
        again = await run(engine, {"b": prompt})
        assert engine.prompt_positions["cached"] == 2 * BLOCK
    assert model.prefills[1] == [("b", 2 * BLOCK, len(prompt))]
    assert first["a"] == again["b"]


async def test_disable_radix_cache_computes_every_prompt_whole() -> None:
    model = Recording(share_prefixes=True)
    prompt = [*HEAD, 4]
    async with TorchEngine(model, settings(disable_radix_cache=True)) as engine:
        assert engine.prefixes is None
        await run(engine, {"a": prompt})
        await run(engine, {"b": prompt})
    assert [batch[0][1] for batch in model.prefills] == [0, 0]


async def test_a_failed_prefill_leaves_no_prefix_to_reuse() -> None:
    model = Recording(share_prefixes=True)
    model.fail.add("bad")
    prompt = [*HEAD, 9, 9]
    async with TorchEngine(model, settings()) as engine:
        out = await run(engine, {"bad": prompt})
        assert isinstance(out["bad"], Exception)
        assert engine.prefixes is not None and engine.prefixes.blocks == 0
        good = await run(engine, {"good": prompt})
    assert model.prefills[-1] == [("good", 0, len(prompt))]
    assert len(good["good"]) == 6


async def test_a_copied_head_lands_in_another_slot_while_its_owner_runs() -> None:
    model = Recording(share_prefixes=True)
    prompts = {"long": HEAD + [1] * 5, "next": HEAD + [2] * 4}
    async with TorchEngine(model, settings()) as engine:
        holder = engine.enqueue(
            "long", prompts["long"], SamplingParams(temperature=0.0, max_new_tokens=30)
        )
        async for _ in holder:  # its first token: its prompt is in its slot
            break
        later = await run(engine, {"next": prompts["next"]})
        await holder.aclose()
    assert model.prefills[-1] == [("next", 2 * BLOCK, len(prompts["next"]))]
    # the model is told, for the state it keeps per slot (the thinker's media rows)
    [(source, slot, length)] = model.copies
    assert source != slot and length == 2 * BLOCK
    alone_model = Recording()
    async with TorchEngine(alone_model, settings()) as engine:
        alone = await run(engine, {"next": prompts["next"]})
    assert later == alone


async def test_a_follow_up_that_sends_the_answer_back_copies_it_too() -> None:
    """A conversation's next turn: its prompt is the last prompt, the answer, more. The
    finished request's slot is indexed over the answer's positions it fed back as well."""
    head = [(7 * j) % 64 for j in range(30)]
    model = Recording(share_prefixes=True)
    async with TorchEngine(model, settings()) as engine:
        first = await run(engine, {"turn1": head})
        follow_up = head + first["turn1"] + [3, 9, 27]
        second = await run(engine, {"turn2": follow_up})
        # turn 1 fed 30 + 5 positions (its 6th token was never fed): two whole blocks,
        # where its prompt alone held one
        assert model.prefills[-1] == [("turn2", 2 * BLOCK, len(follow_up))]
    plain_model = Recording()
    async with TorchEngine(plain_model, settings()) as engine:
        assert await run(engine, {"turn2": follow_up}) == second


async def test_a_newcomer_is_charged_the_positions_it_computes_not_those_it_copies() -> None:
    """Two follow-ups of 43 positions, 32 of them a head the cache holds, each compute 11:
    with a budget of 48 they share one step (charged 43 each they would not)."""
    model = Recording(share_prefixes=True)
    engine = TorchEngine(model, settings(max_prefill_tokens=48, chunked_prefill_size=-1))
    async with engine:
        await run(engine, {"first": [*HEAD, 1, 2, 3]})
        model.prefills.clear()
        await run(engine, {"b": [*HEAD, 4, 5, 6], "c": [*HEAD, 7, 8, 9]})
    assert model.prefills[0] == [("b", 32, 43), ("c", 32, 43)]
