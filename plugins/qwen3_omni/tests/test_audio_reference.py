"""Audio front end and tower vs transformers 4.57.3 (opt-in: ``-m reference``).

The reference environment (``QWEN_TTS_REF_PYTHON``, see
plugins/qwen3_tts/tests/REFERENCE.md) runs ``reference/audio_reference.py`` on
clips we write: it featurises them with ``WhisperFeatureExtractor`` the way the
Qwen3-Omni processor calls it and runs a tiny, seeded
``Qwen3OmniMoeAudioEncoder``, saving its state_dict. We load that state_dict
strictly and compare mels (atol 1e-5) and embeddings (relative L2 <= 1e-4).

Clips that fit one attention window are compared with the reference's plain
sdpa path; longer clips (and a batch of two) with the reference given its own
``cu_seqlens`` block mask, since its sdpa path has no windows (see
``audio/encoder.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from reference_support import opt_in, run_reference

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from safetensors.torch import load_file  # noqa: E402

from omni_qwen3_omni.audio.encoder import AudioEncoder  # noqa: E402
from omni_qwen3_omni.audio.mel import audio_token_count, log_mel  # noqa: E402
from omni_qwen3_omni.config import AudioEncoderConfig  # noqa: E402

SCRIPT = Path(__file__).parent / "reference" / "audio_reference.py"

pytestmark = opt_in

# Window = 400 // 100 = 4 chunks = 52 tokens (4 s): the 3.7 s clip (48 tokens) fits one.
TINY = {
    "num_mel_bins": 128,
    "encoder_layers": 2,
    "encoder_attention_heads": 4,
    "encoder_ffn_dim": 128,
    "d_model": 64,
    "downsample_hidden_size": 32,
    "output_dim": 48,
    "n_window": 50,
    "n_window_infer": 400,
    "max_source_positions": 1500,
}
# Lengths in samples; none a multiple of the 160-sample hop except "round".
CLIPS = {"short": 9_700, "mid": 24_037, "odd": 59_263, "long": 165_011, "round": 32_000}
PLAIN = ["short", "mid", "odd", "round"]
WINDOWED = [["long"], ["mid", "long"]]
MEL_BATCH = ["mid", "odd", "round"]


def _clip(samples: int, seed: int) -> np.ndarray:
    t = np.arange(samples) / 16_000
    tones = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.2 * np.sin(2 * np.pi * 1375.5 * t + 0.3)
    sweep = 0.1 * np.sin(2 * np.pi * (300 + 900 * t) * t)
    noise = 0.05 * np.random.default_rng(seed).standard_normal(samples)
    return (tones + sweep + noise).astype(np.float32)


def _rel_l2(ours: torch.Tensor, ref: np.ndarray) -> float:
    ref_t = torch.from_numpy(ref).to(torch.float64)
    return float((ours.to(torch.float64) - ref_t).norm() / ref_t.norm())


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, dict]:
    out = tmp_path_factory.mktemp("audio_ref")
    clips = {name: _clip(n, seed) for seed, (name, n) in enumerate(CLIPS.items())}
    np.savez(out / "inputs.npz", **clips)
    request = {
        "config": TINY,
        "seed": 7,
        "attn_implementation": "sdpa",
        "plain": [*PLAIN, "long"],
        "windowed": WINDOWED,
        "mel_batch": MEL_BATCH,
    }
    (out / "request.json").write_text(json.dumps(request))
    run_reference(SCRIPT.name, str(out))
    data = np.load(out / "reference.npz")
    return clips, {k: data[k] for k in data.files}, load_file(str(out / "audio_tower.safetensors"))


@pytest.fixture(scope="module")
def encoder(reference) -> AudioEncoder:
    torch.set_num_threads(1)
    model = AudioEncoder(AudioEncoderConfig(**TINY)).eval()
    result = model.load_state_dict(reference[2], strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    return model


@pytest.mark.parametrize("name", list(CLIPS))
def test_mel_alone_matches(reference, name: str) -> None:
    clips, ref, _ = reference
    ours = log_mel(clips[name])
    assert ours.shape == ref[f"mel/{name}"].shape == (128, CLIPS[name] // 160)
    np.testing.assert_allclose(ours.numpy(), ref[f"mel/{name}"], atol=1e-5, rtol=0)
    assert audio_token_count(ours.shape[1]) == int(ref[f"tokens/{name}"])


def test_mel_batched_call_matches(reference) -> None:
    """A processor call with several clips pads them; padded_length reproduces each slice."""
    clips, ref, _ = reference
    longest = max(CLIPS[n] for n in MEL_BATCH)
    for i, name in enumerate(MEL_BATCH):
        ours = log_mel(clips[name], padded_length=longest)
        assert ours.shape == ref[f"batch_mel/{i}"].shape
        np.testing.assert_allclose(ours.numpy(), ref[f"batch_mel/{i}"], atol=1e-5, rtol=0)


def test_state_dict_keys_are_the_checkpoints(reference, encoder) -> None:
    assert set(encoder.state_dict()) == set(reference[2])


@pytest.mark.parametrize("name", PLAIN)
def test_tower_single_window_matches_plain_reference(reference, encoder, name: str) -> None:
    _, ref, _ = reference
    expected = ref[f"plain/{name}"]
    with torch.no_grad():
        (ours,) = encoder([torch.from_numpy(ref[f"mel/{name}"])])
    assert ours.shape == expected.shape
    assert _rel_l2(ours, expected) <= 1e-4


@pytest.mark.parametrize("group", range(len(WINDOWED)))
def test_tower_windows_match_reference_block_mask(reference, encoder, group: int) -> None:
    _, ref, _ = reference
    names = WINDOWED[group]
    with torch.no_grad():
        outs = encoder([torch.from_numpy(ref[f"mel/{n}"]) for n in names])
    for i, ours in enumerate(outs):
        expected = ref[f"windowed/{group}/{i}"]
        assert ours.shape == expected.shape
        assert _rel_l2(ours, expected) <= 1e-4


def test_tower_long_clip_differs_from_unwindowed_reference(reference, encoder) -> None:
    """Guard the comparison itself: windows matter for the long clip."""
    _, ref, _ = reference
    with torch.no_grad():
        (ours,) = encoder([torch.from_numpy(ref["mel/long"])])
    assert _rel_l2(ours, ref["windowed/0/0"]) <= 1e-4
    assert _rel_l2(ours, ref["plain/long"]) > 1e-3
