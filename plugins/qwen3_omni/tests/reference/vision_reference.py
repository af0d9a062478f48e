"""Record reference image preprocessing and vision-tower outputs (run by the reference python).

Usage: ``vision_reference.py OUT_DIR``. Runs under the reference environment
(transformers 4.57.3), never under ours. Writes to OUT_DIR:

- ``vision.safetensors``: the tiny ``Qwen3OmniMoeVisionEncoder``'s state_dict
  (names as under ``thinker.visual.`` in a release checkpoint);
- ``vision_config.json``: that encoder's config;
- ``preprocessor_config.json`` and ``preprocessor_small.json``: the release's
  image settings, and the same with a small ``max_pixels`` (downscaling path);
- ``reference.json``: which image processor class ran, grids, notes;
- ``reference.npz``: the synthetic input images (uint8), each one's
  ``pixel_values``, the concatenated batch fed to the encoder, its
  ``grid_thw``, the output ``embeds`` and ``deepstack_<k>``, and the slow
  (PIL) processor's pixel values for the record.

The fast image processor needs torchvision. A CPU-only torch cannot load the
C++ extension of a torchvision wheel built for CUDA, and torchvision's
``_meta_registrations`` then fails at import; it only registers shape
functions for torchvision's own C++ ops (nms, roi_align, ...), which image
resizing never calls, so it is replaced by an empty module before import.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import numpy as np
import torch

sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("_stub"))

from safetensors.torch import save_file  # noqa: E402
from transformers import AutoImageProcessor  # noqa: E402
from transformers.models.qwen2_vl.image_processing_qwen2_vl import (  # noqa: E402
    Qwen2VLImageProcessor,
)
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (  # noqa: E402
    Qwen3OmniMoeVisionEncoderConfig,
)
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (  # noqa: E402
    Qwen3OmniMoeVisionEncoder,
)

PREPROCESSOR = {
    "feature_extractor_type": "WhisperFeatureExtractor",
    "feature_size": 128,
    "hop_length": 160,
    "n_fft": 400,
    "n_samples": 4800000,
    "sampling_rate": 16000,
    "image_processor_type": "Qwen2VLImageProcessor",
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "nb_max_frames": 30000,
    "processor_class": "Qwen3OmniMoeProcessor",
}
SMALL = {**PREPROCESSOR, "max_pixels": 128 * 128}

VISION = {
    "depth": 3,
    "hidden_size": 32,
    "hidden_act": "gelu_pytorch_tanh",
    "intermediate_size": 64,
    "num_heads": 4,
    "in_channels": 3,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": 48,
    "num_position_embeddings": 64,
    "deepstack_visual_indexes": [0, 2],
}

# (height, width): no resize; resize down to 64x64 (80->64, 48->64 by rounding);
# scaled up to min_pixels; a mild downscale with an odd shape.
SIZES = [(64, 96), (80, 48), (20, 30), (150, 230)]
SMALL_SIZE = (300, 500)  # with max_pixels 128*128: the shrink branch of smart_resize


def synthetic_image(height: int, width: int, seed: int) -> np.ndarray:
    """Gradients plus seeded noise and a hard edge: smooth areas and bicubic overshoot both."""
    rng = np.random.default_rng(seed)
    y = np.linspace(0.0, 1.0, height)[:, None]
    x = np.linspace(0.0, 1.0, width)[None, :]
    base = np.stack([200 * y + 0 * x, 180 * x + 0 * y, 120 * (x + y) / 2], axis=-1)
    base = base + rng.normal(0.0, 25.0, size=(height, width, 3))
    base[: height // 3, : width // 4] = 255.0
    return np.clip(np.rint(base), 0, 255).astype(np.uint8)


def randomise(model: torch.nn.Module) -> None:
    """Weights of a visible scale, so every path changes the outputs measurably."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            if "norm" in name or "ln_q" in name:
                param.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * noise)
            elif name.endswith("bias"):
                param.copy_(0.05 * noise)
            elif name == "pos_embed.weight":
                param.copy_(0.5 * noise)
            else:
                fan_in = param[0].numel()
                param.copy_(noise / fan_in**0.5)


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    torch.manual_seed(0)

    arrays: dict[str, np.ndarray] = {}
    report: dict = {}
    for name, config in (
        ("preprocessor_config.json", PREPROCESSOR),
        ("preprocessor_small.json", SMALL),
    ):
        (out / name).write_text(json.dumps(config, indent=1))

    proc_dir = out / "proc"
    proc_dir.mkdir(exist_ok=True)
    (proc_dir / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    fast = AutoImageProcessor.from_pretrained(proc_dir)
    slow = Qwen2VLImageProcessor(
        **{
            k: v
            for k, v in PREPROCESSOR.items()
            if k
            in (
                "image_mean",
                "image_std",
                "patch_size",
                "temporal_patch_size",
                "merge_size",
                "min_pixels",
                "max_pixels",
            )
        }
    )
    report["processor"] = type(fast).__name__
    report["slow_max_abs_diff"] = []

    grids = []
    batch = []
    for i, (h, w) in enumerate(SIZES):
        image = synthetic_image(h, w, seed=10 + i)
        arrays[f"image_{i}"] = image
        got = fast(images=[image], return_tensors="pt")
        pv, grid = got["pixel_values"].float(), got["image_grid_thw"]
        arrays[f"pixel_values_{i}"] = pv.numpy()
        arrays[f"grid_{i}"] = grid.numpy()
        slow_pv = slow(images=[image], return_tensors="pt")["pixel_values"]
        arrays[f"slow_pixel_values_{i}"] = slow_pv.numpy()
        report["slow_max_abs_diff"].append(float((slow_pv - pv).abs().max()))
        grids.append(grid)
        batch.append(pv)

    image = synthetic_image(*SMALL_SIZE, seed=99)
    small = AutoImageProcessor.from_pretrained(proc_dir, max_pixels=SMALL["max_pixels"])
    got = small(images=[image], return_tensors="pt")
    arrays["image_small"] = image
    arrays["pixel_values_small"] = got["pixel_values"].float().numpy()
    arrays["grid_small"] = got["image_grid_thw"].numpy()

    config = Qwen3OmniMoeVisionEncoderConfig(**VISION)
    config._attn_implementation = "sdpa"
    model = Qwen3OmniMoeVisionEncoder(config).eval().float()
    randomise(model)
    # The encoder batch: the first three images (one unresized, two resized).
    used = [0, 1, 2]
    pixel_values = torch.cat([batch[i] for i in used])
    grid_thw = torch.cat([grids[i] for i in used])
    with torch.no_grad():
        embeds, deepstack = model(pixel_values, grid_thw=grid_thw)
    arrays["batch_pixel_values"] = pixel_values.numpy()
    arrays["batch_grid_thw"] = grid_thw.numpy()
    arrays["embeds"] = embeds.numpy()
    for k, feature in enumerate(deepstack):
        arrays[f"deepstack_{k}"] = feature.numpy()

    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()}, out / "vision.safetensors"
    )
    (out / "vision_config.json").write_text(json.dumps(VISION, indent=1))
    report["grids"] = [g.tolist() for g in grids]
    report["deepstack_count"] = len(deepstack)
    (out / "reference.json").write_text(json.dumps(report, indent=1))
    np.savez(out / "reference.npz", **arrays)


if __name__ == "__main__":
    main()
