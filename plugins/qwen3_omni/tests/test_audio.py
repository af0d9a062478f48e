"""Audio front end and tower: token budget, mel shapes, batching and attention windows."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from omni_qwen3_omni.audio.mel import (
    HOP_LENGTH,
    SAMPLE_RATE,
    audio_token_count,
    mel_filters,
    mel_frame_count,
)

# Placeholder counts printed by transformers 4.57.3's `_get_feat_extract_output_lengths`.
REFERENCE_TOKENS = {
    0: 0, 1: 1, 2: 1, 3: 1, 4: 1, 5: 1, 8: 1, 9: 2, 13: 2, 50: 7, 99: 13, 100: 13, 101: 14,
    150: 20, 199: 26, 200: 26, 201: 27, 370: 48, 999: 130, 1000: 130, 1001: 131, 1031: 134,
    3000: 390, 30000: 3900,
}  # fmt: skip


def _reference_formula(frames: int) -> int:
    """The processor's expression, restated with Python integers."""
    rest = frames % 100
    first = (rest - 1) // 2 + 1
    return ((first - 1) // 2 + 1 - 1) // 2 + 1 + (frames // 100) * 13


@pytest.mark.parametrize(("frames", "tokens"), sorted(REFERENCE_TOKENS.items()))
def test_token_count_table(frames: int, tokens: int) -> None:
    assert audio_token_count(frames) == tokens


def test_token_count_formula_everywhere() -> None:
    assert all(audio_token_count(n) == _reference_formula(n) for n in range(0, 20_001))
    with pytest.raises(ValueError):
        audio_token_count(-1)


def test_token_count_needs_no_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from omni_qwen3_omni.audio.mel import audio_token_count; "
        "assert audio_token_count(1000) == 130; assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_mel_frame_count_rules() -> None:
    assert mel_frame_count(24_000) == 150  # exact hops
    assert mel_frame_count(24_037) == 150  # alone: the partial hop is dropped
    assert mel_frame_count(24_037, padded_length=59_263) == 151  # padded: it counts
    assert mel_frame_count(59_263, padded_length=59_263) == 370  # the longest clip
    assert mel_frame_count(24_000, padded_length=32_000) == 150
    with pytest.raises(ValueError):
        mel_frame_count(100, padded_length=50)


def test_filter_bank_shape() -> None:
    bank = mel_filters()
    assert bank.shape == (201, 128)
    assert (bank >= 0).all() and (bank.max(axis=0) > 0).all()
    assert not bank.flags.writeable


torch = pytest.importorskip("torch")

from omni_qwen3_omni.audio.encoder import AudioEncoder  # noqa: E402
from omni_qwen3_omni.audio.mel import log_mel  # noqa: E402
from omni_qwen3_omni.config import AudioEncoderConfig  # noqa: E402

TINY = AudioEncoderConfig(
    encoder_layers=2,
    encoder_attention_heads=4,
    encoder_ffn_dim=128,
    d_model=64,
    downsample_hidden_size=32,
    output_dim=48,
    n_window=50,
    n_window_infer=200,  # windows of 2 chunks = 26 tokens
)


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def encoder() -> AudioEncoder:
    torch.manual_seed(0)
    model = AudioEncoder(TINY).eval()
    with torch.no_grad():  # O(1) activations so differences are visible
        for p in model.parameters():
            p.normal_(0, 1.0 / max(p[0].numel(), 1) ** 0.5 if p.dim() > 1 else 0.1)
    return model


def _mel(frames: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(128, frames, generator=gen)


def _wave(samples: int, seed: int = 0) -> np.ndarray:
    t = np.arange(samples) / SAMPLE_RATE
    noise = np.random.default_rng(seed).standard_normal(samples)
    return (0.4 * np.sin(2 * np.pi * 330 * t) + 0.05 * noise).astype(np.float32)


@pytest.mark.parametrize("samples", [201, 1_600, 24_037, 59_263, 160_000])
def test_log_mel_shape_and_range(samples: int) -> None:
    mel = log_mel(_wave(samples))
    assert mel.dtype == torch.float32 and mel.shape == (128, samples // HOP_LENGTH)
    # after the floor at max-8 and (x+4)/4, values span at most 2 units
    assert float(mel.max() - mel.min()) <= 2.0 + 1e-6


def test_log_mel_accepts_tensor_and_float64() -> None:
    wave = _wave(16_000)
    ref = log_mel(wave)
    assert torch.equal(log_mel(torch.from_numpy(wave)), ref)
    assert torch.allclose(log_mel(wave.astype(np.float64)), ref)


def test_log_mel_padding_and_truncation() -> None:
    wave = _wave(24_037)
    padded = log_mel(wave, padded_length=59_263)
    assert padded.shape == (128, 151)
    assert log_mel(wave, max_samples=16_000).shape == (128, 100)
    with pytest.raises(ValueError):
        log_mel(_wave(200))
    with pytest.raises(ValueError):
        log_mel(np.zeros((2, 1_000), dtype=np.float32))


def test_state_dict_names_mirror_the_release(encoder: AudioEncoder) -> None:
    names = set(encoder.state_dict())
    top = {f"{m}.{p}" for m in ("conv2d1", "conv2d2", "conv2d3") for p in ("weight", "bias")}
    top |= {"conv_out.weight"}
    top |= {f"{m}.{p}" for m in ("ln_post", "proj1", "proj2") for p in ("weight", "bias")}
    per_layer = [
        f"{m}.{p}"
        for m in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.out_proj",
            "self_attn_layer_norm",
            "fc1",
            "fc2",
            "final_layer_norm",
        )
        for p in ("weight", "bias")
    ]
    expected = top | {f"layers.{i}.{leaf}" for i in range(2) for leaf in per_layer}
    assert names == expected
    assert tuple(encoder.conv_out.weight.shape) == (64, 32 * 16)


@pytest.mark.parametrize("frames", [1, 7, 60, 99, 100, 101, 150, 370, 1031])
def test_output_shapes(encoder: AudioEncoder, frames: int) -> None:
    with torch.no_grad():
        (out,) = encoder([_mel(frames, frames)])
    assert out.shape == (audio_token_count(frames), 48)
    assert encoder.token_count(frames) == audio_token_count(frames)
    assert torch.isfinite(out).all()


def test_empty_clip_and_empty_batch(encoder: AudioEncoder) -> None:
    with torch.no_grad():
        outs = encoder([_mel(0, 0), _mel(150, 1)])
        assert outs[0].shape == (0, 48) and outs[1].shape == (20, 48)
        assert encoder([]) == []


def test_batch_equals_each_alone(encoder: AudioEncoder) -> None:
    clips = [_mel(370, 1), _mel(60, 2), _mel(1031, 3), _mel(100, 4), _mel(150, 5)]
    with torch.no_grad():
        batched = encoder(clips)
        for clip, out in zip(clips, batched, strict=True):
            (alone,) = encoder([clip])
            torch.testing.assert_close(out, alone, atol=1e-5, rtol=1e-5)


def test_conv_grouping_does_not_change_results() -> None:
    torch.manual_seed(3)
    small = AudioEncoder(dataclasses.replace(TINY, conv_chunksize=2)).eval()
    whole = AudioEncoder(TINY).eval()
    whole.load_state_dict(small.state_dict())
    clips = [_mel(370, 1), _mel(60, 2), _mel(250, 3)]
    with torch.no_grad():
        for a, b in zip(small(clips), whole(clips), strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_windows_isolate_attention(encoder: AudioEncoder) -> None:
    """Windows of 2 chunks (200 frames, 26 tokens): later audio cannot reach window 1."""
    base = _mel(450, 9)
    edited = base.clone()
    edited[:, 200:] = _mel(250, 10)  # everything after window 1
    with torch.no_grad():
        (a,) = encoder([base])
        (b,) = encoder([edited])
    assert a.shape == (audio_token_count(450), 48)
    torch.testing.assert_close(a[:26], b[:26], atol=0, rtol=0)
    assert not torch.allclose(a[26:], b[26:])
    # and within a window, every token sees every other: editing chunk 2 moves chunk 1
    edited = base.clone()
    edited[:, 100:200] = _mel(100, 11)
    with torch.no_grad():
        (c,) = encoder([edited])
    assert not torch.allclose(a[:13], c[:13])
    torch.testing.assert_close(a[26:], c[26:], atol=0, rtol=0)


def test_short_clip_ignores_padding_it_never_had(encoder: AudioEncoder) -> None:
    """A clip under one chunk is convolved as if unpadded (the reference runs it unpadded)."""
    clip = _mel(60, 4)
    with torch.no_grad():
        (ours,) = encoder([clip])
        # Reference arithmetic for an unpadded 60-frame chunk, done by hand.
        x = clip[None, None]
        for conv in (encoder.conv2d1, encoder.conv2d2, encoder.conv2d3):
            x = torch.nn.functional.gelu(conv(x))
        n, c, f, t = x.shape
        x = encoder.conv_out(x.permute(0, 3, 1, 2).reshape(n, t, c * f))[0]
        from omni_qwen3_omni.audio.encoder import sinusoid_positions

        x = x + sinusoid_positions(t, 64)
        for layer in encoder.layers:
            x = layer(x[None], None)[0]
        expected = encoder.proj2(torch.nn.functional.gelu(encoder.proj1(encoder.ln_post(x))))
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


def test_bfloat16_runs(encoder: AudioEncoder) -> None:
    half = AudioEncoder(TINY).eval()
    half.load_state_dict(encoder.state_dict())
    half = half.to(torch.bfloat16)
    clip = _mel(250, 6)
    with torch.no_grad():
        (low,) = half([clip])
        (full,) = encoder([clip])
    assert low.dtype == torch.bfloat16 and low.shape == full.shape
    rel = (low.float() - full).norm() / full.norm()
    assert rel < 0.05
