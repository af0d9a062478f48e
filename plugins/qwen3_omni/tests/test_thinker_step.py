"""The thinker on the engine: captured talker rows equal one full forward pass."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from omni_core.engine.backends import create_engine  # noqa: E402
from omni_core.engine.interface import EngineSettings, SamplingParams  # noqa: E402
from omni_core.engine.prompt import EmbeddedPrompt  # noqa: E402
from omni_qwen3_omni.loading import load_part  # noqa: E402
from omni_qwen3_omni.thinker.step import ThinkerStepModel  # noqa: E402

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_rows_streamed_step_by_step_equal_a_full_forward_pass():
    lm, config, _ = load_part("tiny", "thinker", "dummy", "float32", "cpu")
    model = ThinkerStepModel(
        lm, config.text, eos_ids=set(), device=torch.device("cpu"), dtype=torch.float32
    )
    accept = config.text.num_hidden_layers - 1
    prompt = EmbeddedPrompt([872, 198, 9707, 11, 1879, 0, 3, 4])
    model.capture("spoken", accept)
    settings = EngineSettings(max_running_requests=2, max_total_tokens=256)
    tokens, layer0, hidden = [], [], []
    async with create_engine(model, settings, device="cpu") as engine:
        plain = [
            t async for t in engine.enqueue("plain", prompt, SamplingParams(0.0, max_new_tokens=5))
        ]
        async with engine.enqueue(
            "spoken", prompt, SamplingParams(0.0, max_new_tokens=5)
        ) as stream:
            async for out in stream:
                tokens.append(out["token"])
                layer0.append(out["rows"][0])
                hidden.append(out["rows"][1])
    assert tokens == plain  # capturing changes nothing about the answer
    assert [r.shape[0] for r in layer0] == [len(prompt), 1, 1, 1, 1]
    ids = torch.tensor([prompt.token_ids + tokens[:-1]])
    positions = torch.arange(ids.shape[1])[None, None].expand(3, 1, -1)
    with torch.no_grad():
        _, full = lm(lm.embed(ids), positions, capture_layers={0, accept})
    torch.testing.assert_close(torch.cat(layer0), full[0][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.cat(hidden), full[accept][0], rtol=1e-4, atol=1e-4)


async def _answers(model, prompts, static=None):
    """Each prompt's tokens (and a spoken one's rows) through the engine, all at once."""
    import anyio

    from omni_core.engine.torch_engine import TorchEngine

    settings = EngineSettings(max_running_requests=4, max_total_tokens=512)
    out = {}
    async with TorchEngine(model, settings, static=static) as engine:

        async def one(name, prompt):
            sampling = SamplingParams(0.0, max_new_tokens=6)
            out[name] = [t async for t in engine.enqueue(name, prompt, sampling)]

        async with anyio.create_task_group() as group:
            for name, prompt in prompts.items():
                group.start_soon(one, name, prompt)
    return out


async def test_static_shape_decode_steps_equal_eager():
    """Plain and spoken requests together (3 rows in the 4-bucket): eager's tokens and rows."""
    from omni_core.engine.buckets import StaticPlan

    lm, config, _ = load_part("tiny", "thinker", "dummy", "float32", "cpu")
    accept = config.text.num_hidden_layers - 1
    prompts = {
        "a": EmbeddedPrompt([872, 198, 9707, 11, 1879, 0, 3, 4]),
        "b": EmbeddedPrompt([872, 198, 77, 5]),
        "spoken": EmbeddedPrompt([872, 198, 9707, 11, 12, 13]),
    }

    def step_model():
        model = ThinkerStepModel(
            lm, config.text, eos_ids=set(), device=torch.device("cpu"), dtype=torch.float32
        )
        model.capture("spoken", accept)
        model.expected_captures = (accept,)
        return model

    eager = await _answers(step_model(), prompts)
    model = step_model()
    static = await _answers(model, prompts, StaticPlan(False, False, (1, 4), "test"))
    assert static["a"] == eager["a"] and static["b"] == eager["b"]
    assert [o["token"] for o in static["spoken"]] == [o["token"] for o in eager["spoken"]]
    for got, want in zip(static["spoken"], eager["spoken"], strict=True):
        for g, w in zip(got["rows"], want["rows"], strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    assert set(model._static) == {None, frozenset({0, accept})}
    assert model._static[frozenset({0, accept})].calls > 0  # a batch with a spoken row
    plain = {k: v for k, v in prompts.items() if k != "spoken"}  # no captured rows: the other
    alone = await _answers(model, plain, StaticPlan(False, False, (1, 4), "test"))
    assert alone == {k: eager[k] for k in plain}
    assert model._static[None].calls > 0


def _thinker(capture: str | None = None) -> tuple[ThinkerStepModel, object]:
    lm, config, _ = load_part("tiny", "thinker", "dummy", "float32", "cpu")
    model = ThinkerStepModel(
        lm, config.text, eos_ids=set(), device=torch.device("cpu"), dtype=torch.float32
    )
    if capture is not None:
        model.capture(capture, config.text.num_hidden_layers - 1)
    return model, config


def _media_prompt(ids: list[int], image: torch.Tensor, additions: list[torch.Tensor]):
    """A prompt with an "image" spliced at positions 20..23 and deepstack rows there, and
    M-RoPE positions that stand still over the image as the real ones do."""
    n = len(ids)
    flat = torch.cat([torch.arange(20), torch.full((4,), 20), torch.arange(21, n - 3)])
    positions = torch.stack([flat, flat, flat])
    return EmbeddedPrompt(
        ids,
        positions=positions,
        next_position=int(flat[-1]) + 1,
        embeddings=image,
        embedding_index=torch.arange(20, 24),
        layer_additions=additions,
        addition_index=torch.arange(20, 24),
    )


def _shared_media(config, seed: int):
    """Prompts of a 40-token head with one image (and its deepstack rows), then ``tail``."""
    hidden = config.text.hidden_size
    g = torch.Generator().manual_seed(seed)
    image = torch.randn(4, hidden, generator=g)
    additions = [torch.randn(4, hidden, generator=g) * 0.1 for _ in range(2)]
    head = [872 + (i * 37) % 500 for i in range(40)]
    return lambda tail: _media_prompt([*head, *tail], image, additions)


async def _run(model, prompts, *, radix: bool = True, tokens: int = 5):
    """Greedy answers of ``prompts`` sent one after another, and the positions computed."""
    settings = EngineSettings(
        max_running_requests=2, max_total_tokens=512, disable_radix_cache=not radix
    )
    out = {}
    async with create_engine(model, settings, device="cpu") as engine:
        for name, prompt in prompts.items():
            sampling = SamplingParams(0.0, max_new_tokens=tokens)
            out[name] = [t async for t in engine.enqueue(name, prompt, sampling)]
        counts = dict(engine.prompt_positions)
    return out, counts


async def test_a_shared_head_with_an_image_is_copied_and_answers_as_computed_whole():
    """A system prompt and an image, then two different questions: the second request
    computes only what follows the shared blocks; every answer is the one computed whole."""
    model, config = _thinker()
    media = _shared_media(config, seed=0)
    prompts = {"first": media([5, 6, 7]), "second": media([9, 10, 11, 12, 13])}
    shared, counts = await _run(model, prompts)
    whole, plain = await _run(model, prompts, radix=False)
    assert shared == whole
    # the second prompt's first 32 positions (two blocks of 16, image included) copied
    assert counts == {"cached": 32, "computed": sum(map(len, prompts.values())) - 32}
    assert plain == {"cached": 0, "computed": sum(map(len, prompts.values()))}


async def test_another_image_at_the_same_positions_shares_only_what_precedes_it():
    model, config = _thinker()
    hidden = config.text.hidden_size
    g = torch.Generator().manual_seed(1)
    additions = [torch.randn(4, hidden, generator=g) * 0.1 for _ in range(2)]
    head = [872 + (i * 37) % 500 for i in range(40)]
    one = _media_prompt([*head, 5, 6], torch.randn(4, hidden, generator=g), additions)
    other = _media_prompt([*head, 5, 6], torch.randn(4, hidden, generator=g), additions)
    shared, counts = await _run(model, {"one": one, "other": other})
    whole, _ = await _run(model, {"one": one, "other": other}, radix=False)
    assert shared == whole
    assert counts["cached"] == 16  # the block before the image (positions 0..15) only


async def test_a_spoken_request_computes_its_whole_prompt_for_the_talker():
    """Its talker reads every prompt position's rows: nothing is copied for it."""
    model, _ = _thinker(capture="spoken")
    head = [872 + (i * 37) % 500 for i in range(40)]
    prompts = {"text": EmbeddedPrompt([*head, 5]), "spoken": EmbeddedPrompt([*head, 6, 7])}
    out, counts = await _run(model, prompts)
    assert counts["cached"] == 0
    assert out["spoken"][0]["rows"][0].shape[0] == len(prompts["spoken"])


def _text_prompt(ids: list[int]) -> EmbeddedPrompt:
    """A text prompt with its three M-RoPE streams given, as the preprocessing builds it."""
    flat = torch.arange(len(ids))
    return EmbeddedPrompt(ids, positions=torch.stack([flat, flat, flat]), next_position=len(ids))


async def test_the_next_turn_copies_the_previous_answer_as_well():
    """Turn 2's prompt holds turn 1's prompt and answer: both come from turn 1's slot, at
    the positions its decode steps gave them, and the answer is the one computed whole."""
    model, _ = _thinker()
    head = [872 + (i * 37) % 500 for i in range(30)]
    first, _ = await _run(model, {"turn1": _text_prompt(head)}, tokens=6)
    follow_up = {"turn1": _text_prompt(head), "turn2": _text_prompt(head + first["turn1"] + [77])}
    shared, counts = await _run(model, follow_up, tokens=6)
    whole, _ = await _run(model, follow_up, radix=False, tokens=6)
    assert shared == whole
    # turn 1 again computes its 30 positions; turn 2 copies 30 + 5 fed answer positions,
    # two whole blocks (its prompt alone would give one)
    assert counts == {"cached": 32, "computed": 30 + len(head) + 6 + 1 - 32}


async def test_spoken_requests_copy_a_head_with_its_media_rows_for_the_talker():
    """A speech deployment (``expected_captures``) keeps the accept layer's rows at media
    positions per slot: a spoken request copies a head with an image in it, from a spoken
    or a text request's slot, and hands the talker what a whole prefill would have."""
    model, config = _thinker()
    accept = config.text.num_hidden_layers - 1
    model.expected_captures = (accept,)
    for name in ("spoken1", "spoken2", "spoken3"):
        model.capture(name, accept)
    media = _shared_media(config, seed=2)
    prompts = {
        "spoken1": media([5, 6, 7]),
        "spoken2": media([9, 10, 11, 12]),
        "text": media([13, 14]),
        "spoken3": media([15]),
    }
    shared, counts = await _run(model, prompts)
    whole, _ = await _run(model, prompts, radix=False)
    assert counts["cached"] == 3 * 32  # every request after the first copies two blocks
    at_image = torch.arange(20, 24)
    for name in ("spoken1", "spoken2", "spoken3"):
        assert [o["token"] for o in shared[name]] == [o["token"] for o in whole[name]]
        (layer0, rows), (layer0_whole, rows_whole) = shared[name][0]["rows"], whole[name][0]["rows"]
        assert layer0.shape[0] == rows.shape[0] == len(prompts[name])
        torch.testing.assert_close(layer0, layer0_whole, rtol=0, atol=0)
        torch.testing.assert_close(rows[at_image], rows_whole[at_image], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(rows[32:], rows_whole[32:], rtol=1e-5, atol=1e-5)
    assert shared["text"] == whole["text"]


def test_media_rows_follow_a_copied_head_and_stop_where_it_does():
    model, config = _thinker()
    accept = config.text.num_hidden_layers - 1
    model.expected_captures = (accept,)
    rows = torch.randn(4, config.text.hidden_size)
    model.media_rows[0] = {accept: (torch.tensor([3, 10, 20, 30]), rows)}
    model.media_rows[1] = {accept: (torch.tensor([5]), torch.randn(1, config.text.hidden_size))}
    model.prefix_copied(0, 1, 16)  # slot 1 now holds slot 0's first 16 positions
    index, kept = model.media_rows[1][accept]
    assert index.tolist() == [3, 10] and torch.equal(kept, rows[:2])
    assert model.media_rows[0][accept][0].tolist() == [3, 10, 20, 30]  # the source keeps its own


async def _chunked(model, prompts, chunk: int, *, radix: bool = False, tokens: int = 5):
    """``_run`` with every prompt longer than ``chunk`` prefilled in chunks of ``chunk``."""
    settings = EngineSettings(
        max_running_requests=2,
        max_total_tokens=512,
        max_prefill_tokens=chunk,
        disable_radix_cache=not radix,
    )
    out = {}
    async with create_engine(model, settings, device="cpu") as engine:
        for name, prompt in prompts.items():
            sampling = SamplingParams(0.0, max_new_tokens=tokens)
            out[name] = [t async for t in engine.enqueue(name, prompt, sampling)]
        steps = engine.steps
    return out, steps


async def test_a_prompt_with_an_image_prefilled_in_chunks_answers_as_whole():
    """Chunks of 22 cut the image (positions 20..23) and its deepstack rows in two."""
    model, config = _thinker()
    media = _shared_media(config, seed=3)
    prompts = {"one": media([5, 6, 7]), "two": media([9, 10])}
    chunked, steps = await _chunked(model, prompts, 22)
    whole, _ = await _run(model, prompts, radix=False)
    assert chunked == whole
    assert steps == 2 * (2 + 5 - 1)  # two chunks (22 + 21 or 20) and 4 decode steps each


async def test_a_spoken_prompt_in_chunks_hands_the_talker_rows_for_all_of_it():
    """Its last chunk hands the talker whole-prompt rows, as a copied head does: layer 0
    exact, the accept layer at the image and in the last chunk as a whole prefill's."""
    model, config = _thinker()
    accept = config.text.num_hidden_layers - 1
    model.expected_captures = (accept,)
    model.capture("spoken", accept)
    prompts = {"spoken": _shared_media(config, seed=4)([5, 6, 7])}
    chunked, _ = await _chunked(model, prompts, 22)
    whole, _ = await _run(model, prompts, radix=False)
    assert [o["token"] for o in chunked["spoken"]] == [o["token"] for o in whole["spoken"]]
    (layer0, rows), (layer0_whole, rows_whole) = (
        chunked["spoken"][0]["rows"],
        whole["spoken"][0]["rows"],
    )
    assert layer0.shape[0] == rows.shape[0] == len(prompts["spoken"])
    torch.testing.assert_close(layer0, layer0_whole, rtol=0, atol=0)
    at_image = torch.arange(20, 24)
    torch.testing.assert_close(rows[at_image], rows_whole[at_image], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rows[22:], rows_whole[22:], rtol=1e-5, atol=1e-5)


async def test_a_spoken_prompt_is_not_chunked_where_its_rows_would_be_lost():
    """Without ``expected_captures`` no slot keeps its talker's rows: a spoken prompt over
    a step's budget is refused at submit, a text prompt is chunked."""
    from omni_core.errors import RequestError

    model, config = _thinker(capture="spoken")
    prompt = _shared_media(config, seed=5)([5, 6, 7])
    settings = EngineSettings(max_running_requests=2, max_total_tokens=512, max_prefill_tokens=22)
    async with create_engine(model, settings, device="cpu") as engine:
        with pytest.raises(RequestError, match="prefills this request's prompt in one step"):
            engine.enqueue("spoken", prompt, SamplingParams(0.0, max_new_tokens=2))
        text = [
            t async for t in engine.enqueue("text", prompt, SamplingParams(0.0, max_new_tokens=2))
        ]
    assert len(text) == 2
