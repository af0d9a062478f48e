"""The MOSS audio tokenizer: checkpoint names, shapes, streaming == one pass, batching, inputs.

All on a tiny config with the release's module layout (``tiny_codec_config``),
dummy weights, one CPU thread. Agreement with the release itself is checked
by the reference suite; here we check our own invariants.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from omni_moss_tts.codec import (
    AudioTokenizer,
    CodecConfig,
    CodecStream,
    dummy_fill_codec,
    loudness_normalize,
    prepare_reference,
    tiny_codec_config,
)
from omni_moss_tts.codec.attention import Rotation, rope_tables, rotate, rotate_complex
from omni_moss_tts.codec.transformer import ProjectedTransformer

torch.set_num_threads(1)

HOP = 1920


def make(context_seconds: float = 0.4, seed: int = 0, **overrides) -> AudioTokenizer:
    d = tiny_codec_config(context_seconds)
    d.update(overrides)
    tok = AudioTokenizer(CodecConfig.from_dict(d)).eval()
    dummy_fill_codec(tok, seed)
    return tok


@pytest.fixture(scope="module")
def tok() -> AudioTokenizer:
    return make(0.4)


def random_codes(frames: int, seed: int, rows: int | None = None) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    shape = (frames, 32) if rows is None else (rows, 32, frames)
    return torch.randint(0, 1024, shape, generator=g)


# -- checkpoint layout ---------------------------------------------------------------


def test_state_dict_names_follow_the_release(tok: AudioTokenizer) -> None:
    sd = tok.state_dict()
    expected = {
        "encoder.1.input_proj.weight": (32, 240),
        "encoder.1.transformer.layers.0.self_attn.in_projs.0.weight": (96, 32),
        "encoder.1.transformer.layers.0.self_attn.out_projs.0.weight": (32, 32),
        "encoder.1.transformer.layers.0.norm1.weight": (32,),
        "encoder.1.transformer.layers.0.norm2.bias": (32,),
        "encoder.1.transformer.layers.0.linear1.weight": (64, 32),
        "encoder.1.transformer.layers.0.linear2.weight": (32, 64),
        "encoder.1.transformer.layers.0.layer_scale_1.scale": (32,),
        "encoder.7.transformer.layers.1.layer_scale_2.scale": (48,),
        "encoder.7.output_proj.weight": (32, 48),
        "quantizer.input_proj.parametrizations.weight.original0": (16, 1, 1),
        "quantizer.input_proj.parametrizations.weight.original1": (16, 32, 1),
        "quantizer.input_proj.bias": (16,),
        "quantizer.output_proj.parametrizations.weight.original1": (32, 16, 1),
        "quantizer.quantizers.0.in_proj.parametrizations.weight.original0": (8, 1, 1),
        "quantizer.quantizers.0.in_proj.parametrizations.weight.original1": (8, 16, 1),
        "quantizer.quantizers.31.out_proj.parametrizations.weight.original1": (16, 8, 1),
        "quantizer.quantizers.31.out_proj.bias": (16,),
        "quantizer.quantizers.31.codebook.weight": (1024, 8),
        "decoder.0.input_proj.weight": (48, 32),
        "decoder.0.transformer.layers.1.self_attn.in_projs.0.weight": (144, 48),
        "decoder.6.output_proj.weight": (240, 32),
    }
    for name, shape in expected.items():
        assert tuple(sd[name].shape) == shape, name
    # Identity projections where widths agree, as in the release (no tensors).
    for absent in ("encoder.3.input_proj.weight", "decoder.0.output_proj.weight"):
        assert absent not in sd
    # Folds own no tensors but keep their indices.
    for name in sd:
        top = ".".join(name.split(".")[:2])
        assert top not in {f"encoder.{i}" for i in (0, 2, 4, 6)} | {
            f"decoder.{i}" for i in (1, 3, 5, 7)
        }
    # 10 tensors per layer (10 layers); 10 non-identity transformer projections;
    # 3 per weight-normed conv (bias, g, v): 2 outer, 2 per stage, + 1 codebook per stage.
    assert len(sd) == 10 * 10 + 10 + 2 * 3 + 32 * (2 * 3 + 1)
    assert list(tok.buffers()) == []  # nothing that to_empty would leave uninitialised


def test_meta_build_then_strict_load_round_trip(tmp_path, tok: AudioTokenizer) -> None:
    from safetensors.torch import save_file

    from omni_qwen3_tts.weights import build_empty, load_state

    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in tok.state_dict().items()}, str(path))
    cfg = tok.cfg
    empty = build_empty(lambda: AudioTokenizer(cfg), torch.device("cpu"), torch.float32)
    load_state(empty, [path], "codec")
    codes = random_codes(6, seed=3)
    assert torch.equal(empty.decode(codes), tok.decode(codes))


def test_dummy_weights_decode_to_modest_finite_audio() -> None:
    tok = make(10.0, seed=7)
    wav = tok.decode(random_codes(12, seed=1))
    rms = wav.pow(2).mean().sqrt().item()
    assert torch.isfinite(wav).all()
    assert 0.01 < rms < 0.3


# -- shapes and lengths --------------------------------------------------------------


@pytest.mark.parametrize("samples", [0, 1919, 1920, 3 * HOP + 5, 7 * HOP])
def test_encode_gives_one_row_per_whole_frame(tok: AudioTokenizer, samples: int) -> None:
    wav = torch.randn(samples, generator=torch.Generator().manual_seed(samples)) * 0.1
    codes = tok.encode(wav)
    assert codes.shape == (samples // HOP, 32)
    assert codes.dtype == torch.long
    if codes.numel():
        assert codes.min() >= 0 and codes.max() < 1024


def test_a_partial_last_frame_does_not_change_earlier_codes(tok: AudioTokenizer) -> None:
    wav = torch.randn(4 * HOP + 1000, generator=torch.Generator().manual_seed(5)) * 0.1
    assert torch.equal(tok.encode(wav), tok.encode(wav[: 4 * HOP]))


def test_decode_length_and_every_codebook_matters(tok: AudioTokenizer) -> None:
    codes = random_codes(5, seed=2)
    wav = tok.decode(codes)
    assert wav.shape == (5 * HOP,) and wav.dtype == torch.float32
    assert tok.decode(codes[:0]).shape == (0,)
    changed = codes.clone()
    changed[:, 31] = (changed[:, 31] + 1) % 1024
    assert (tok.decode(changed) - wav).abs().max() > 1e-6


def test_codes_out_of_range_are_refused(tok: AudioTokenizer) -> None:
    codes = random_codes(3, seed=0)
    codes[1, 4] = 1024
    with pytest.raises(ValueError, match=r"\[0, 1024\)"):
        tok.decode(codes)
    with pytest.raises(ValueError, match="codebooks"):
        tok.decode(torch.zeros(3, 33, dtype=torch.long))


def test_encode_is_deterministic_and_batch_encode_equals_alone(tok: AudioTokenizer) -> None:
    wav = tok.decode(random_codes(9, seed=4))
    first = tok.encode(wav)
    assert torch.equal(first, tok.encode(wav.clone()))
    short = wav[: 3 * HOP + 17]
    together = tok.encode_batch([short, wav])
    assert torch.equal(together[0], tok.encode(short))
    assert torch.equal(together[1], first)


def test_plain_rvq_quantizer_type_builds_and_round_trips_shapes() -> None:
    d = tiny_codec_config(0.4)
    d["quantizer_kwargs"] = dict(d["quantizer_kwargs"], quantizer_type="rvq")
    tok = AudioTokenizer(CodecConfig.from_dict(d)).eval()
    dummy_fill_codec(tok, 0)
    assert tok.cfg.quantizer.kind == "vq"
    wav = tok.decode(random_codes(4, seed=0))
    assert tok.encode(wav).shape == (4, 32)


# -- rotary positions ----------------------------------------------------------------


def _rotation_case(head_dim: int, steps: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(3, steps, 3, 4, head_dim, generator=g) * 8  # [B, T, 3, H, D]
    x = qkv.permute(2, 0, 3, 1, 4)[0]  # q as the attention sees it: a strided view
    start = torch.randint(0, 5000, (3,), generator=g)
    return x, rope_tables(start, steps, head_dim, 10_000.0)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("steps", [1, 7, 33])
def test_the_complex_rotation_is_the_releases_arithmetic_at_release_head_sizes(
    head_dim: int, steps: int
) -> None:
    """At the release's head size (64) the complex product's vector loops cover every
    pair: it must give the release's float32 bits, and bf16 rows the release's too."""
    x, (cos, sin) = _rotation_case(head_dim, steps, seed=head_dim + steps)
    turn = torch.complex(cos, sin)
    for dtype in (torch.float32, torch.bfloat16):
        assert torch.equal(rotate_complex(x.to(dtype), turn), rotate(x.to(dtype), cos, sin))


def test_the_complex_rotation_is_within_one_rounding_at_any_head_size() -> None:
    for head_dim in (2, 6, 10, 24):
        x, (cos, sin) = _rotation_case(head_dim, 5, seed=head_dim)
        ours, release = rotate_complex(x, torch.complex(cos, sin)), rotate(x, cos, sin)
        assert torch.allclose(ours, release, rtol=1e-6, atol=1e-5), head_dim


def test_the_encoder_rotates_as_the_release_and_the_decoder_by_complex_product(
    tok: AudioTokenizer,
) -> None:
    """The encoder's codes are compared bit for bit with the release's: its rotation
    must stay the release's arithmetic; the decoder's may not pay for it."""
    encoder = [m for m in tok.encoder if isinstance(m, ProjectedTransformer)]
    decoder = [m for m in tok.decoder if isinstance(m, ProjectedTransformer)]
    assert encoder and decoder
    assert all(m.exact_rotation for m in encoder)
    assert not any(m.exact_rotation for m in decoder)
    x, (cos, sin) = _rotation_case(8, 3, seed=1)
    assert Rotation(cos, sin, exact=True).turn is None
    fast = Rotation(cos, sin, exact=False)
    assert torch.allclose(fast(x), rotate(x, cos, sin), rtol=1e-6, atol=1e-5)


# -- streaming -----------------------------------------------------------------------


def stream(tok: AudioTokenizer, codes: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    state = tok.new_stream()
    out, at = [], 0
    for size in sizes:
        (row,) = tok.stream_rows(codes[at : at + size].t()[None], state)
        assert row.shape == (1, size * HOP)
        out.append(row[0])
        at += size
    assert at == codes.shape[0]
    return torch.cat(out)


def windows(tok: AudioTokenizer) -> list[int]:
    return [m.window for m in tok.decoder if isinstance(m, ProjectedTransformer)]


@pytest.mark.parametrize(
    "sizes",
    [[1] * 26, [3] * 8 + [2], [7, 7, 7, 5], [2, 5, 1, 7, 3, 1, 4, 3], [26]],
    ids=["by-1", "by-3", "by-7", "mixed", "one-chunk"],
)
def test_stream_equals_one_pass_beyond_the_window(tok: AudioTokenizer, sizes: list[int]) -> None:
    assert windows(tok) == [5, 10, 20, 40]  # 0.4 s at 12.5, 25, 50, 100 Hz: 5 frames each
    codes = random_codes(26, seed=11)
    full = tok.decode(codes)
    assert (stream(tok, codes, sizes) - full).abs().max() < 1e-5


def test_stream_equals_one_pass_within_a_long_window() -> None:
    tok = make(10.0)
    codes = random_codes(13, seed=12)
    assert (stream(tok, codes, [4, 1, 6, 2]) - tok.decode(codes)).abs().max() < 1e-5


def test_the_window_bounds_memory_and_influence(tok: AudioTokenizer) -> None:
    codes = random_codes(30, seed=13)
    state = tok.new_stream()
    for at in range(0, 30, 4):
        tok.stream_rows(codes[at : at + 4].t()[None], state)
    carried = [stage[0][0].shape[2] for stage in state.kv]
    assert carried == [w - 1 for w in windows(tok)]
    assert state.position.tolist() == [30]
    # A frame's influence ends: four stages of 5-frame windows look back < 20 frames.
    changed = codes.clone()
    changed[0] = (changed[0] + 1) % 1024
    a, b = tok.decode(codes), tok.decode(changed)
    assert (a[:HOP] - b[:HOP]).abs().max() > 1e-6
    assert (a[20 * HOP :] - b[20 * HOP :]).abs().max() < 1e-6


def test_batched_streams_of_different_ages_equal_each_alone(tok: AudioTokenizer) -> None:
    """Like the vocoder: stack the streams of a round, decode once, split and adopt."""
    lengths = {"a": 19, "b": 9, "c": 14}
    codes = {name: random_codes(n, seed=20 + i) for i, (name, n) in enumerate(lengths.items())}
    states = {name: tok.new_stream() for name in lengths}
    audio: dict[str, list[torch.Tensor]] = {name: [] for name in lengths}
    done = dict.fromkeys(lengths, 0)
    # Rounds: who takes part and how many frames everyone in the round gets.
    rounds = [(["a"], 6), (["a", "b"], 3), (["a", "b", "c"], 2), (["c", "a"], 5), (["b", "c"], 4)]
    rounds += [(["a", "c"], 1), (["a", "c"], 2)]  # the last: the same rows again, no copy
    previous = None
    for names, n in rounds:
        batch = torch.stack([codes[x][done[x] : done[x] + n].t() for x in names])
        joint = type(states[names[0]]).stack([states[x] for x in names])
        assert (joint is previous) == (n == 2 and names == ["a", "c"])
        previous = joint
        rows = tok.stream_rows(batch, joint)
        for x, part in zip(names, joint.split([1] * len(names)), strict=True):
            if len(names) > 1:
                states[x].adopt(part)
        for x, row in zip(names, rows, strict=True):
            audio[x].append(row[0])
            done[x] += n
    assert done == lengths
    for name in lengths:
        alone = tok.decode(codes[name])
        assert (torch.cat(audio[name]) - alone).abs().max() < 1e-5, name


def test_stack_split_adopt_keep_rows() -> None:
    tok = make(0.4)
    a, b = tok.new_stream(), tok.new_stream(2)
    tok.stream_rows(random_codes(3, seed=1, rows=1), a)
    joint = CodecStream.stack([a, b])
    assert joint.batch == 3 and joint.position.tolist() == [3, 0, 0]
    # The younger rows are padded in front to the older row's carried length.
    assert {stage[0][0].shape[2] for stage in joint.kv} == {3, 6, 12, 24}
    parts = joint.split([1, 2])
    assert [p.batch for p in parts] == [1, 2]
    assert torch.equal(parts[0].kv[3][0][0], a.kv[3][0][0])
    b.adopt(parts[1])
    assert b.batch == 2 and b.position.tolist() == [0, 0]
    with pytest.raises(ValueError, match="add up"):
        joint.split([1, 1])


def test_stacking_a_splits_parts_again_reuses_their_state_only_while_they_are_its_rows(
    tok: AudioTokenizer,
) -> None:
    """Streams that come back together, in the same order, are the state they were
    split from (no copy of every layer's keys); any other grouping, or a row that
    advanced on its own meanwhile, is stacked anew."""
    a, b, c = tok.new_stream(), tok.new_stream(), tok.new_stream()
    tok.stream_rows(random_codes(3, seed=40, rows=1), a)  # a is older: b and c are padded
    joint = CodecStream.stack([a, b, c])
    tok.stream_rows(random_codes(2, seed=41, rows=3), joint)
    for stream, part in zip((a, b, c), joint.split([1, 1, 1]), strict=True):
        stream.adopt(part)
    assert CodecStream.stack([a, b, c]) is joint
    assert CodecStream.stack([b, a, c]) is not joint
    assert CodecStream.stack([a, b]) is not joint
    regrouped = CodecStream.stack([b, a, c])
    assert regrouped.position.tolist() == [2, 5, 2]
    assert torch.equal(regrouped.kv[0][0][0][1], joint.kv[0][0][0][0])
    tok.stream_rows(random_codes(1, seed=42, rows=1), a)  # a advances alone
    again = CodecStream.stack([a, b, c])
    assert again is not joint
    assert again.position.tolist() == [6, 2, 2]
    for stream, part in zip((a, b, c), again.split([1, 1, 1]), strict=True):
        stream.adopt(part)
    assert CodecStream.stack([a, b, c]) is again
    tok.stream_rows(random_codes(1, seed=43, rows=3), again)  # it advances, its parts do not
    assert CodecStream.stack([a, b, c]) is not again


# -- preparing a reference clip ------------------------------------------------------


def dbfs(x: torch.Tensor) -> float:
    return 10 * math.log10(float(x.pow(2).mean()))


@pytest.mark.parametrize(("level", "gain"), [(-21.0, 1.0), (-40.0, 3.0), (-6.0, -3.0)])
def test_loudness_moves_towards_minus_20_dbfs_by_at_most_3_db(level: float, gain: float) -> None:
    x = torch.randn(24000, generator=torch.Generator().manual_seed(0))
    x = x / x.pow(2).mean().sqrt() * 10 ** (level / 20)
    out = loudness_normalize(x)
    assert dbfs(out) - dbfs(x) == pytest.approx(gain, abs=1e-3)
    assert torch.equal(loudness_normalize(torch.zeros(0)), torch.zeros(0))


def test_prepare_reference_mono_and_rate() -> None:
    g = torch.Generator().manual_seed(1)
    left, right = torch.randn(4800, generator=g) * 0.1, torch.randn(4800, generator=g) * 0.1
    mono = prepare_reference(torch.stack([left, right]), 24000)
    expected = loudness_normalize((left + right) / 2)
    assert torch.allclose(mono, expected, atol=1e-6)
    # soundfile's [N, C] layout gives the same.
    channels_last = np.stack([left.numpy(), right.numpy()], axis=1)
    assert torch.allclose(prepare_reference(channels_last, 24000), expected, atol=1e-6)
    # 48 kHz in: half as many samples out, a tone keeps its frequency.
    t = np.arange(48000) / 48000
    tone = prepare_reference(np.sin(2 * np.pi * 440 * t).astype(np.float32) * 0.1, 48000)
    assert tone.shape[0] == 24000 and tone.dtype == torch.float32
    spectrum = np.abs(np.fft.rfft(tone.numpy()))
    assert abs(int(spectrum.argmax()) - 440) <= 1  # 1 Hz bins over one second


# -- config --------------------------------------------------------------------------


def test_config_contexts_and_aliases() -> None:
    cfg = CodecConfig.from_dict(tiny_codec_config(0.4))
    assert [s.context for s in cfg.encoder if hasattr(s, "context")] == [40, 20, 10, 5]
    assert [s.context for s in cfg.decoder if hasattr(s, "context")] == [5, 10, 20, 40]
    assert cfg.frame_rate == 12.5 and cfg.num_quantizers == 32
    d = tiny_codec_config()
    d["sample_rate"] = d.pop("sampling_rate")
    tok = AudioTokenizer(CodecConfig.from_dict(d))
    assert (tok.sample_rate, tok.frame_samples, tok.num_quantizers) == (24000, 1920, 32)


def _broken(path: list, value) -> dict:
    d = tiny_codec_config()
    target = d
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return d


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (["sampling_rate"], 48000, r"sampling_rate is 48000: .*48 kHz stereo 'v2'"),
        (["number_channels"], 2, r"number_channels is 2: .*MossTTSLocal"),
        (["downsample_rate"], 960, r"encoder_kwargs: the patch sizes \[240, 2, 2, 2\] multiply"),
        (["decoder_kwargs", 7, "patch_size"], 120, r"decoder_kwargs: the patch sizes .* to 960"),
        (["decoder_kwargs", 1, "patch_size"], 5, r"decoder_kwargs\[1\].patch_size 5 does not"),
        (["encoder_kwargs", 0, "patch_size"], 120, r"encoder_kwargs\[1\].input_dimension is 240"),
        (["encoder_kwargs", 1, "gating"], "gelu", r"encoder_kwargs\[1\].gating is 'gelu'"),
        (["decoder_kwargs", 0, "norm"], "rms_norm", r"decoder_kwargs\[0\].norm"),
        (["decoder_kwargs", 2, "positional_embedding"], KeyError, r"defaults? is 'sin'"),
        (["decoder_kwargs", 2, "causal"], False, r"decoder_kwargs\[2\].causal"),
        (["decoder_kwargs", 2, "module_type"], "Conv", r"decoder_kwargs\[2\].module_type"),
        (["decoder_kwargs", 2, "num_heads"], 3, r"not divisible by num_heads"),
        (["decoder_kwargs", 2, "input_dimension"], 20, r"decoder_kwargs\[2\].input_dimension"),
        (["encoder_kwargs", 3, "dropout"], 0.1, r"unknown key\(s\) for Transformer: dropout"),
        (["quantizer_kwargs", "quantizer_type"], "fsq", r"quantizer_kwargs.quantizer_type"),
        (["quantizer_kwargs", "input_dim"], 64, r"quantizer_kwargs.input_dim is 64"),
        (["causal_transformer_context_duration"], 0.01, r"window of 0 positions"),
    ],
)
def test_config_errors_name_the_key(path: list, value, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CodecConfig.from_dict(_broken(path, value))
