"""The 12 Hz codec: decode shapes, streaming == full decode, encoder, speaker encoder."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from omni_qwen3_tts.speaker_encoder import log_mel, slaney_mel_filters  # noqa: E402


def _codes(frames: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 64, (frames, 16), generator=torch.Generator().manual_seed(seed))


def test_decode_shape_and_range(tiny_model):
    st = tiny_model.speech_tokenizer
    wav = tiny_model.decode_audio(_codes(7))
    assert wav.shape == (7 * 1920,) and wav.dtype == torch.float32
    assert st.samples_per_frame == 1920 and st.sample_rate == 24000
    assert torch.isfinite(wav).all() and float(wav.abs().max()) <= 1.0
    assert float(wav.std()) > 1e-3  # dummy weights still make a signal, not silence


def test_decode_chunk_with_the_exact_context_equals_full_decode(tiny_model):
    """The release's way (re-decoding left context per chunk) with enough context is exact."""
    decoder = tiny_model.speech_tokenizer.decoder
    codes = _codes(24, seed=1).T[None]
    full = decoder(codes)[0, 0]
    context = decoder.exact_context_frames()
    assert 0 < context < 24
    pieces, start = [], 0
    for size in (1, 2, 5, 3, 4, 9):  # uneven chunks, as frames arrive
        left = min(context, start)
        pieces.append(decoder.decode_chunk(codes[..., start - left : start + size], left)[0, 0])
        start += size
    streamed = torch.cat(pieces)
    assert streamed.shape == full.shape
    torch.testing.assert_close(streamed, full, atol=1e-5, rtol=0)


def test_codebook_vectors_are_cached_until_the_weights_change():
    from omni_qwen3_tts.speech_tokenizer.decoder import Codebook

    book = Codebook(8, 4)
    with torch.no_grad():
        first = book.vectors()
        assert book.vectors() is first  # reused across decodes
        assert torch.equal(first, torch.zeros(8, 4))
        book.embedding_sum.copy_(torch.arange(32.0).view(8, 4))  # weights loaded later
        loaded = book.vectors()
        assert torch.equal(loaded, torch.arange(32.0).view(8, 4))
        book.cluster_usage.fill_(2.0)
        assert torch.equal(book.vectors(), torch.arange(32.0).view(8, 4) / 2)
        book.load_state_dict({"cluster_usage": torch.ones(8), "embedding_sum": torch.ones(8, 4)})
        assert torch.equal(book.vectors(), torch.ones(8, 4))
        book.to(torch.float64)  # new storage
        assert book.vectors().dtype == torch.float64
    with_grad = book.vectors()  # grad enabled: computed fresh, never cached with its graph
    assert with_grad.requires_grad and book.vectors() is not with_grad


def test_stateful_stream_equals_full_decode_past_the_attention_window(tiny_model):
    """Each frame decoded once, carrying every causal operation's look-back."""
    decoder = tiny_model.speech_tokenizer.decoder
    codes = _codes(30, seed=3).T[None]
    assert codes.shape[-1] > 3 * decoder.cfg.sliding_window  # the window's cache is trimmed
    full = decoder(codes)
    state = decoder.new_stream()
    pieces, start = [], 0
    for size in (1, 2, 5, 3, 4, 9, 6):
        pieces.append(decoder.stream(codes[..., start : start + size], state))
        start += size
    assert int(state.position[0]) == 30
    assert int(state.valid[0]) == decoder.cfg.sliding_window - 1
    streamed = torch.cat(pieces, dim=-1)
    assert streamed.shape == full.shape
    torch.testing.assert_close(streamed, full, atol=1e-5, rtol=0)


def test_stacked_streams_at_different_positions_equal_separate_streams(tiny_model):
    from omni_qwen3_tts.speech_tokenizer.streaming import StreamState

    decoder = tiny_model.speech_tokenizer.decoder
    ahead, behind = _codes(26, seed=4).T[None], _codes(20, seed=5).T[None]
    first, second = decoder.new_stream(), decoder.new_stream()
    heard_first = [decoder.stream(ahead[..., :6], first)]  # 6 frames ahead, own look-back
    heard_second = []
    for start in range(0, 20, 4):
        both = StreamState.stack([first, second])
        assert both.batch == 2
        wav = decoder.stream(
            torch.cat([ahead[..., 6 + start : 10 + start], behind[..., start : start + 4]]), both
        )
        row_first, row_second = both.split([1, 1])
        first.adopt(row_first)
        second.adopt(row_second)
        heard_first.append(wav[:1])
        heard_second.append(wav[1:])
    torch.testing.assert_close(torch.cat(heard_first, -1), decoder(ahead), atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.cat(heard_second, -1), decoder(behind), atol=1e-5, rtol=0)


def test_a_stream_refuses_codes_of_another_batch_size(tiny_model):
    decoder = tiny_model.speech_tokenizer.decoder
    with pytest.raises(ValueError, match="codes have 2 rows, the stream 1"):
        decoder.stream(_codes(3).T[None].expand(2, -1, -1), decoder.new_stream())


def test_short_context_is_only_approximate(tiny_model):
    """The release's chunked decode uses a fixed context; below the exact one it drifts."""
    decoder = tiny_model.speech_tokenizer.decoder
    codes = _codes(20, seed=2).T[None]
    full = decoder(codes)[0, 0]
    exact = decoder.chunked_decode(codes, chunk_size=4, left_context=decoder.exact_context_frames())
    torch.testing.assert_close(exact[0, 0], full, atol=1e-5, rtol=0)
    rough = decoder.chunked_decode(codes, chunk_size=4, left_context=1)[0, 0]
    assert rough.shape == full.shape
    assert not torch.allclose(rough, full, atol=1e-5)


def test_real_size_context_exceeds_release_default():
    from omni_qwen3_tts.config import DecoderConfig
    from omni_qwen3_tts.speech_tokenizer.decoder import Decoder

    with torch.device("meta"):
        decoder = Decoder(DecoderConfig())
    assert decoder.total_upsample == 1920
    assert decoder.exact_context_frames() > 25


def test_encoder_codes_shape(base_model):
    st = base_model.speech_tokenizer
    wav = 0.3 * torch.sin(torch.arange(24000 + 100) / 24000 * 2 * math.pi * 220)
    codes = st.encode(wav)
    assert codes.shape == (math.ceil(24100 / 1920), 16)
    assert codes.dtype == torch.long and int(codes.min()) >= 0 and int(codes.max()) < 64


def test_mel_filters_match_slaney_properties():
    filters = slaney_mel_filters(24000, 1024, 128, 0.0, 12000.0)
    assert filters.shape == (128, 513)
    assert (filters >= 0).all()
    # Each triangle's peak sits inside the band and every band has some weight.
    assert (filters.sum(axis=1) > 0).all()
    peaks = filters.argmax(axis=1)
    assert np.all(np.diff(peaks) >= 0)
    mel = log_mel(torch.zeros(1, 24000))
    assert mel.shape == (1, 24000 // 256, 128)
    assert torch.allclose(mel, torch.full_like(mel, math.log(1e-5)), atol=1e-3)


def test_voice_clone_end_to_end(base_model):
    m = base_model
    wav = 0.2 * torch.randn(24000, generator=torch.Generator().manual_seed(0)).clamp(-1, 1)
    ref_codes, xvector = m.voice_clone_reference(wav)
    assert xvector.shape == (m.config.talker.transformer.hidden_size,)
    prompt = m.prompts.voice_clone("Hello the world", xvector, "english", ref_codes, "the user")
    codes = m.generate(prompt, max_new_tokens=4)
    audio = m.decode_audio(codes, reference=ref_codes)
    assert codes.shape == (4, 16)
    # The reference's share of the audio is cut off again.
    assert audio.shape[0] == pytest.approx(4 * 1920, abs=1)
    only = m.prompts.voice_clone("Hello", xvector, "english", x_vector_only=True)
    assert m.generate(only, max_new_tokens=3).shape == (3, 16)


def test_voice_clone_needs_base(tiny_model):
    with pytest.raises(RuntimeError, match="Base checkpoint"):
        tiny_model.voice_clone_reference(torch.zeros(2400))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch", [1, 3])
def test_upsampling_takes_the_product_for_short_inputs_and_equals_the_convolution(
    monkeypatch, dtype, batch
):
    """Few inputs through a wide layer: one product and an overlap-add; many: a convolution."""
    from omni_qwen3_tts.speech_tokenizer import convs

    torch.manual_seed(0)
    layer = convs.CausalTransConv1d(64, 32, kernel_size=8, stride=4).to(dtype).eval()
    calls = []
    product = convs._transposed_conv_as_product
    monkeypatch.setattr(
        convs, "_transposed_conv_as_product", lambda *a: calls.append(1) or product(*a)
    )
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    with torch.inference_mode():
        for steps, by_product in ((5, True), (40, False)):  # 2 * rows vs 64 channels
            x = torch.randn(batch, 64, steps).to(dtype)
            expected = layer.conv(x)[..., : steps * 4]  # the right overhang trimmed
            calls.clear()
            got = layer(x)
            assert bool(calls) == by_product
            torch.testing.assert_close(got, expected, atol=tolerance, rtol=tolerance)
        calls.clear()
        off_cpu = layer.to("meta")(torch.randn(batch, 64, 5, device="meta", dtype=dtype))
        assert not calls and off_cpu.shape == (batch, 32, 20)  # other devices: the release's


def test_long_signals_run_channels_last_and_equal_the_release_layout():
    """The decoder's convolutions compute long signals time-major, with the same samples."""
    from omni_qwen3_tts.speech_tokenizer.convs import CausalConv1d

    torch.manual_seed(0)
    plain = CausalConv1d(8, 8, 7, dilation=3).eval()
    routed = CausalConv1d(8, 8, 7, dilation=3, time_major=True).eval()
    routed.load_state_dict(plain.state_dict())
    with torch.inference_mode():
        long, short = torch.randn(2, 8, 50), torch.randn(1, 8, 5)
        out = routed(long)
        assert out.stride(1) == 1  # channels innermost
        torch.testing.assert_close(out, plain(long), atol=1e-5, rtol=1e-5)
        assert routed(short).is_contiguous()  # fewer steps than channels: the release's layout
        torch.testing.assert_close(routed(short), plain(short), atol=1e-5, rtol=1e-5)
        assert routed.to("meta")(long.to("meta")).is_contiguous()  # off the CPU: the release's
