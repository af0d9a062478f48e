"""bf16 fidelity against the reference run in bf16 on the same tiny checkpoint (opt-in).

Both sides keep the talker in bfloat16. Exact equality of greedy codes is not
a fair demand there: two correct bf16 implementations differ by rounding,
and a step whose two best tokens are closer than that noise may go either
way. So the test asserts what must hold:

- prompts equal (the same token ids);
- teacher-forced logits (our talker fed the reference's own frames) within
  ``LOGIT_TOL`` of the reference's, relative to the largest logit;
- along that path, our greedy pick of codebook 0 equals the reference's
  wherever the reference's own top-2 margin exceeds twice the measured
  difference (the noise cannot flip it there);
- free-running greedy frames equal up to the first step whose margin is
  within the noise, and the first divergence, if any, is reported.

Skipped unless ``QWEN_TTS_REF_PYTHON`` names the reference environment
(``make test-reference``; see tests/REFERENCE.md).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tts_reference_support import opt_in, run_reference  # noqa: E402

from omni_qwen3_tts.model import Qwen3TTSModel  # noqa: E402
from omni_qwen3_tts.prompt import assistant_text  # noqa: E402
from omni_qwen3_tts.tokenizer import TextTokenizer  # noqa: E402
from omni_qwen3_tts.weights import PRESETS_DIR  # noqa: E402

MAX_NEW = 16
# bf16 keeps 8 bits of mantissa (relative step 2^-8): after the talker's layers the
# logits of two faithful bf16 implementations differ by a few such steps of the
# largest logit (measured here: 0.8% of it, the same as our bf16 against our float32);
# 2^-5 (3%) bounds that with room, far below what a wrong prompt or layer gives (50%).
LOGIT_TOL = 2.0**-5

pytestmark = opt_in


@torch.no_grad()
def teacher_forced_logits(model: Qwen3TTSModel, prompt, frames: torch.Tensor) -> torch.Tensor:
    """Codebook 0's logits at each step, our talker fed the reference's frames ``[T, 16]``."""
    from omni_core.engine.interface import SamplingParams, Sequence
    from omni_core.engine.kv_cache import SlotKVCache

    steps = frames.shape[0]
    seq = Sequence(request_id="tf", prompt=prompt, sampling=SamplingParams(temperature=0.0))
    cache = SlotKVCache(model.cache_layout(), 1, model.prompt_length(prompt) + steps + 2)
    seq.slot = cache.allocate()
    prefill, trailing = model.embed_prompt(prompt)
    rows = [model.talker.codec_head(model._talker_step([seq], [prefill], cache))[0]]
    for t in range(steps - 1):
        text = trailing[t] if t < trailing.shape[0] else model._tts_pad()
        embed = model.talker.embed_frame(frames[t : t + 1].to(model.device))[0] + text
        rows.append(model.talker.codec_head(model._talker_step([seq], [embed[None]], cache))[0])
    return torch.stack(rows).float()


def processed(raw: torch.Tensor, ref_scores: torch.Tensor, history: list[int], penalty: float):
    """Our raw logits through the reference's processors: its bans, the repetition penalty."""
    scores = raw.clone()
    for token in set(history):
        value = scores[token]
        scores[token] = value / penalty if value > 0 else value * penalty
    scores[torch.isinf(ref_scores)] = float("-inf")
    return scores


def test_custom_voice_in_bf16_matches_the_reference_in_bf16(tmp_path):
    tok = TextTokenizer.from_dir(PRESETS_DIR / "tiny")
    text = "Hello the world, the user is here and speaks for a while"
    request = {
        "variant": "custom_voice",
        "text_ids": tok.encode(assistant_text(text)),
        "speaker": "ryan",
        "language": "english",
        "non_streaming": False,
        "max_new_tokens": MAX_NEW,
        "dtype": "bfloat16",
    }
    out, ref = run_reference(tmp_path, request)
    model = Qwen3TTSModel.from_pretrained(out, dtype="bfloat16")
    assert model.dtype is torch.bfloat16
    prompt = model.prompts.custom_voice(text, "ryan", "english", non_streaming=False)
    assert prompt.text_ids == request["text_ids"]  # prompts equal
    assert prompt.non_streaming is request["non_streaming"]

    theirs = torch.from_numpy(ref["codes"]).long()
    ref_logits = torch.from_numpy(ref["logits"])
    ref_scores = torch.from_numpy(ref["scores"])
    steps = min(theirs.shape[0], ref_logits.shape[0])
    assert steps >= 4
    ours_tf = teacher_forced_logits(model, prompt, theirs[:steps])
    diff = (ours_tf - ref_logits[:steps]).abs().max(dim=-1).values  # per step
    scale = float(ref_logits[:steps].abs().max())
    assert float(diff.max()) <= LOGIT_TOL * scale, (
        f"teacher-forced logits differ by {float(diff.max()):.4f} (largest logit {scale:.2f})"
    )

    top2 = ref_scores[:steps].topk(2, dim=-1).values
    margin = top2[:, 0] - top2[:, 1]
    noise = 2 * float(diff.max())
    penalty = model.generation.repetition_penalty
    for t in range(steps):
        if margin[t] <= noise:
            continue
        history = theirs[:t, 0].tolist()
        pick = int(processed(ours_tf[t], ref_scores[t], history, penalty).argmax())
        assert pick == int(theirs[t, 0]), f"step {t}: margin {float(margin[t]):.3f} > {noise:.3f}"

    ours = model.generate(prompt, max_new_tokens=MAX_NEW, temperature=0.0)
    n = min(ours.shape[0], steps)
    differs = [t for t in range(n) if not torch.equal(ours[t], theirs[t])]
    first_divergence = differs[0] if differs else None
    close = [t for t in range(steps) if margin[t] <= noise]
    first_close = close[0] if close else steps
    print(
        f"bf16 vs reference bf16: {n} frames, first divergence "
        f"{first_divergence}, first step within noise {first_close} "
        f"(max teacher-forced |dlogit| {float(diff.max()):.4f}, largest logit {scale:.2f})"
    )
    if first_divergence is not None:
        assert first_divergence >= first_close, (
            f"frame {first_divergence} differs while every step up to it had a margin above "
            f"the bf16 noise {noise:.3f}:\nours   {ours[first_divergence].tolist()}\n"
            f"theirs {theirs[first_divergence].tolist()}"
        )
