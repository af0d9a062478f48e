"""The vocoder stage routes the codec decoder's large linear layers on the CPU.

A streamed chunk multiplies 8 to 48 frames' rows (and up to eight times
more at the decoder's last transformer) by every decoder weight, the row
counts where MKL's float32 kernel is slow and oneDNN's is not; the stage
packs the decoder as the engines pack theirs (``factory.pack_weights``).
Every decoder layer is routed, however small (a chunk's rows are where oneDNN
wins at any size); the routed decoder must stream the same audio as a plain one.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from omni_core.engine import cpu_linear  # noqa: E402
from omni_moss_tts import stages  # noqa: E402
from omni_moss_tts.loading import load_codec  # noqa: E402
from omni_moss_tts.pipeline import MossTTSPipeline  # noqa: E402


@pytest.fixture()
def small_threshold(monkeypatch):
    monkeypatch.setattr(cpu_linear, "DEFAULT_MIN_ELEMENTS", 1)
    yield
    stages.shared_codec.cache_clear()  # never leave a packed codec to other tests


@pytest.fixture()
def no_packed_codec_left():
    yield
    stages.shared_codec.cache_clear()


def linear_kinds(codec) -> set[type]:
    return {
        type(m)
        for m in codec.decoder.modules()
        if isinstance(m, (torch.nn.Linear, cpu_linear.PackedLinear))
    }


def stream(codec, codes: torch.Tensor, chunks: list[int]) -> torch.Tensor:
    state, at, parts = codec.new_stream(), 0, []
    with torch.inference_mode():
        for n in chunks:
            parts.append(codec.stream_rows(codes[..., at : at + n], state)[0])
            at += n
    return torch.cat(parts, dim=-1)


@pytest.mark.usefixtures("no_packed_codec_left")
def test_a_cpu_vocoder_streams_through_routed_layers_with_the_same_audio() -> None:
    vocoder = stages.create_vocoder("tiny", load_format="dummy", seed=11)
    plain = load_codec("tiny", None, "dummy", torch.device("cpu"), 11, torch.float32)
    # every layer, though the tiny preset's are far below the engines' size floor
    assert (
        max(m.weight.numel() for m in plain.decoder.modules() if isinstance(m, torch.nn.Linear))
        < cpu_linear.DEFAULT_MIN_ELEMENTS
    )
    assert linear_kinds(vocoder.decoder) == {cpu_linear.PackedLinear}
    assert linear_kinds(plain) == {torch.nn.Linear}
    codes = torch.randint(0, plain.cfg.codebook_size, (1, plain.num_quantizers, 14))
    routed = stream(vocoder.decoder, codes, [2, 8, 4])  # 1-3 rows: MKL; more: oneDNN
    assert routed.shape == (1, 14 * plain.frame_samples)
    torch.testing.assert_close(routed, stream(plain, codes, [2, 8, 4]), rtol=1e-4, atol=1e-5)
    # the engine shares this codec for encoding references, which packing leaves alone
    encoder = vocoder.decoder.encoder.modules()
    assert not any(isinstance(m, cpu_linear.PackedLinear) for m in encoder)


@pytest.mark.usefixtures("small_threshold")
def test_pack_weights_false_keeps_plain_linear_layers() -> None:
    vocoder = stages.create_vocoder("tiny", load_format="dummy", seed=12, pack_weights=False)
    assert linear_kinds(vocoder.decoder) == {torch.nn.Linear}


def test_pack_weights_is_a_vocoder_factory_field_on_by_default() -> None:
    args = MossTTSPipeline.vocoder_args()
    assert args.pack_weights is True
    assert MossTTSPipeline.vocoder_args(pack_weights=False).pack_weights is False
