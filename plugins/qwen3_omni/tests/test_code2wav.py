"""Qwen3-Omni's code2wav: config, module names, samples per frame, streaming == full decode.

The comparison with the reference implementation is opt-in
(``test_code2wav_reference.py``); these tests hold without it: the module is
Qwen3-TTS's codec decoder with Qwen3-Omni's embedding and left-trimmed
upsampling, and a stream fed in any chunking reproduces the full decode.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

torch = pytest.importorskip("torch")

from omni_qwen3_omni.code2wav.config import Code2WavConfig  # noqa: E402
from omni_qwen3_omni.code2wav.model import Code2Wav  # noqa: E402
from omni_qwen3_omni.config import ConfigError  # noqa: E402
from omni_qwen3_omni.source import PRESETS_DIR  # noqa: E402
from omni_qwen3_tts.speech_tokenizer import decoder as tts_decoder  # noqa: E402
from omni_qwen3_tts.speech_tokenizer.streaming import StreamState  # noqa: E402
from omni_qwen3_tts.weights import PRESETS_DIR as TTS_PRESETS  # noqa: E402
from omni_qwen3_tts.weights import dummy_fill  # noqa: E402

PRESET = json.loads((PRESETS_DIR / "tiny" / "config.json").read_text())


def _config(**changes) -> Code2WavConfig:
    return dataclasses.replace(Code2WavConfig.from_dict(PRESET), **changes)


def _model(cfg: Code2WavConfig, seed: int = 0) -> Code2Wav:
    """Seeded dummy weights (which damp the waveform head: a signal, not clipping)."""
    torch.set_num_threads(1)
    model = Code2Wav(cfg).eval()
    dummy_fill(model, seed)
    return model


def _codes(cfg: Code2WavConfig, frames: int, batch: int = 1, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.codebook_size, (batch, cfg.num_quantizers, frames), generator=gen)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.fixture(scope="module")
def windowed() -> Code2Wav:
    """The tiny preset with a 4-frame attention window, so 30 frames cross it many times."""
    return _model(_config(sliding_window=4), seed=1)


# -- config -------------------------------------------------------------------------


def test_preset_config_parses_with_release_defaults_elsewhere():
    cfg = Code2WavConfig.from_dict(PRESET)  # the root config; the section is found
    assert cfg == Code2WavConfig.from_dict(PRESET["code2wav_config"])
    assert (cfg.hidden_size, cfg.num_quantizers, cfg.codebook_size) == (32, 16, 64)
    assert cfg.total_upsample == 1920 and cfg.attn_head_dim == 8
    assert Code2WavConfig().total_upsample == 1920


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"decoder_dim": 40}, "decoder_dim"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"hidden_size": 30}, "num_attention_heads"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"upsampling_ratios": [], "upsample_rates": [2, 2]}, "a frame's worth"),
        ({"rope_scaling": {"rope_type": "yarn"}}, "rope_type"),
        ({"num_quantizers": 0}, "num_quantizers"),
    ],
)
def test_config_refuses_what_the_model_cannot_run(changes, message):
    with pytest.raises(ConfigError, match=message):
        Code2WavConfig.from_dict({**PRESET["code2wav_config"], **changes})


# -- module tree ----------------------------------------------------------------------


def test_release_geometry_names_and_samples():
    with torch.device("meta"):
        model = Code2Wav(Code2WavConfig())
    state = model.state_dict()
    assert {name.split(".")[0] for name in state} == {
        "code_embedding",
        "pre_transformer",
        "upsample",
        "decoder",
    }
    assert tuple(state["code_embedding.weight"].shape) == (16 * 2048, 1024)
    assert not [n for n in state if "input_proj" in n or "output_proj" in n]
    for name, shape in {
        "pre_transformer.layers.7.self_attn.q_proj.weight": (1024, 1024),
        "pre_transformer.layers.7.mlp.gate_proj.weight": (3072, 1024),
        "pre_transformer.layers.0.self_attn_layer_scale.scale": (1024,),
        "pre_transformer.norm.weight": (1024,),
        "upsample.1.0.conv.weight": (1024, 1024, 2),
        "upsample.1.1.dwconv.conv.weight": (1024, 1, 7),
        "upsample.1.1.gamma": (1024,),
        "decoder.0.conv.weight": (1536, 1024, 7),
        "decoder.1.block.1.conv.weight": (1536, 768, 16),
        "decoder.4.block.4.conv1.conv.weight": (96, 96, 7),
        "decoder.4.block.4.act2.beta": (96,),
        "decoder.5.alpha": (96,),
        "decoder.6.conv.weight": (1, 96, 7),
    }.items():
        assert tuple(state[name].shape) == shape, name
    assert len(state) == 1 + 8 * 11 + 1 + 2 * 11 + 2 + 4 * (4 + 3 * 8) + 2 + 2
    assert model.total_upsample == model.samples_per_frame == 1920
    assert model.lookahead_samples == 555
    assert [model.output_samples(f) for f in (0, 1, 2, 300)] == [0, 1365, 3285, 575445]
    assert model.sample_rate == 24000


def test_the_codec_modules_are_qwen3_tts_ones():
    """One implementation: code2wav is the TTS codec decoder with its own embedding."""
    model = _model(_config())
    assert isinstance(model, tts_decoder.CodecDecoder)
    assert type(model.pre_transformer) is tts_decoder.CodecTransformer
    assert type(model.decoder[1]) is tts_decoder.DecoderBlock
    assert model.decoder[1].block[1].left_trim == 8
    tts = json.loads((TTS_PRESETS / "tiny" / "speech_tokenizer" / "config.json").read_text())
    from omni_qwen3_tts.config import DecoderConfig

    tts_model = tts_decoder.Decoder(DecoderConfig.from_dict(tts["decoder_config"]))
    assert tts_model.lookahead_samples == 0
    assert tts_model.decoder[1].block[1].left_trim == 0


# -- full decode ----------------------------------------------------------------------


@pytest.mark.parametrize("frames", [1, 2, 7])
def test_decode_shape_range_and_samples_per_frame(windowed, frames: int):
    cfg = windowed.cfg
    wav = windowed.decode(_codes(cfg, frames, batch=2))
    assert wav.shape == (2, 1, frames * 1920 - 555) and wav.dtype == torch.float32
    assert torch.isfinite(wav).all() and float(wav.abs().max()) <= 1.0
    assert float(wav.std()) > 1e-2  # a signal, not silence
    assert float((wav.abs() >= 1).float().mean()) < 0.01  # and not clipping


def test_decode_of_no_frames_is_empty(windowed):
    assert windowed.decode(_codes(windowed.cfg, 0)).shape == (1, 1, 0)


def test_decode_refuses_another_codebook_count(windowed):
    with pytest.raises(ValueError, match="expects 16 codebooks, got 15"):
        windowed.decode(_codes(windowed.cfg, 3)[:, :15])


def test_decoding_more_frames_extends_the_audio(windowed):
    """Causal up to the look-ahead: a longer decode starts with the shorter one's samples."""
    codes = _codes(windowed.cfg, 12, seed=2)
    short, full = windowed.decode(codes[..., :5]), windowed.decode(codes)
    assert _rel(full[..., : short.shape[-1]], short) < 1e-5


# -- streaming --------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_stream_in_fixed_chunks_equals_full_decode(windowed, chunk: int):
    cfg = windowed.cfg
    codes = _codes(cfg, 30, seed=3)
    assert codes.shape[-1] > 3 * cfg.sliding_window  # the key/value window is trimmed
    full = windowed.decode(codes)
    state = windowed.new_stream()
    pieces = []
    for start in range(0, 30, chunk):
        piece = windowed.stream(codes[..., start : start + chunk], state)
        frames = min(chunk, 30 - start)
        assert piece.shape[-1] == frames * 1920 - (555 if start == 0 else 0)
        assert piece.dtype == torch.float32
        pieces.append(piece)
    assert int(state.position[0]) == 30 and int(state.valid[0]) == cfg.sliding_window - 1
    streamed = torch.cat(pieces, dim=-1)
    assert streamed.shape == full.shape
    assert _rel(streamed, full) < 1e-5
    torch.testing.assert_close(streamed, full, atol=1e-5, rtol=0)


def test_stream_in_uneven_chunks_equals_full_decode(windowed):
    codes = _codes(windowed.cfg, 30, seed=4)
    state, pieces, start = windowed.new_stream(), [], 0
    for size in (2, 1, 5, 0, 3, 4, 9, 6):  # an empty chunk changes nothing
        pieces.append(windowed.stream(codes[..., start : start + size], state))
        start += size
    torch.testing.assert_close(torch.cat(pieces, -1), windowed.decode(codes), atol=1e-5, rtol=0)


def test_batched_streams_starting_together_equal_each_alone(windowed):
    codes = _codes(windowed.cfg, 11, batch=3, seed=5)
    state = windowed.new_stream(batch=3)
    wav = torch.cat([windowed.stream(codes[..., s : s + 4], state) for s in (0, 4, 8)], -1)
    for row in range(3):
        alone = windowed.decode(codes[row : row + 1])
        torch.testing.assert_close(wav[row : row + 1], alone, atol=1e-5, rtol=0)


def test_stacked_streams_at_different_stages_equal_each_alone(windowed):
    """A starting row batches with continuing ones: their audio differs only in length."""
    cfg = windowed.cfg
    ahead, behind, late = (_codes(cfg, n, seed=s) for n, s in ((26, 6), (20, 7), (12, 8)))
    first, second, third = (windowed.new_stream() for _ in range(3))
    heard = {0: [windowed.stream(ahead[..., :6], first)], 1: [], 2: []}
    for step, start in enumerate(range(0, 20, 4)):
        rows = [first, second] + ([third] if step >= 2 else [])
        chunks = [ahead[..., 6 + start : 10 + start], behind[..., start : start + 4]]
        if step >= 2:
            chunks.append(late[..., 4 * (step - 2) : 4 * (step - 1)])
        both = StreamState.stack(rows)
        if step in (0, 2):  # a row starts: one tensor cannot hold rows of different lengths
            with pytest.raises(ValueError, match="stream_rows"):
                windowed.stream(torch.cat(chunks), both)
        audio = windowed.stream_rows(torch.cat(chunks), both)
        for index, (state, row) in enumerate(zip(rows, both.split([1] * len(rows)), strict=True)):
            state.adopt(row)
            heard[index].append(audio[index][None])
    expected = {0: ahead, 1: behind, 2: late[..., :12]}
    for index, codes in expected.items():
        got = torch.cat(heard[index], -1)
        torch.testing.assert_close(got, windowed.decode(codes), atol=1e-5, rtol=0)


def test_a_refused_chunk_leaves_the_streams_untouched(windowed):
    """``stream`` refuses a mixed batch before decoding anything."""
    codes = _codes(windowed.cfg, 8, batch=2, seed=9)
    fresh, going = windowed.new_stream(), windowed.new_stream()
    opening = windowed.stream(codes[1:, :, :3], going)
    both = StreamState.stack([fresh, going])
    with pytest.raises(ValueError):
        windowed.stream(codes[..., 3:5], both)
    assert both.position.tolist() == [0, 3]
    rest = windowed.stream(codes[1:, :, 3:], going)
    torch.testing.assert_close(
        torch.cat([opening, rest], -1), windowed.decode(codes[1:]), atol=1e-5, rtol=0
    )


def test_a_stream_refuses_codes_of_another_batch_size(windowed):
    with pytest.raises(ValueError, match="codes have 2 rows, the stream 1"):
        windowed.stream(_codes(windowed.cfg, 3, batch=2), windowed.new_stream())


def test_release_style_chunked_decode_loses_the_lookahead_at_each_boundary(windowed):
    """Re-decoding left context per chunk (the release's ``chunked_decode``) drops samples."""
    codes = _codes(windowed.cfg, 20, seed=10)
    full = windowed.decode(codes)
    chunked = windowed.chunked_decode(codes, chunk_size=8, left_context=3)
    assert chunked.shape[-1] == full.shape[-1] - 2 * 555  # three chunks, two inner boundaries


def test_captured_chunks_cut_the_lead_of_rows_that_start_beside_rows_that_continue(windowed):
    """The chunks as CUDA graphs would run them (``stream_graphs``, with the CPU's
    stand-in): each row's lead is tracked on the device and cut by the host's flags."""
    from omni_core.engine.cuda_graphs import FixedAddressReplay
    from omni_qwen3_tts.speech_tokenizer.stream_graphs import StreamGraphs

    graphs = StreamGraphs(windowed, [1, 2], [3], FixedAddressReplay)
    early, late = _codes(windowed.cfg, 9, seed=4), _codes(windowed.cfg, 6, seed=5)
    first, second = windowed.new_stream(), windowed.new_stream()
    with torch.inference_mode():
        heard_early = [graphs.decode(early[..., :3], [first])[0].clone()]
        rows = graphs.decode(torch.cat([early[..., 3:6], late[..., :3]]), [first, second])
        heard_early.append(rows[0].clone())
        heard_late = [rows[1].clone()]
        rows = graphs.decode(torch.cat([late[..., 3:6], early[..., 6:9]]), [second, first])
        heard_late.append(rows[0].clone())
        heard_early.append(rows[1].clone())
    assert graphs.replays == 3
    from torch._subclasses.fake_tensor import FakeTensorMode  # nothing read from the device

    with torch.inference_mode():
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        fake = [mode.from_tensor(t) for t in graphs.graphs[(2, 3)].inputs]
        with mode:
            graphs._chunk(*fake)
    for heard, codes in ((heard_early, early), (heard_late, late)):
        full = windowed.decode(codes)[0]
        assert _rel(torch.cat(heard, -1), full) < 1e-5
