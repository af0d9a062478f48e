"""Parity with the reference implementation (opt-in: ``-m reference``, see tests/REFERENCE.md).

The reference (``qwen-tts``) writes a tiny checkpoint with its own
``save_pretrained`` and records greedy codes and audio; our loader must take
that checkpoint without a single unmatched tensor, and our greedy generation
must give the same codes frame for frame and audio within 1e-4 relative L2.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tts_reference_support import opt_in, run_reference  # noqa: E402

from omni_qwen3_tts.model import Qwen3TTSModel  # noqa: E402
from omni_qwen3_tts.tokenizer import TextTokenizer  # noqa: E402
from omni_qwen3_tts.weights import PRESETS_DIR  # noqa: E402

MAX_NEW = 12

pytestmark = opt_in


def _rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


def _compare(model: Qwen3TTSModel, prompt, ref: dict, reference_codes=None) -> None:
    ours = model.generate(prompt, max_new_tokens=MAX_NEW, temperature=0.0)
    theirs = torch.from_numpy(ref["codes"]).long()
    # The reference runs the code predictor for a frame in the *next* talker step, so
    # when it stops at max_new_tokens its last codebook-0 token has no frame.
    n = theirs.shape[0]
    assert n >= 1
    assert ours.shape[0] in (n, n + 1)
    assert torch.equal(ours[:n], theirs), f"first mismatch:\n{ours[:n]}\n{theirs}"
    wav = model.decode_audio(ours[:n], reference=reference_codes).numpy()
    assert wav.shape == ref["wav"].shape
    assert _rel_l2(wav, ref["wav"]) < 1e-4


@pytest.mark.parametrize("non_streaming", [False, True])
def test_custom_voice_matches_reference(tmp_path, non_streaming):
    tok = TextTokenizer.from_dir(PRESETS_DIR / "tiny")
    text = "Hello the world, the user is here"
    from omni_qwen3_tts.prompt import assistant_text

    request = {
        "variant": "custom_voice",
        "text_ids": tok.encode(assistant_text(text)),
        "speaker": "ryan",
        "language": "english",
        "non_streaming": non_streaming,
        "max_new_tokens": MAX_NEW,
    }
    out, ref = run_reference(tmp_path, request)
    model = Qwen3TTSModel.from_pretrained(out)  # strict: every tensor must match
    prompt = model.prompts.custom_voice(text, "ryan", "english", non_streaming=non_streaming)
    assert prompt.text_ids == request["text_ids"]
    _compare(model, prompt, ref)


@pytest.mark.parametrize("x_vector_only", [False, True])
def test_voice_clone_matches_reference(tmp_path, x_vector_only):
    from omni_qwen3_tts.prompt import assistant_text, reference_text

    tok = TextTokenizer.from_dir(PRESETS_DIR / "tiny")
    text, ref_text = "Hello the world", "the user is an assistant"
    rng = np.random.default_rng(0)
    wav = 0.3 * np.sin(np.arange(30000) / 24000 * 2 * np.pi * 180) + 0.05 * rng.standard_normal(
        30000
    )
    np.save(tmp_path / "ref.npy", wav.astype(np.float32))
    request = {
        "variant": "base",
        "text_ids": tok.encode(assistant_text(text)),
        "ref_ids": tok.encode(reference_text(ref_text)),
        "ref_wav": str(tmp_path / "ref.npy"),
        "x_vector_only": x_vector_only,
        "language": "english",
        "non_streaming": False,
        "max_new_tokens": MAX_NEW,
    }
    out, ref = run_reference(tmp_path, request)
    model = Qwen3TTSModel.from_pretrained(out)
    ref_codes, xvector = model.voice_clone_reference(torch.from_numpy(wav.astype(np.float32)))
    assert torch.equal(ref_codes, torch.from_numpy(ref["ref_codes"]).long())
    assert _rel_l2(xvector.numpy(), ref["xvector"]) < 1e-4
    if x_vector_only:
        prompt = model.prompts.voice_clone(text, xvector, "english", x_vector_only=True)
        _compare(model, prompt, ref)
    else:
        prompt = model.prompts.voice_clone(text, xvector, "english", ref_codes, ref_text)
        _compare(model, prompt, ref, reference_codes=ref_codes)
