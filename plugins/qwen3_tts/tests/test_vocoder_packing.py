"""The vocoder stage routes a float32 codec decoder's linear layers on the CPU.

A streamed chunk multiplies tens to hundreds of rows by each decoder weight,
where oneDNN's float32 kernel outruns MKL's whatever the layer's size, so the
stage routes every layer (``factory.pack_weights``), not only the large ones
the engines route. Qwen3-Omni's code2wav is the same factory over its own
decoder. The routed decoder must stream the same audio as a plain one.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from omni_core.engine import cpu_linear  # noqa: E402
from omni_qwen3_tts import stages  # noqa: E402
from omni_qwen3_tts.pipeline import Qwen3TTSPipeline  # noqa: E402

pytestmark = pytest.mark.skipif(
    not cpu_linear.packing_available(), reason="this torch build has no oneDNN linear kernel"
)


@pytest.fixture()
def fresh_codecs():
    stages.load_codec.cache_clear()  # a codec another test packed (or left plain) is not ours
    yield
    stages.load_codec.cache_clear()  # never leave a packed codec to other tests


def linear_kinds(decoder) -> set[type]:
    return {
        type(m)
        for m in decoder.modules()
        if isinstance(m, (torch.nn.Linear, cpu_linear.PackedLinear))
    }


def decode(vocoder, codes: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return vocoder.decoder.decode_chunk(codes, 0)


@pytest.mark.usefixtures("fresh_codecs")
def test_a_float32_cpu_vocoder_routes_every_linear_layer_with_the_same_audio() -> None:
    plain = stages.create_vocoder("tiny", load_format="dummy", seed=5, pack_weights=False)
    assert linear_kinds(plain.decoder) == {torch.nn.Linear}
    codes = torch.randint(0, 64, (2, plain.decoder.cfg.num_quantizers, 6))
    expected = decode(plain, codes)
    stages.load_codec.cache_clear()
    routed = stages.create_vocoder("tiny", load_format="dummy", seed=5)
    # every layer, though the tiny preset's are far below the engines' size floor
    weights = [m.weight for m in routed.decoder.modules() if hasattr(m, "weight")]
    assert max(w.numel() for w in weights) < cpu_linear.DEFAULT_MIN_ELEMENTS
    assert linear_kinds(routed.decoder) == {cpu_linear.PackedLinear}
    torch.testing.assert_close(decode(routed, codes), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.usefixtures("fresh_codecs")
def test_a_bf16_vocoder_is_left_as_it_was() -> None:
    vocoder = stages.create_vocoder("tiny", load_format="dummy", seed=5, dtype="bfloat16")
    assert linear_kinds(vocoder.decoder) == {torch.nn.Linear}
    assert stages.route_float32_layers(vocoder.decoder) == 0


def test_pack_weights_is_a_vocoder_factory_field_on_by_default() -> None:
    assert Qwen3TTSPipeline.vocoder_args().pack_weights is True
    assert Qwen3TTSPipeline.vocoder_args(pack_weights=False).pack_weights is False
