"""The MOSS codec's dtype: float32 under ``auto`` (the release's), a bf16 decoder when set.

The release computes the codec in float32 on every device (``loading.py``
says how we know), so ``auto`` keeps it float32 even where bf16 is fast;
``bfloat16`` set explicitly runs the decoder's transformers in bf16 and
keeps the quantizer and the encoder float32. ``omni plan`` prints the
decision as for every stage, and refuses float16 saying why.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from omni_core.cli import main  # noqa: E402
from omni_core.engine.precision import FLAGS_VAR  # noqa: E402
from omni_moss_tts import stages  # noqa: E402
from omni_moss_tts.loading import codec_dtype, load_codec  # noqa: E402

DEMO = str(Path(__file__).parents[3] / "examples" / "moss_tts_demo.toml")
# A bf16 decoder's waveform against float32's, relative L2: bf16 keeps 8 bits of
# mantissa (2^-8 = 0.4% per rounding) and the decoder's four transformers and their
# residual sums compound a few such steps: measured 0.7-0.8% on the tiny codecs (the
# preset's dummy weights here, the release-shaped one of the reference test). 2e-2
# bounds that with room; a stage left float32-cast or a wrong dtype gives 10% or more.
BF16_DECODE_TOL = 2e-2
# A bf16 stream against its own one-pass decode: the same operations on chunks, so
# only the rounding of partial sums differs (measured 0.1-0.4%).
BF16_STREAM_TOL = 1e-2


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.fixture(scope="module")
def codecs():
    cpu = torch.device("cpu")
    return (
        load_codec("tiny", None, "dummy", cpu, 0),
        load_codec("tiny", None, "dummy", cpu, 0, torch.bfloat16),
    )


def test_auto_keeps_the_codec_float32_even_where_bf16_is_fast(monkeypatch) -> None:
    monkeypatch.setenv(FLAGS_VAR, "avx512f amx_tile amx_bf16")
    for requested in (None, "auto"):
        assert codec_dtype(requested, torch.device("cpu")) is torch.float32
        assert codec_dtype(requested, torch.device("cuda")) is torch.float32
    assert codec_dtype("bfloat16", torch.device("cpu")) is torch.bfloat16
    assert codec_dtype("fp32", torch.device("cpu")) is torch.float32


def test_a_bf16_codec_decodes_in_bf16_and_keeps_float32_state(codecs) -> None:
    f32, b16 = codecs
    assert {p.dtype for p in f32.parameters()} == {torch.float32}
    assert {p.dtype for p in b16.decoder.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in b16.quantizer.parameters()} == {torch.float32}
    assert {p.dtype for p in b16.encoder.parameters()} == {torch.float32}
    assert b16.new_stream().kv[0][0][0].dtype is torch.bfloat16

    codes = torch.randint(
        0, 1024, (40, f32.num_quantizers), generator=torch.Generator().manual_seed(3)
    )
    reference, wav = f32.decode(codes), b16.decode(codes)
    assert wav.dtype is torch.float32 and wav.shape == reference.shape
    assert not torch.equal(wav, reference)  # it did compute in bf16
    assert rel_l2(wav, reference) < BF16_DECODE_TOL

    stream, pieces, start = b16.new_stream(), [], 0
    for size in (2, 8, 30):
        pieces.append(b16.stream_rows(codes[start : start + size].T[None], stream)[0][0])
        start += size
    assert rel_l2(torch.cat(pieces), wav) < BF16_STREAM_TOL


def test_a_bf16_codec_encodes_reference_clips_as_float32_does(codecs) -> None:
    f32, b16 = codecs
    clip = 0.1 * torch.randn(3 * 1920 + 100, generator=torch.Generator().manual_seed(4))
    assert torch.equal(b16.encode(clip), f32.encode(clip))


def test_float16_is_refused_when_loading() -> None:
    with pytest.raises(ValueError, match="not implemented yet"):
        load_codec("tiny", None, "dummy", torch.device("cpu"), 0, torch.float16)


def test_the_vocoder_shares_the_engines_codec_unless_set_to_bf16() -> None:
    stages.shared_codec.cache_clear()
    stages.load_model.cache_clear()  # a model cached earlier holds the codec cleared above
    engine_codec = stages.load_model("tiny", "dummy", None, "cpu", 0, None).codec
    auto = stages.create_vocoder("tiny", load_format="dummy")
    assert auto.decoder is engine_codec
    bf16 = stages.create_vocoder("tiny", load_format="dummy", dtype="bfloat16")
    assert bf16.decoder is not engine_codec
    assert next(bf16.decoder.decoder.parameters()).dtype is torch.bfloat16


@pytest.fixture()
def _fresh_plugins(plugins):
    yield


def plan(capsys, *args: str) -> tuple[int, str]:
    code = main(["plan", DEMO, *args, "--no-detect"])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.mark.usefixtures("_fresh_plugins")
def test_omni_plan_prints_the_codecs_dtype_and_why(capsys, monkeypatch) -> None:
    monkeypatch.setenv(FLAGS_VAR, "avx512f amx_tile amx_bf16")
    code, out = plan(capsys)
    assert code == 0, out
    assert "precision tts_engine: bfloat16 (auto: release bf16, CPU has AMX)" in out
    assert "precision vocoder: float32 (auto: release fp32)" in out
    code, out = plan(capsys, "--vocoder.factory.dtype", "bfloat16")
    assert code == 0, out
    assert "precision vocoder: bfloat16 (set; CPU has AMX)" in out


@pytest.mark.usefixtures("_fresh_plugins")
def test_omni_plan_refuses_a_float16_codec_saying_why(capsys) -> None:
    code, out = plan(capsys, "--vocoder.factory.dtype", "float16")
    assert code == 2
    assert "stages.vocoder.factory.dtype" in out
    assert "the release computes it in float32 only" in out


def test_a_bf16_vocoder_is_counted_as_a_codec_copy_beside_the_engines() -> None:
    from omni_moss_tts.memory import CODEC_PARAMS, estimate
    from omni_moss_tts.pipeline import MossTTSPipeline

    shared = MossTTSPipeline()
    apart = MossTTSPipeline()
    vocoder = apart.stage("vocoder")
    vocoder.factory = vocoder.factory.model_copy(update={"dtype": "bfloat16"})
    together = estimate(shared)["tts_engine"].weights_bytes
    alone = estimate(apart)["tts_engine"].weights_bytes
    assert alone - together == CODEC_PARAMS * 4  # the engine's float32 codec of its own


@pytest.mark.usefixtures("_fresh_plugins")
def test_a_bf16_checkpoint_does_not_make_the_codec_bf16(capsys, monkeypatch, tmp_path) -> None:
    """``checkpoint_config = None``: the checkpoint's torch_dtype decides the backbone only."""
    import json
    import shutil

    from omni_moss_tts.source import PRESETS_DIR

    monkeypatch.setenv(FLAGS_VAR, "amx_bf16")
    model = tmp_path / "model"
    shutil.copytree(PRESETS_DIR / "tiny", model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "torch_dtype": "bfloat16"}))
    code, out = plan(capsys, "--model-path", str(model), "--json")
    assert code == 0, out
    precisions = json.loads(out)["precisions"]
    assert precisions["tts_engine"]["reason"] == "auto: checkpoint bf16, CPU has AMX"
    assert precisions["vocoder"] == {"dtype": "float32", "reason": "auto: release fp32"}
