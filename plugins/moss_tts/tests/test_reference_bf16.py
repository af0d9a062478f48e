"""bf16 fidelity against the reference run in bf16 on the same tiny checkpoint (opt-in).

The reference loads the checkpoint in bfloat16 (as its README does on a
GPU) and records, at every step of its greedy ``generate``, the text head's
and the 32 audio heads' logits, and the float32 model's along the same rows.
Both sides keep the backbone and heads in bf16; the codec stays float32 on
both (the release's processor loads it so: ``omni_moss_tts.codec.dtype``).
Exact equality is not a fair demand in bf16: two correct implementations
differ by rounding, and a pick whose two best scores are closer than that
may go either way. So the test asserts what must hold:

- prompts equal (the same ids, the clip's codes equal);
- teacher-forced logits (ours fed the reference's own rows): our bf16 error
  against float32 is at most ``K`` times the reference's own bf16 error,
  per head group (text, audio);
- along that path, every pick (text token under the release's masks, each
  sampled codebook) equals the reference's wherever the reference's own
  top-2 margin exceeds the bf16 noise, twice the largest measured
  difference (a difference of two logits moves by at most that);
- free-running greedy rows equal up to the first step with a pick within
  the noise; the first divergence, if any, is reported.

Skipped unless ``MOSS_TTS_REF_PYTHON`` names the reference environment.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
soundfile = pytest.importorskip("soundfile")

from moss_reference_support import load, make_clip, opt_in, run_reference  # noqa: E402

from omni_core.engine.interface import SamplingParams, Sequence  # noqa: E402
from omni_core.engine.kv_cache import SlotKVCache  # noqa: E402
from omni_moss_tts.codec import prepare_reference  # noqa: E402
from omni_moss_tts.delay import DelayTracker, TextRule  # noqa: E402
from omni_moss_tts.model import MossTTSModel, RequestPrompt  # noqa: E402
from omni_moss_tts.prompt import MossPrompt  # noqa: E402

MAX_NEW = 160
# Our bf16 logits may stray from float32 by at most K times the reference's own bf16
# error (both measured along the reference's bf16 rows, max over steps and entries).
# Two faithful bf16 implementations round the same operations in the same dtypes, so
# each lands about as far from float32 as the other: measured here (seed 0; plain /
# continuation) ours and the reference's are equally far, text 0.199 / 0.220 both and
# audio 0.055 / 0.052 both (logits up to ~30), and ours is 1e-4..8e-3 from the
# reference's (0 for the continuation's audio heads). K = 2 leaves room for another
# summation order in a GEMM (another CPU, another oneDNN), and still fails an operation
# left in bf16 that the release computes in float32 (norm, softmax, RoPE), which would
# at least double the error. Ours against the reference's bf16 is within (1 + K) times it.
K = 2.0

pytestmark = opt_in

CASES = [
    {"name": "plain", "text": "Hello there, this is a plain test.", "language": "English"},
    {
        "name": "continuation",
        "text": "and then it keeps on talking.",
        "continuation": True,
        "ref_text": "This is the reference clip, ",
        "clone_reference": True,
    },
]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("moss-reference-bf16")
    clip = make_clip(out / "clip.wav")
    cases = [{**c, "ref_wav": str(clip)} if c.get("continuation") else c for c in CASES]
    request = {"seed": 0, "max_new_tokens": MAX_NEW, "dtype": "bfloat16", "cases": cases}
    return run_reference(out, request)


@pytest.fixture(scope="module")
def ours(recorded: Path) -> MossTTSModel:
    torch.set_num_threads(1)
    model = MossTTSModel.from_pretrained(str(recorded / "model"), dtype="bfloat16")
    assert model.dtype is torch.bfloat16
    assert model.codec is not None and next(model.codec.parameters()).dtype is torch.float32
    return model


def build_prompt(model: MossTTSModel, recorded: Path, case: dict, ref: dict) -> MossPrompt:
    codes = None
    if case.get("continuation"):
        samples, rate = soundfile.read(recorded / "clip.wav", dtype="float32")
        codes = model.encode_reference(prepare_reference(samples, rate))
        assert torch.equal(codes, torch.from_numpy(ref["ref_codes"]))
    return model.prompts.build(
        case["text"],
        max_frames=4096,
        reference=codes if case.get("clone_reference") else None,
        continuation=codes,
        reference_text=case.get("ref_text"),
        language=case.get("language"),
    )


@torch.no_grad()
def teacher_forced(model: MossTTSModel, prompt: MossPrompt, rows: torch.Tensor):
    """Our logits at each step, the backbone fed the reference's rows ``[N, 33]``.

    Returns text logits ``[N, V]``, audio logits ``[N, Q, 1025]`` (pad at
    -inf) and, per step, the release's text rule and sampled codebooks (our
    :class:`DelayTracker`, advanced by the reference's own picks).
    """
    steps = rows.shape[0]
    tracker = DelayTracker.after_prompt(model.config, prompt.ids, prompt.max_frames)
    seq = Sequence("tf", RequestPrompt(prompt), SamplingParams(temperature=0.0))
    cache = SlotKVCache(model.cache_layout(), 1, len(prompt) + steps + 1)
    seq.slot = cache.allocate()
    net = model.network
    hidden = model._forward([seq], [net.embed(prompt.ids.to(model.device))], cache)
    text, audio, rules = [], [], []
    for t in range(steps):
        text.append(net.text_logits(hidden).float()[0])
        audio.append(net.audio_logits(hidden).float()[0])
        rules.append((tracker.text_rule(), tracker.sampled_books()))
        tracker.advance(int(rows[t, 0]), rows[t, 1:].tolist())
        if t + 1 < steps:
            hidden = model._forward([seq], [net.embed(rows[t : t + 1].to(model.device))], cache)
    return torch.stack(text), torch.stack(audio), rules


def masked(scores: torch.Tensor, rule: TextRule) -> torch.Tensor:
    """Text scores under the release's masks at this step."""
    out = torch.full_like(scores, float("-inf"))
    if rule.allowed is not None:
        out[list(rule.allowed)] = scores[list(rule.allowed)]
        return out
    out.copy_(scores)
    out[list(rule.banned)] = float("-inf")
    return out


def margin(scores: torch.Tensor) -> float:
    top = scores.topk(2).values
    return float(top[0] - top[1])


def gap(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| over finite entries (the audio pad column is -inf on both sides)."""
    finite = torch.isfinite(a) & torch.isfinite(b)
    return float((a - b)[finite].abs().max())


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_bf16_matches_the_reference_in_bf16(ours, recorded, case) -> None:
    ref = load(recorded, case["name"])
    prompt = build_prompt(ours, recorded, case, ref)
    assert prompt.ids.tolist() == ref["input_ids"].tolist()  # prompts equal

    theirs = torch.from_numpy(ref["generated"])
    steps = theirs.shape[0]
    assert steps >= 40
    ref_text = torch.from_numpy(ref["step_text_logits"])
    ref_audio = torch.from_numpy(ref["step_audio_logits"])
    fp32_text = torch.from_numpy(ref["fp32_text_logits"])
    fp32_audio = torch.from_numpy(ref["fp32_audio_logits"])
    text, audio, rules = teacher_forced(ours, prompt, theirs)

    figures = {}
    for head, mine, bf16, fp32 in (
        ("text", text, ref_text, fp32_text),
        ("audio", audio, ref_audio, fp32_audio),
    ):
        figures[head] = (gap(mine, bf16), gap(mine, fp32), gap(bf16, fp32))
        diff, ours_err, ref_err = figures[head]
        assert ours_err <= K * ref_err, (
            f"{head} heads: our bf16 is {ours_err:.4f} from float32, the reference's bf16 "
            f"{ref_err:.4f}: more than {K}x"
        )
        assert diff <= (1 + K) * ref_err
    noise = {head: 2 * figures[head][0] for head in figures}

    close, picks = [], 0
    for t, (rule, books) in enumerate(rules):
        within = False
        if rule.forced is None:
            theirs_scores = masked(ref_text[t], rule)
            if margin(theirs_scores) > noise["text"]:
                picks += 1
                assert int(masked(text[t], rule).argmax()) == int(theirs[t, 0]), f"text, step {t}"
            else:
                within = True
        else:
            assert int(theirs[t, 0]) == rule.forced  # the drain: the same forced tokens
        for k in books:
            ref_scores = ref_audio[t, k]
            if margin(ref_scores) > noise["audio"]:
                picks += 1
                assert int(audio[t, k].argmax()) == int(theirs[t, k + 1]), f"book {k}, step {t}"
            else:
                within = True
        if within:
            close.append(t)
    assert picks >= steps  # most picks are decided (a vacuous check would pass any model)

    rows, _ = ours.generate(prompt, max_steps=MAX_NEW)
    n = min(rows.shape[0], steps)
    differs = [t for t in range(n) if not torch.equal(rows[t], theirs[t])]
    first_divergence = differs[0] if differs else None
    first_close = close[0] if close else steps
    print(
        f"moss bf16 vs reference bf16 ({case['name']}): {n} rows, first divergence "
        f"{first_divergence}, first step with a pick within noise {first_close} "
        f"({len(close)} such steps, {picks} picks checked); teacher-forced max |dlogit| "
        + ", ".join(
            f"{h}: ours-ref {d:.4f}, ours-fp32 {o:.4f}, ref-fp32 {r:.4f}"
            for h, (d, o, r) in figures.items()
        )
    )
    if first_divergence is not None:
        assert first_divergence >= first_close, (
            f"row {first_divergence} differs while every pick up to it had a margin above the "
            f"bf16 noise:\nours   {rows[first_divergence].tolist()}\n"
            f"theirs {theirs[first_divergence].tolist()}"
        )
    else:  # ours stops at audio_end, the reference goes on to <|im_end|>
        assert n == steps or int(rows[-1, 0]) == ours.config.audio_end_token_id
