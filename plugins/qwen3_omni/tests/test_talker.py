"""The talker: config, module tree, MoE with a gated shared expert, input rules, engine steps.

Runs on the tiny preset's talker with seeded dummy weights. Parity with the
release's own talker is in ``test_talker_reference.py`` (opt-in).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import anyio  # noqa: E402
from torch import nn  # noqa: E402

import omni_qwen3_omni  # noqa: E402
from omni_core.engine.interface import (  # noqa: E402
    EngineSettings,
    SamplingParams,
    Sequence,
    SequenceError,
)
from omni_core.engine.kv_cache import SlotKVCache  # noqa: E402
from omni_core.engine.torch_engine import TorchEngine  # noqa: E402
from omni_core.errors import RequestError  # noqa: E402
from omni_qwen3_omni.config import ConfigError, ThinkerConfig  # noqa: E402
from omni_qwen3_omni.talker.config import TalkerConfig  # noqa: E402
from omni_qwen3_omni.talker.model import SharedExpertMoE, Talker  # noqa: E402
from omni_qwen3_omni.talker.prompt import PREFILL_ROWS, TalkerPrompt  # noqa: E402
from omni_qwen3_omni.talker.step import TalkerStepModel  # noqa: E402
from omni_qwen3_omni.thinker.moe import SparseMoE  # noqa: E402
from omni_qwen3_omni.thinker.positions import MediaTokens, prompt_positions  # noqa: E402
from omni_qwen3_tts.weights import dummy_fill  # noqa: E402

RAW = json.loads(
    (Path(omni_qwen3_omni.__file__).parent / "presets" / "tiny" / "config.json").read_text()
)
CFG = TalkerConfig.from_dict(RAW)
MEDIA = MediaTokens.from_config(ThinkerConfig.from_dict(RAW))
IM_START, IM_END, NL = 151644, 151645, 198
SYSTEM, USER, ASSISTANT = 8948, 872, 77091
WIDTH = CFG.thinker_hidden_size
GREEDY = SamplingParams(temperature=0.0, repetition_penalty=1.05)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices: one thread is several times faster than two on shared cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def talker() -> Talker:
    torch.manual_seed(0)
    module = Talker(CFG).eval().requires_grad_(False)
    dummy_fill(module, 3)
    return module


def turn(role: int, body: list[int]) -> list[int]:
    return [IM_START, role, NL, *body, IM_END, NL]


class Feed:
    """A synthetic thinker output: chat prompt ids, its rows, positions and generated rows."""

    def __init__(self, seed: int, *, media: bool = False, generated: int = 6):
        gen = torch.Generator().manual_seed(seed)

        def words(n: int) -> list[int]:
            return torch.randint(1000, 5000, (n,), generator=gen).tolist()

        body = words(3)
        grids = []
        if media:
            body = [MEDIA.vision_start, *[MEDIA.image] * 4, 151653]
            body += [MEDIA.audio_start, *[MEDIA.audio] * 3, 151670, *words(2)]
            grids = [(1, 4, 4)]
        self.user_turns = [turn(USER, body), turn(USER, words(2))]
        self.ids = (
            turn(SYSTEM, words(4))
            + self.user_turns[0]
            + turn(ASSISTANT, words(3))
            + self.user_turns[1]
            + [IM_START, ASSISTANT, NL]
        )
        self.grids = grids
        self.positions = prompt_positions(self.ids, MEDIA, image_grids=grids).positions
        length = len(self.ids)
        self.embeds = torch.randn(length, WIDTH, generator=gen)
        self.accept = torch.randn(length, WIDTH, generator=gen)
        self.tts = torch.randn(3, WIDTH, generator=gen)
        self.tokens = words(generated)
        self.token_rows = torch.randn(generated, WIDTH, generator=gen)

    def prompt(self, speaker: str = "ethan", tokens: int | None = None, finish: bool = True):
        p = TalkerPrompt(CFG, speaker)
        p.add_prompt(
            self.ids, self.embeds, self.accept, tts_embeddings=self.tts, positions=self.positions
        )
        n = len(self.tokens) if tokens is None else tokens
        if n:
            p.add_tokens(self.tokens[:n], self.token_rows[:n])
        if finish:
            p.finish()
        return p


def run(model: TalkerStepModel, prompts, sampling, steps: int, slots: int = 4):
    """Prefill all prompts together, then decode them together; frames per prompt."""
    cache = SlotKVCache(model.cache_layout(), slots, 128)
    seqs = []
    for i, prompt in enumerate(prompts):
        params = sampling[i] if isinstance(sampling, list) else sampling
        seq = Sequence(f"r{i}", prompt, params)
        seq.slot = cache.allocate()
        seqs.append(seq)
    out = [[r.output] for r in model.prefill(seqs, cache)]
    for _ in range(steps - 1):
        live = [i for i, s in enumerate(seqs) if out[i][-1] is not None]
        if not live:
            break
        for i, r in zip(live, model.decode([seqs[i] for i in live], cache), strict=True):
            out[i].append(r.output)
    return out


def same(a: list, b: list) -> bool:
    """Two frame lists are equal (an EOS step's output is None)."""
    return len(a) == len(b) and all(
        (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))
        for x, y in zip(a, b, strict=True)
    )


# -- config ------------------------------------------------------------------------------


def test_config_reads_the_preset():
    assert CFG.text.hidden_size == CFG.code_predictor.hidden_size == 32
    assert CFG.num_code_groups == CFG.code_predictor.num_code_groups == 16
    assert CFG.text.mrope_section == (2, 1, 1) and CFG.text.head_dim == 8
    assert CFG.text.shared_expert_intermediate_size == 32
    assert CFG.accept_hidden_layer == 1 and CFG.thinker_hidden_size == 32
    assert CFG.speaker_id == {"chelsie": 317, "ethan": 318, "aiden": 319}
    assert CFG.tts_special_ids == (151672, 151673, 151671)
    assert CFG.audio_token_id == 151675  # the thinker's, not the constructor default
    assert CFG.suppressed_range == (64, 1088)


def test_config_accepts_both_spellings():
    raw = copy.deepcopy(RAW)
    text = raw["talker_config"]["text_config"]
    rope = text.pop("rope_scaling")
    text["rope_parameters"] = {**rope, "rope_theta": text.pop("rope_theta")}
    text["num_local_experts"] = text.pop("num_experts")
    assert TalkerConfig.from_dict(raw) == CFG


def _broken(path: str, value):
    raw = copy.deepcopy(RAW)
    *parents, key = path.split(".")
    node = raw
    for name in parents:
        node = node[name]
    if value is None:
        node.pop(key)
    else:
        node[key] = value
    return raw


@pytest.mark.parametrize(
    "path, value, match",
    [
        ("talker_config.code_predictor_config.hidden_size", 48, "hidden_size"),
        ("talker_config.code_predictor_config.num_code_groups", 8, "num_code_groups"),
        ("talker_config.code_predictor_config.vocab_size", 128, "vocab_size"),
        ("talker_config.text_config.shared_expert_intermediate_size", None, "shared_expert"),
        ("talker_config.text_config.num_experts_per_tok", 9, "num_experts_per_tok"),
        ("talker_config.text_config.head_dim", 16, "mrope_section"),
        ("talker_config.thinker_hidden_size", 48, "thinker_hidden_size"),
        ("talker_config.accept_hidden_layer", 5, "accept_hidden_layer"),
        ("talker_config.codec_eos_token_id", 5000, "codec_eos_token_id"),
        ("talker_config.speaker_id", {}, "speaker"),
        ("talker_config.code_predictor_config.layer_types", ["sliding_attention"] * 2, "sliding"),
    ],
)
def test_config_refuses_what_the_code_cannot_run(path, value, match):
    with pytest.raises(ConfigError, match=match):
        TalkerConfig.from_dict(_broken(path, value))


def test_speakers_by_name_in_any_case_or_by_id():
    assert CFG.speaker("Ethan") == CFG.speaker("ETHAN") == 318
    assert CFG.speaker(317) == 317
    with pytest.raises(RequestError, match="aiden, chelsie, ethan"):
        CFG.speaker("nobody")
    with pytest.raises(RequestError):
        CFG.speaker(12)


# -- module tree and MoE -------------------------------------------------------------------


def test_state_dict_names_follow_the_release(talker):
    keys = set(talker.state_dict())
    layer = "model.layers.1."
    for name in [
        "self_attn.q_proj.weight",
        "self_attn.k_norm.weight",
        "self_attn.o_proj.weight",
        "mlp.gate.weight",
        "mlp.experts.7.down_proj.weight",
        "mlp.shared_expert.gate_proj.weight",
        "mlp.shared_expert.up_proj.weight",
        "mlp.shared_expert.down_proj.weight",
        "mlp.shared_expert_gate.weight",
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
    ]:
        assert layer + name in keys
    for name in [
        "model.norm.weight",
        "model.codec_embedding.weight",
        "codec_head.weight",
        "text_projection.linear_fc1.bias",
        "hidden_projection.linear_fc2.weight",
        "code_predictor.model.layers.1.mlp.down_proj.weight",
        "code_predictor.model.norm.weight",
        "code_predictor.model.codec_embedding.14.weight",
        "code_predictor.lm_head.14.weight",
    ]:
        assert name in keys
    assert "code_predictor.model.codec_embedding.15.weight" not in keys
    prefixes = (
        "model.",
        "text_projection.",
        "hidden_projection.",
        "codec_head.",
        "code_predictor.",
    )
    assert all(k.startswith(prefixes) for k in keys)
    assert not any("small_to_mtp" in k for k in keys)
    state = talker.state_dict()
    assert state["text_projection.linear_fc1.weight"].shape == (64, 32)  # thinker -> intermediate
    assert state["model.layers.0.mlp.shared_expert_gate.weight"].shape == (1, 32)


def test_shared_expert_is_gated_and_added_to_the_routed_mixture():
    torch.manual_seed(1)
    moe = SharedExpertMoE(CFG.text).eval()
    dummy_fill(moe, 5)
    x = torch.randn(2, 5, CFG.text.hidden_size)
    with torch.no_grad():
        routed = SparseMoE.forward(moe, x)
        shared = moe.shared_expert(x)
        gate = torch.sigmoid(x @ moe.shared_expert_gate.weight.t())
        torch.testing.assert_close(moe(x), routed + gate * shared)
        moe.shared_expert_gate.weight.fill_(0.0)  # gate 1/2
        torch.testing.assert_close(moe(x), routed + 0.5 * shared)
        moe.shared_expert_gate.weight.copy_(-1e4 * x[0, 0] / x[0, 0].norm())
        torch.testing.assert_close(moe(x[:, :1])[0], routed[:, :1][0], atol=1e-6, rtol=0)


def test_routing_keeps_raw_top_k_weights_without_renormalisation():
    import dataclasses

    cfg = dataclasses.replace(CFG.text, norm_topk_prob=False)
    moe = SharedExpertMoE(cfg).eval()
    dummy_fill(moe, 6)
    x = torch.randn(3, cfg.hidden_size)
    with torch.no_grad():
        weights, experts = moe.route(x)
        probs = torch.softmax(x @ moe.gate.weight.t(), dim=-1)
        torch.testing.assert_close(weights, probs.topk(cfg.num_experts_per_tok).values)
        expected = []
        for t in range(3):
            row = sum(
                w * moe.experts[int(e)](x[t]) for w, e in zip(weights[t], experts[t], strict=True)
            )
            gate = torch.sigmoid(moe.shared_expert_gate(x[t]))
            expected.append(row + gate * moe.shared_expert(x[t]))
        torch.testing.assert_close(moe(x), torch.stack(expected), atol=1e-5, rtol=1e-5)


def test_frame_embedding_sums_all_code_groups(talker):
    codes = torch.randint(0, 64, (2, CFG.num_code_groups))
    tables = talker.code_predictor.model.codec_embedding
    expected = talker.model.codec_embedding(codes[:, 0])
    for g in range(1, CFG.num_code_groups):
        expected = expected + tables[g - 1](codes[:, g])
    torch.testing.assert_close(talker.embed_frame(codes), expected, atol=1e-5, rtol=1e-5)


# -- the prompt builder --------------------------------------------------------------------


def test_prefill_layout_follows_the_release(talker):
    feed = Feed(1, media=True)
    prompt = feed.prompt("chelsie", tokens=3, finish=False)
    x, positions = prompt.prefill_inputs(talker, torch.device("cpu"), torch.float32)
    # Kept: the two user turns (system and the earlier answer dropped), then 9 rows.
    starts = [i for i, t in enumerate(feed.ids) if t == IM_START]
    user = [*range(starts[1], starts[2]), *range(starts[3], starts[4])]
    assert x.shape == (len(user) + 9, CFG.text.hidden_size) == (prompt.prefill_length, 32)
    media = {MEDIA.image, MEDIA.audio}
    with torch.no_grad():
        for row, i in enumerate(user):
            if feed.ids[i] in media:
                expected = talker.hidden_projection(feed.accept[i])
            else:
                expected = talker.text_projection(feed.embeds[i])
            torch.testing.assert_close(x[row], expected)
        a = [feed.embeds[starts[4]], feed.embeds[starts[4] + 1], feed.embeds[starts[4] + 2]]
        bos, _, pad = feed.tts
        text = talker.text_projection(
            torch.stack([*a, pad, pad, pad, pad, bos, feed.token_rows[0]])
        )
        codec = talker.embed_codec(torch.tensor([171, 172, 173, 317, 164, 165]))
        expected = torch.cat([text[:3], text[3:] + codec])
        torch.testing.assert_close(x[len(user) :], expected)
    # Positions: the release's rule applied to the talker's own token sequence.
    talker_ids = [feed.ids[i] for i in user] + [CFG.tts_pad_token_id] * 9
    reference = prompt_positions(talker_ids, MEDIA, image_grids=feed.grids)
    assert torch.equal(positions, reference.positions)
    assert prompt.next_position == reference.next_position


def test_prefill_waits_for_the_first_generated_row():
    feed = Feed(2)
    prompt = TalkerPrompt(CFG, "aiden")
    assert not prompt.prefill_ready
    prompt.add_prompt(feed.ids, feed.embeds, feed.accept, tts_embeddings=feed.tts)
    length = prompt.prefill_length
    assert not prompt.prefill_ready and not prompt.text_available(0)
    prompt.add_token(feed.tokens[0], feed.token_rows[0])
    assert prompt.prefill_ready and not prompt.speechless
    assert prompt.prefill_length == length
    assert PREFILL_ROWS == 4  # <|im_start|>, assistant, newline, first token


def test_text_rows_come_one_per_step_then_tts_eos_then_tts_pad():
    feed = Feed(3, generated=4)
    prompt = feed.prompt(tokens=2, finish=False)
    assert prompt.text_available(0) and not prompt.text_available(1)
    assert torch.equal(prompt.text_row(0), feed.token_rows[1])
    with pytest.raises(ValueError, match="not sent"):
        prompt.text_row(1)
    prompt.add_tokens(feed.tokens[2:], feed.token_rows[2:])
    assert prompt.text_available(2) and not prompt.text_available(3)
    assert torch.equal(prompt.text_row(2), feed.token_rows[3])
    prompt.finish()
    assert all(prompt.text_available(k) for k in range(10))
    assert torch.equal(prompt.text_row(3), feed.tts[1])  # tts_eos once
    assert all(torch.equal(prompt.text_row(k), feed.tts[2]) for k in (4, 5, 50))  # then tts_pad
    assert prompt.token_ids == feed.tokens


def test_a_thinker_that_ends_at_once_leaves_nothing_to_say(talker):
    feed = Feed(4)
    prompt = feed.prompt(tokens=0, finish=True)
    assert prompt.prefill_ready and prompt.speechless
    model = TalkerStepModel(talker, CFG, device="cpu", dtype=torch.float32)
    spoken = feed.prompt(tokens=1, finish=True)
    assert not spoken.speechless
    out = run(model, [prompt, spoken], GREEDY, steps=3)
    assert out[0] == [None]
    assert len(out[1]) == 3 and out[1][0].shape == (16,)


@pytest.mark.parametrize(
    "ids, match",
    [
        ([1, 2, 3], "no <\\|im_start\\|>"),
        (turn(USER, [5, 6]), "open assistant turn"),
        ([*turn(9999, [5]), IM_START, ASSISTANT, NL], "not a system, user or assistant"),
        (
            [*turn(USER, [MEDIA.vision_start, MEDIA.image, 151653]), IM_START, ASSISTANT, NL],
            "thinker positions",
        ),
    ],
)
def test_prompts_the_talker_cannot_read_are_refused(ids, match):
    rows = torch.zeros(len(ids), WIDTH)
    with pytest.raises(ValueError, match=match):
        TalkerPrompt(CFG).add_prompt(ids, rows, rows, tts_embeddings=torch.zeros(3, WIDTH))


def test_feeding_out_of_order_or_with_wrong_widths_is_refused():
    feed = Feed(5)
    prompt = TalkerPrompt(CFG)
    with pytest.raises(ValueError, match="add_prompt comes before"):
        prompt.add_token(1, feed.token_rows[0])
    with pytest.raises(ValueError, match="must be"):
        prompt.add_prompt(feed.ids, feed.embeds[:, :8], None, tts_embeddings=feed.tts)
    prompt.add_prompt(feed.ids, feed.embeds, None, tts_embeddings=feed.tts)
    with pytest.raises(ValueError, match="already"):
        prompt.add_prompt(feed.ids, feed.embeds, None, tts_embeddings=feed.tts)
    with pytest.raises(ValueError, match="thinker width"):
        prompt.add_token(1, torch.zeros(WIDTH + 1))
    prompt.finish()
    with pytest.raises(ValueError, match="finished"):
        prompt.add_token(1, feed.token_rows[0])
    with pytest.raises(RequestError, match="unknown speaker"):
        TalkerPrompt(CFG, "nobody")


def test_media_rows_need_the_accept_layer():
    feed = Feed(6, media=True)
    with pytest.raises(ValueError, match="accept_hidden"):
        TalkerPrompt(CFG).add_prompt(
            feed.ids, feed.embeds, None, tts_embeddings=feed.tts, positions=feed.positions
        )


# -- engine steps --------------------------------------------------------------------------


class FixedLogits(nn.Module):
    """A codec head that ignores its input: the same logits every step."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.register_buffer("logits", logits)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(hidden.shape[0], -1).clone()


def _with_head(talker: Talker, logits: torch.Tensor) -> Talker:
    patched = copy.copy(talker)
    patched._modules = dict(talker._modules)
    patched._modules["codec_head"] = FixedLogits(logits)
    return patched


def test_each_step_outputs_one_frame_of_every_code_group(talker):
    model = TalkerStepModel(talker, CFG, device="cpu", dtype=torch.float32)
    out = run(model, [Feed(7).prompt()], GREEDY, steps=6)[0]
    assert len(out) == 6
    for frame in out:
        assert frame.dtype == torch.int64 and frame.shape == (CFG.num_code_groups,)
        assert frame.device.type == "cpu"
        assert int(frame.min()) >= 0 and int(frame.max()) < 64  # codebook ids only


def test_codec_eos_ends_the_request_without_a_frame(talker):
    logits = torch.zeros(CFG.text.vocab_size)
    logits[CFG.codec_eos_token_id] = 5.0
    model = TalkerStepModel(_with_head(talker, logits), CFG, device="cpu", dtype=torch.float32)
    cache = SlotKVCache(model.cache_layout(), 1, 64)
    seq = Sequence("a", Feed(8).prompt(), GREEDY)
    seq.slot = cache.allocate()
    (result,) = model.prefill([seq], cache)
    assert result.output is None and result.finished


def test_control_ids_are_never_picked_and_repetition_is_penalised(talker):
    logits = torch.zeros(CFG.text.vocab_size)
    logits[CFG.codec_pad_id] = 9.0  # a control id: suppressed
    logits[CFG.speaker("ethan")] = 8.0  # a speaker id: suppressed
    logits[5], logits[7] = 2.0, 1.95
    model = TalkerStepModel(_with_head(talker, logits), CFG, device="cpu", dtype=torch.float32)
    firsts = [f[0].item() for f in run(model, [Feed(9).prompt()], GREEDY, steps=4)[0]]
    # 2/1.05 < 1.95 once 5 was used; once both were, each counts once: 5 again.
    assert firsts == [5, 7, 5, 5]
    plain = SamplingParams(temperature=0.0)
    assert [f[0].item() for f in run(model, [Feed(9).prompt()], plain, steps=3)[0]] == [5, 5, 5]


@pytest.mark.parametrize(
    "sampling",
    [GREEDY, SamplingParams(temperature=0.9, top_k=50, repetition_penalty=1.05, seed=1)],
    ids=["greedy", "seeded"],
)
def test_a_batch_of_two_equals_each_alone(talker, sampling):
    model = TalkerStepModel(talker, CFG, device="cpu", dtype=torch.float32)
    feeds = [(Feed(10, media=True), "chelsie"), (Feed(11, generated=3), "aiden")]
    alone = [run(model, [f.prompt(s)], sampling, steps=8)[0] for f, s in feeds]
    together = run(model, [f.prompt(s) for f, s in feeds], sampling, steps=8)
    for a, b in zip(alone, together, strict=True):
        assert len(a) >= 3 and same(a, b)
    assert not torch.equal(together[0][0], together[1][0])


def test_decoding_waits_for_the_thinker_and_equals_the_whole_text_at_once(talker):
    model = TalkerStepModel(talker, CFG, device="cpu", dtype=torch.float32)
    feed = Feed(12, generated=5)
    whole = run(model, [feed.prompt()], GREEDY, steps=10)[0]

    prompt = feed.prompt(tokens=0, finish=False)
    cache = SlotKVCache(model.cache_layout(), 1, 64)
    seq = Sequence("a", prompt, GREEDY)
    seq.slot = cache.allocate()
    assert not model.ready(seq)
    with pytest.raises(SequenceError) as failed:
        model.prefill([seq], cache)
    assert failed.value.request_ids == ["a"]
    prompt.add_token(feed.tokens[0], feed.token_rows[0])
    assert model.ready(seq)
    streamed = [model.prefill([seq], cache)[0].output]
    given = 1
    while len(streamed) < len(whole):
        if not model.ready(seq):
            with pytest.raises(SequenceError):
                model.decode([seq], cache)
            if given < len(feed.tokens):
                prompt.add_token(feed.tokens[given], feed.token_rows[given])
                given += 1
            else:
                prompt.finish()
            continue
        streamed.append(model.decode([seq], cache)[0].output)
    assert len(whole) >= 8 and same(whole, streamed)  # past tts_eos into tts_pad


@pytest.mark.anyio
async def test_the_engine_runs_streamed_prompts_as_their_rows_arrive(talker):
    model = TalkerStepModel(talker, CFG, device="cpu", dtype=torch.float32)
    feeds = [(Feed(13, generated=4), "ethan"), (Feed(14, media=True, generated=6), "chelsie")]
    params = SamplingParams(temperature=0.0, repetition_penalty=1.05, max_new_tokens=9)
    expected = [run(model, [f.prompt(s)], params, steps=9)[0] for f, s in feeds]
    settings = EngineSettings(max_running_requests=2, max_total_tokens=256, device="cpu")
    prompts = [f.prompt(s, tokens=1, finish=False) for f, s in feeds]
    with anyio.fail_after(30):
        async with TorchEngine(model, settings) as engine:
            streams = [engine.enqueue(f"r{i}", p, params) for i, p in enumerate(prompts)]

            async def feed_slowly() -> None:
                for (feed, _), prompt in zip(feeds, prompts, strict=True):
                    for k in range(1, len(feed.tokens)):
                        await anyio.sleep(0.01)
                        prompt.add_token(feed.tokens[k], feed.token_rows[k])
                        engine.wake()
                    prompt.finish()
                    engine.wake()

            got: list[list] = [[], []]

            async def collect(i: int) -> None:
                async for frame in streams[i]:
                    got[i].append(frame)

            async with anyio.create_task_group() as tg:
                tg.start_soon(feed_slowly)
                tg.start_soon(collect, 0)
                tg.start_soon(collect, 1)
    for want, have in zip(expected, got, strict=True):
        assert len(want) == 9 and same(want, have)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _engine_frames(model, prompts, sampling, static=None, *, frames=8, counts=None, **keys):
    """Each prompt's frames through the engine, all submitted at once (``static``: a static
    plan to run under; ``keys``: more engine settings; ``counts``: a dict that receives
    the engine's ``prefill_chunks``)."""

    async def main():
        settings = EngineSettings(max_running_requests=4, max_total_tokens=512, **keys)
        out = {}
        async with TorchEngine(model, settings, static=static) as engine:

            async def one(i, prompt):
                params = copy.copy(sampling)
                params.max_new_tokens = frames
                out[i] = [f async for f in engine.enqueue(f"r{i}", prompt, params)]

            async with anyio.create_task_group() as group:
                for i, prompt in enumerate(prompts):
                    group.start_soon(one, i, prompt)
            if counts is not None:
                counts["prefill_chunks"] = engine.prefill_chunks
        return [out[i] for i in range(len(prompts))]

    return anyio.run(main)


@pytest.mark.parametrize(
    "sampling",
    [GREEDY, SamplingParams(temperature=0.9, top_k=50, repetition_penalty=1.05, seed=1)],
    ids=["greedy", "seeded"],
)
def test_static_shape_decode_steps_equal_eager(talker, sampling):
    """Talker and code predictor through the static step (3 rows padded to 4) = eager frames."""
    from omni_core.engine.buckets import StaticPlan

    feeds = [Feed(20, media=True), Feed(21, generated=3), Feed(22)]
    eager_model = TalkerStepModel(talker, CFG, device="cpu", dtype=torch.float32)
    eager = _engine_frames(eager_model, [f.prompt() for f in feeds], sampling)
    own = copy.deepcopy(talker)  # the code predictor keeps its static step on the module
    model = TalkerStepModel(own, CFG, device="cpu", dtype=torch.float32)
    plan = StaticPlan(False, False, (1, 4), "test")
    static = _engine_frames(model, [f.prompt() for f in feeds], sampling, plan)
    for a, b in zip(eager, static, strict=True):
        assert len(a) >= 3 and same(a, b)
    assert model._static.calls > 0 and own.code_predictor.static.calls > 0
    assert not model._static.use_graphs  # captured on CUDA only (fused grouped kernel)


@pytest.mark.slow  # inductor compiles the talker's and the predictor's steps and frames
@pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.*:DeprecationWarning")
def test_compiled_decode_steps_equal_eager(talker):
    """engine.enable_torch_compile on the CPU: the talker's step and the code predictor's
    whole frame (one compiled graph a bucket, the predictor's usual settings) = eager."""
    from omni_core.engine.buckets import StaticPlan

    sampling = SamplingParams(temperature=0.9, top_k=50, repetition_penalty=1.05, seed=1)
    feeds = [Feed(20, media=True), Feed(21, generated=3), Feed(22)]
    eager_model = TalkerStepModel(talker, CFG, device="cpu", dtype=torch.float32)
    eager = _engine_frames(eager_model, [f.prompt() for f in feeds], sampling)
    own = copy.deepcopy(talker)
    model = TalkerStepModel(own, CFG, device="cpu", dtype=torch.float32)
    plan = StaticPlan(True, False, (1, 4), "test")
    compiled = _engine_frames(model, [f.prompt() for f in feeds], sampling, plan)
    for a, b in zip(eager, compiled, strict=True):
        assert len(a) >= 3 and same(a, b)
    frames = set(own.code_predictor.frame_graphs.values())
    assert model._static.calls > 0 and len(frames) == 1 and frames.pop().calls > 0


def test_a_video_interleaved_with_its_track_is_text_to_the_talker():
    """The release does not tell its talker about use_audio_in_video, so the talker's position
    rule counts such a block token by token; a later image keeps its own layout."""
    from omni_qwen3_omni.talker.prompt import _flatten_audio_in_video

    cfg = CFG
    v, a, im = cfg.video_token_id, cfg.audio_token_id, cfg.image_token_id
    ids = [1, 2, v, v, a, v, v, a, 3, 4, im, im, 5]
    thinker = torch.tensor(
        [
            [0, 1, 2, 2, 2, 28, 28, 3, 29, 30, 31, 31, 33],  # temporal
            [0, 1, 2, 3, 2, 2, 3, 3, 29, 30, 31, 31, 33],  # height
            [0, 1, 2, 3, 2, 2, 3, 3, 29, 30, 31, 32, 33],  # width
        ]
    )
    got = _flatten_audio_in_video(thinker, ids, cfg)
    assert got[:, :8].tolist() == [list(range(8))] * 3  # the block counts on from the text
    # after the block: text resumes one past it, the image keeps its (t, h, w) layout
    assert got[:, 8:].tolist() == [
        [8, 9, 10, 10, 12],
        [8, 9, 10, 10, 12],
        [8, 9, 10, 11, 12],
    ]
    plain = [1, 2, v, v, 3]  # a video without its track: the thinker's layout, unchanged
    positions = torch.tensor([[0, 1, 2, 2, 4], [0, 1, 2, 3, 4], [0, 1, 2, 3, 4]])
    assert torch.equal(_flatten_audio_in_video(positions, plain, cfg), positions)


@pytest.mark.parametrize("pack", [True, False])
def test_the_talker_stage_routes_its_cpu_weights_as_the_thinkers(monkeypatch, pack):
    """``create_talker`` on the CPU packs the decoder and the code predictor as the thinker
    stage does (``pack_decoder_weights``; no layer of the tiny preset reaches the size
    threshold, so it is lowered here); ``pack_weights=False`` keeps plain layers."""
    import anyio

    from omni_core.engine import cpu_linear
    from omni_qwen3_omni.stages import create_talker

    monkeypatch.setattr(cpu_linear, "DEFAULT_MIN_ELEMENTS", 1)
    monkeypatch.setattr(cpu_linear, "ROW_MIN_ELEMENTS", 1)
    monkeypatch.setattr(cpu_linear, "_routes", cpu_linear.routes())  # restored after
    from omni_qwen3_omni.loading import load_part

    # a seed of its own: parts are cached per process and packing changes one in place
    seed = 101 if pack else 102
    stage = create_talker(
        "tiny", load_format="dummy", dtype="bfloat16", seed=seed, pack_weights=pack
    )
    try:
        talker = stage.engine.model.talker
        routed = (cpu_linear.RowLinear, cpu_linear.BlockedLinear, cpu_linear.BlockedRows)
        layers = {
            name: type(module)
            for name, module in talker.named_modules()
            if name.endswith(("self_attn.q_proj", "shared_expert.down_proj", "mlp.down_proj"))
        }
        decoder = [n for n in layers if n.startswith("model.")]
        predictor = [n for n in layers if n.startswith("code_predictor.")]
        assert decoder and predictor, sorted(layers)
        if pack:
            assert all(issubclass(kind, routed) for kind in layers.values()), layers
        else:
            assert all(kind is torch.nn.Linear for kind in layers.values()), layers
    finally:
        anyio.run(stage.aclose)
        load_part.cache_clear()  # no packed part left for other tests


def _turns(feed: Feed) -> tuple[TalkerPrompt, TalkerPrompt]:
    """A voice conversation's two talker prompts: turn 1 (system, user 1, the generation
    prompt) and turn 2 (``feed``'s whole chat). Turn 2 starts with turn 1's user segment,
    with the same rows: what the thinker hands over for a conversation's earlier turn."""
    system = len(turn(SYSTEM, [0] * 4))
    head = system + len(feed.user_turns[0])
    keep = [*range(head), *range(len(feed.ids) - 3, len(feed.ids))]
    ids = [feed.ids[i] for i in keep]
    first = TalkerPrompt(CFG, "ethan")
    first.add_prompt(
        ids,
        feed.embeds[keep],
        feed.accept[keep],
        tts_embeddings=feed.tts,
        positions=prompt_positions(ids, MEDIA, image_grids=feed.grids).positions,
    )
    first.add_tokens(feed.tokens[:3], feed.token_rows[:3])
    first.finish()
    return first, feed.prompt()


def _conversation(model: TalkerStepModel, prompts, radix: bool):
    async def main():
        settings = EngineSettings(
            max_running_requests=2, max_total_tokens=256, disable_radix_cache=not radix
        )
        out = []
        async with TorchEngine(model, settings) as engine:
            for i, prompt in enumerate(prompts):
                params = copy.copy(GREEDY)
                params.max_new_tokens = 6
                out.append([f async for f in engine.enqueue(f"turn{i}", prompt, params)])
            return out, dict(engine.prompt_positions)

    return anyio.run(main)


def test_a_voice_conversations_next_turn_copies_the_earlier_user_turn(talker):
    """The talker's prompt leaves earlier answers out, so turn 2 starts with turn 1's user
    segment (an image and audio in it): its first block comes from turn 1's slot, and
    the frames are those of a prefill computed whole."""
    feed = Feed(30, media=True)
    model = TalkerStepModel(talker, CFG, device="cpu", dtype=torch.float32)
    first, second = _turns(feed)
    assert second.prefix_rows()[:16].equal(first.prefix_rows()[:16])
    widths: list[int] = []  # positions each talker pass computes
    hook = talker.register_forward_hook(lambda _m, args, _o: widths.append(args[0].shape[1]))
    try:
        shared, counts = _conversation(model, _turns(feed), radix=True)
    finally:
        hook.remove()
    whole, plain = _conversation(model, _turns(feed), radix=False)
    assert counts["cached"] == 16 and plain["cached"] == 0
    prefills = [w for w in widths if w > 1]
    assert prefills == [first.prefill_length, second.prefill_length - 16]
    assert counts["computed"] == plain["computed"] - 16
    for a, b in zip(shared, whole, strict=True):
        assert len(a) >= 2 and same(a, b)


def test_talker_prefix_rows_tell_media_rows_and_speakers_apart():
    feed = Feed(31, media=True)
    rows = feed.prompt().prefix_rows()
    other = Feed(31, media=True)
    other.accept = other.accept.clone()
    media_at = int((rows[:, 0] == 1).nonzero()[0])  # the first media position
    kept = [i for i in range(len(feed.ids)) if feed.ids[i] == MEDIA.image]
    other.accept[kept[0]] += 1.0  # another image's rows at the same positions
    changed = other.prompt().prefix_rows()
    assert not changed[media_at].equal(rows[media_at])
    assert changed[:media_at].equal(rows[:media_at])
    voice = feed.prompt(speaker="aiden").prefix_rows()
    users = len(rows) - 9
    assert voice[:users].equal(rows[:users]) and not voice[users:].equal(rows[users:])


def test_talker_prompts_prefilled_in_chunks_make_the_frames_of_whole_prefills(talker):
    """Three requests at once, chunks of 12 positions (one prompt chunked at a time while
    the others decode): the frames of one-step prefills."""
    feeds = [Feed(40, media=True), Feed(41), Feed(42, media=True)]
    model = TalkerStepModel(talker, CFG, device="cpu", dtype=torch.float32)
    counts: dict = {}
    chunked = _engine_frames(
        model,
        [f.prompt() for f in feeds],
        GREEDY,
        frames=5,
        counts=counts,
        disable_radix_cache=True,
        max_prefill_tokens=12,
    )
    whole = _engine_frames(model, [f.prompt() for f in feeds], GREEDY, frames=5)
    assert counts["prefill_chunks"] >= len(feeds)
    for a, b in zip(chunked, whole, strict=True):
        assert len(a) >= 2 and same(a, b)
