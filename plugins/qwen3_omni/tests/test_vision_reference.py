"""Image preprocessing and vision tower vs transformers 4.57.3 (opt-in: ``-m reference``).

The reference environment (``QWEN_TTS_REF_PYTHON``, see
plugins/qwen3_tts/tests/REFERENCE.md) runs ``reference/vision_reference.py``:
it preprocesses synthetic images with the image processor ``AutoImageProcessor``
returns for the release's ``preprocessor_config.json`` (the torchvision "fast"
one; the environment needs torchvision and Pillow for it) and runs a tiny,
seeded ``Qwen3OmniMoeVisionEncoder`` on three of them, saving its state_dict.
We load that state_dict strictly and compare pixel values (atol 1e-5: the same
uint8 resampling kernel and float32 arithmetic) and the encoder's embeddings
and deepstack features (relative L2 <= 1e-4).
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

from omni_qwen3_omni.config import VisionEncoderConfig  # noqa: E402
from omni_qwen3_omni.vision.encoder import VisionEncoder  # noqa: E402
from omni_qwen3_omni.vision.processor import (  # noqa: E402
    ImageProcessorConfig,
    image_to_patches,
    image_token_count,
)

SCRIPT = Path(__file__).parent / "reference" / "vision_reference.py"

pytestmark = opt_in


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, dict]:
    out = tmp_path_factory.mktemp("vision_reference")
    run_reference(SCRIPT.name, str(out))
    data = np.load(out / "reference.npz")
    report = json.loads((out / "reference.json").read_text())
    return out, {k: data[k] for k in data.files}, report


def _rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


def test_pixel_values_match_the_default_processor(reference):
    out, ref, report = reference
    # The comparison is with the processor the release gets by default in 4.57.3.
    assert report["processor"] == "Qwen2VLImageProcessorFast"
    cfg = ImageProcessorConfig.from_dict(json.loads((out / "preprocessor_config.json").read_text()))
    count = sum(1 for k in ref if k.startswith("image_") and k != "image_small")
    assert count == 4
    for i in range(count):
        rows, grid = image_to_patches(ref[f"image_{i}"], cfg)
        assert list(grid) == ref[f"grid_{i}"].tolist()[0]
        assert cfg.grid_for_size(*ref[f"image_{i}"].shape[:2]) == grid
        np.testing.assert_allclose(rows.numpy(), ref[f"pixel_values_{i}"], rtol=0, atol=1e-5)

    small = ImageProcessorConfig.from_dict(
        json.loads((out / "preprocessor_small.json").read_text())
    )
    rows, grid = image_to_patches(ref["image_small"], small)
    assert list(grid) == ref["grid_small"].tolist()[0]
    np.testing.assert_allclose(rows.numpy(), ref["pixel_values_small"], rtol=0, atol=1e-5)


def test_encoder_matches_reference(reference):
    out, ref, report = reference
    raw = json.loads((out / "vision_config.json").read_text())
    raw["deepstack_visual_indexes"] = tuple(raw["deepstack_visual_indexes"])
    model = VisionEncoder(VisionEncoderConfig(**raw)).eval()
    state = load_file(out / "vision.safetensors")
    result = model.load_state_dict(state, strict=True)
    assert not result.missing_keys and not result.unexpected_keys

    grid = torch.from_numpy(ref["batch_grid_thw"])
    with torch.no_grad():
        embeds, deepstack = model(torch.from_numpy(ref["batch_pixel_values"]), grid)
    tokens = sum(image_token_count(g) for g in grid.tolist())
    assert embeds.shape == (tokens, raw["out_hidden_size"])
    assert _rel_l2(embeds.numpy(), ref["embeds"]) <= 1e-4
    assert len(deepstack) == report["deepstack_count"] == len(raw["deepstack_visual_indexes"])
    for k, feature in enumerate(deepstack):
        assert _rel_l2(feature.numpy(), ref[f"deepstack_{k}"]) <= 1e-4

    # Our own preprocessing of the same images feeds the encoder identically.
    ours = [image_to_patches(ref[f"image_{i}"]) for i in range(3)]
    with torch.no_grad():
        again, _ = model(torch.cat([r for r, _ in ours]), [g for _, g in ours])
    assert _rel_l2(again.numpy(), ref["embeds"]) <= 1e-4
