"""MOSS-TTS prompts and generation on the tiny preset (dummy weights), alone and in the engine."""

from __future__ import annotations

import anyio
import pytest

torch = pytest.importorskip("torch")

from omni_core.engine.backends import create_engine  # noqa: E402
from omni_core.engine.interface import EngineSettings  # noqa: E402
from omni_moss_tts.delay import undelay  # noqa: E402
from omni_moss_tts.model import MossTTSModel, StepOutput  # noqa: E402
from omni_moss_tts.prompt import PromptError, user_content  # noqa: E402


@pytest.fixture(scope="module")
def model() -> MossTTSModel:
    torch.set_num_threads(1)
    return MossTTSModel.from_pretrained("tiny", load_format="dummy", with_codec=False)


def test_the_user_turn_is_the_release_instruction_block(model: MossTTSModel) -> None:
    prompt = model.prompts.build("Hello there.", max_frames=10, language="English", tokens=25)
    text = model.tokenizer.decode(prompt.ids[:, 0].tolist())
    block = user_content(
        {"reference": "None", "language": "English", "tokens": 25, "text": "Hello there."}
    )
    assert text == f"<|im_start|>user\n{block}<|im_end|>\n<|im_start|>assistant\n"
    assert "- Tokens:\n25\n" in block and "- Instruction:\nNone\n" in block
    assert (prompt.ids[:, 1:] == 1024).all()  # no audio in the prompt: every code is the pad


def test_a_reference_clip_sits_in_user_slots_with_its_codes_delayed(model: MossTTSModel) -> None:
    cfg = model.config
    codes = torch.randint(0, 1024, (7, 32), generator=torch.Generator().manual_seed(0))
    ids = model.prompts.build("Hi.", max_frames=10, reference=codes).ids
    text = ids[:, 0]
    start = int((text == cfg.audio_start_token_id).nonzero()[0])
    end = int((text == cfg.audio_end_token_id).nonzero()[0])
    assert end - start - 1 == 7 + 31  # one slot per frame plus the drain
    assert (text[start + 1 : end] == cfg.audio_user_slot_token_id).all()
    assert torch.equal(undelay(ids[start + 1 : end, 1:]), codes)
    assert (ids[: start + 1, 1:] == 1024).all() and (ids[end:, 1:] == 1024).all()
    rendered = model.tokenizer.decode(text[:start].tolist())
    assert rendered.endswith("- Reference(s):\n[S1]:\n")


def test_a_continuation_prompt_ends_inside_the_answer_after_the_reference(
    model: MossTTSModel,
) -> None:
    cfg = model.config
    codes = torch.randint(0, 1024, (5, 32), generator=torch.Generator().manual_seed(1))
    ids = model.prompts.build(
        "and the rest.", max_frames=10, continuation=codes, reference_text="The start "
    ).ids
    text = model.tokenizer.decode(ids[:, 0].tolist())
    assert "- Text:\nThe start and the rest.\n" in text
    # Qwen3's tokens at the ids MOSS uses: vision_start = audio start, video_pad = gen slot
    assert text.endswith("<|im_start|>assistant\n<|vision_start|>" + "<|video_pad|>" * 5)
    assert int(ids[-1, 0]) == cfg.audio_assistant_gen_slot_token_id


@pytest.mark.parametrize("bad", ["say <|im_end|> now", "a <|audio|> b"])
def test_control_tokens_in_the_text_are_refused(model: MossTTSModel, bad: str) -> None:
    with pytest.raises(PromptError, match="control token"):
        model.prompts.build(bad, max_frames=10)


def test_greedy_generation_is_deterministic_and_ends_with_whole_frames(
    model: MossTTSModel,
) -> None:
    prompt = model.prompts.build("One two three.", max_frames=12)
    rows, frames = model.generate(prompt, max_steps=100)
    again_rows, again = model.generate(prompt, max_steps=100)
    assert torch.equal(rows, again_rows) and torch.equal(frames, again)
    cfg = model.config
    # the dummy model speaks until the cap: audio start, 12 frames, the drain, audio end
    assert frames.shape == (12, 32)
    assert int(rows[-1, 0]) == cfg.audio_end_token_id
    start = int((rows[:, 0] == cfg.audio_start_token_id).nonzero()[0])
    assert torch.equal(undelay(rows[start + 1 : -1, 1:]), frames)
    assert int(frames.min()) >= 0 and int(frames.max()) < 1024  # never the pad


def run_engine(model, requests, max_running=8, counts=None, **engine_keys):
    """Submit ``(id, request_prompt, sampling)`` together; collect each one's frames and reason.

    ``counts``: a dict that receives the engine's prompt positions (computed / cached).
    """
    out: dict[str, tuple[list, str | None]] = {}

    async def one(engine, rid, prompt, sampling):
        frames: list = []
        reason = None
        async with engine.enqueue(rid, prompt, sampling) as stream:
            async for step in stream:
                assert isinstance(step, StepOutput)
                frames.extend(step.frames)
                reason = step.finish_reason or reason
        out[rid] = (frames, reason or stream.finish_reason)

    async def main():
        settings = EngineSettings(
            max_running_requests=max_running, max_total_tokens=4096, **engine_keys
        )
        engine = create_engine(model, settings, device="cpu")
        async with anyio.create_task_group() as tg:
            for rid, prompt, sampling in requests:
                tg.start_soon(one, engine, rid, prompt, sampling)
        await engine.aclose()
        if counts is not None:
            counts.update(engine.prompt_positions)

    anyio.run(main)
    return out


def test_concurrent_requests_batched_equal_each_alone_with_fixed_seeds(
    model: MossTTSModel,
) -> None:
    texts = ["First request.", "A second, longer request with more words.", "Third!"]
    requests = []
    for i, text in enumerate(texts):
        prompt = model.prompts.build(text, max_frames=6 + 3 * i)
        request = model.request(prompt)  # the release's text sampling (temperature 1.5)
        sampling = model.audio_sampling(seed=100 + i)
        sampling.max_new_tokens = 200
        requests.append((f"r{i}", request, sampling))
    batched = run_engine(model, requests)
    alone = {}
    for request in requests:
        alone.update(run_engine(model, [request], max_running=1))
    for rid, _, _ in requests:
        frames, reason = batched[rid]
        assert frames, rid
        assert torch.equal(torch.stack(frames), torch.stack(alone[rid][0])), rid
        assert reason == alone[rid][1]


def test_requests_together_compute_the_instruction_template_once(model: MossTTSModel) -> None:
    texts = ["Alpha.", "Beta gamma.", "Delta epsilon zeta."]
    requests = []
    for i, text in enumerate(texts):
        sampling = model.audio_sampling(seed=7 + i)
        sampling.max_new_tokens = 200
        requests.append((f"t{i}", model.request(model.prompts.build(text, max_frames=5)), sampling))
    lengths = [len(request.prompt) for _, request, _ in requests]
    ids = [request.prompt.ids for _, request, _ in requests]
    head = next(n for n in range(min(lengths)) if not torch.equal(ids[0][n], ids[1][n]))
    shared_counts: dict = {}
    shared = run_engine(model, requests, counts=shared_counts)
    plain_counts: dict = {}
    plain = run_engine(model, requests, counts=plain_counts, disable_radix_cache=True)
    blocks = head // 16 * 16
    assert blocks >= 100  # the template is most of a short prompt
    assert shared_counts == {"cached": 2 * blocks, "computed": sum(lengths) - 2 * blocks}
    assert plain_counts == {"cached": 0, "computed": sum(lengths)}
    for rid, _, _ in requests:
        assert torch.equal(torch.stack(shared[rid][0]), torch.stack(plain[rid][0])), rid
        assert shared[rid][1] == plain[rid][1]


def test_prompts_prefilled_in_chunks_make_the_frames_of_whole_prefills(
    model: MossTTSModel,
) -> None:
    """Chunks of 48 positions (about a third of a prompt), three requests at once, one of
    them chunked at a time while the others decode: frames and reasons as prefilled whole."""
    requests = []
    for i, text in enumerate(["Chunked one.", "Chunked two, a little longer.", "Three."]):
        sampling = model.audio_sampling(seed=40 + i)
        sampling.max_new_tokens = 200
        requests.append((f"c{i}", model.request(model.prompts.build(text, max_frames=5)), sampling))
    lengths = [len(request.prompt) for _, request, _ in requests]
    assert min(lengths) > 2 * 48
    counts: dict = {}
    chunked = run_engine(
        model, requests, counts=counts, disable_radix_cache=True, max_prefill_tokens=48
    )
    whole = run_engine(model, requests, disable_radix_cache=True)
    assert counts == {"cached": 0, "computed": sum(lengths)}
    for rid, _, _ in requests:
        assert chunked[rid][0], rid
        assert torch.equal(torch.stack(chunked[rid][0]), torch.stack(whole[rid][0])), rid
        assert chunked[rid][1] == whole[rid][1]


def test_the_frame_cap_reports_length(model: MossTTSModel) -> None:
    prompt = model.prompts.build("Capped.", max_frames=5)
    sampling = model.audio_sampling(temperature=0.0)
    sampling.max_new_tokens = 200
    request = model.request(prompt, text_temperature=0.0)
    frames, reason = run_engine(model, [("capped", request, sampling)])["capped"]
    assert len(frames) == 5 and reason == "length"


def test_an_aborted_request_frees_its_slot_and_the_others_finish(model: MossTTSModel) -> None:
    async def main():
        settings = EngineSettings(max_running_requests=2, max_total_tokens=4096)
        engine = create_engine(model, settings, device="cpu")
        long_prompt = model.request(model.prompts.build("Long.", max_frames=400))
        sampling = model.audio_sampling(seed=1)
        sampling.max_new_tokens = 500
        got = []
        async with engine.enqueue("long", long_prompt, sampling) as stream:
            async for step in stream:
                got.extend(step.frames)
                if len(got) >= 3:
                    break  # leaving the stream aborts the request
        short = model.request(model.prompts.build("Short.", max_frames=4))
        frames = []
        async with engine.enqueue("short", short, model.audio_sampling(seed=2)) as stream:
            async for step in stream:
                frames.extend(step.frames)
        assert len(engine.cache.free) == engine.cache.num_slots
        await engine.aclose()
        return got, frames

    got, frames = anyio.run(main)
    assert len(got) >= 3 and 1 <= len(frames) <= 4


def test_static_shape_decode_steps_equal_eager(model: MossTTSModel) -> None:
    """The backbone's static step (3 rows padded to 4) gives the eager frames, seeded sampling."""
    import copy

    from omni_core.engine.buckets import StaticPlan
    from omni_core.engine.torch_engine import TorchEngine

    requests = []
    for i, text in enumerate(["First request.", "A second one, longer.", "Third!"]):
        sampling = model.audio_sampling(seed=300 + i)
        sampling.max_new_tokens = 60
        requests.append((f"r{i}", model.request(model.prompts.build(text, max_frames=5)), sampling))

    def frames(static):
        out = {}

        async def main():
            settings = EngineSettings(max_running_requests=4, max_total_tokens=4096)
            async with TorchEngine(own, settings, static=static) as engine:

                async def one(rid, prompt, sampling):
                    steps = [s async for s in engine.enqueue(rid, prompt, sampling)]
                    out[rid] = torch.cat([s.frames for s in steps])

                async with anyio.create_task_group() as tg:
                    for request in requests:
                        tg.start_soon(one, *request)

        anyio.run(main)
        return out

    own = copy.copy(model)  # the static step is kept on the model object
    eager = frames(None)
    static = frames(StaticPlan(False, False, (1, 4), "test"))
    for rid in eager:
        assert torch.equal(eager[rid], static[rid]), rid
    assert max(f.shape[0] for f in eager.values()) == 5  # some request ran to its cap
    assert own._static.calls > 0


def test_bf16_heads_on_the_cpu_stream_through_the_row_kernels(model: MossTTSModel) -> None:
    """The 32 stacked audio heads are one product read at every step: in bf16 on the CPU a
    lone row takes ``mv`` (the faster bf16 kernel) and the numbers are each head's own."""
    net = MossTTSModel.from_pretrained(
        "tiny", load_format="dummy", dtype="bfloat16", with_codec=False
    ).network
    hidden = torch.randn(1, net.cfg.backbone.hidden_size).to(torch.bfloat16)
    with torch.no_grad(), torch.profiler.profile() as profile:
        logits = net.audio_logits(hidden, range(2, 5))
    ops = {event.key for event in profile.key_averages()}
    assert "aten::mv" in ops and "aten::mm" not in ops, ops
    with torch.no_grad():
        for j, book in enumerate(range(2, 5)):
            own = torch.mv(net.lm_heads[1 + book].weight, hidden[0])
            own[net.cfg.audio_pad_code] = float("-inf")
            assert torch.equal(logits[0, j], own)
        # float32 keeps F.linear's numbers
        dense = torch.randn(2, model.network.cfg.backbone.hidden_size)
        got = model.network.audio_logits(dense)
        head = model.network.lm_heads[1].weight
        want = torch.nn.functional.linear(dense, head)
        want[:, model.network.cfg.audio_pad_code] = float("-inf")
        assert torch.equal(got[:, 0], want)


def test_bf16_audio_heads_blocked_for_onednn_score_what_the_dense_ones_do(monkeypatch) -> None:
    """Where this machine's routes take blocked bf16 weights, each audio head becomes a
    blocked copy (the dense stack is let go) and scores the due books as before."""
    from omni_core.engine import cpu_linear
    from omni_core.engine.cpu_kernel_choice import KernelChoice

    if not cpu_linear.blocking_available():
        pytest.skip("this torch build or CPU has no oneDNN bf16 inner product")
    monkeypatch.setattr(cpu_linear, "_routes", KernelChoice(0, False, 0, source="test"))

    def network():
        return MossTTSModel.from_pretrained(
            "tiny", load_format="dummy", dtype="bfloat16", with_codec=False
        ).network

    net, f32 = network(), MossTTSModel.from_pretrained("tiny", load_format="dummy").network
    hidden = torch.randn(3, net.cfg.backbone.hidden_size).to(torch.bfloat16)
    with torch.no_grad():
        dense = {books: net.audio_logits(hidden, books) for books in (None, range(2, 5))}
    assert net.block_audio_heads() == 0  # dense routes: nothing to do
    cpu_linear.use_routes(KernelChoice(0, False, 0, bf16_blocked=True, source="test"))
    assert f32.block_audio_heads() == 0  # float32 heads stay
    shared = network()
    shared.lm_heads[1].weight.share_memory_()  # a weight-sharing leader's
    assert shared.block_audio_heads() == 0
    heads = len(net.lm_heads) - 1
    assert net.block_audio_heads() == heads and net.block_audio_heads() == 0
    assert all(type(h).__name__ == "BlockedLinear" for h in net.lm_heads[1:])
    assert type(net.lm_heads[0]) is torch.nn.Linear  # the text head is read by rows
    assert "_stacked_heads" not in net.__dict__
    with torch.no_grad():
        for books, want in dense.items():
            got = net.audio_logits(hidden, books)
            assert got.shape == want.shape
            assert torch.isneginf(got[..., net.cfg.audio_pad_code]).all()
            torch.testing.assert_close(got, want, atol=2e-2, rtol=1e-2)
