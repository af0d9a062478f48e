"""Turn one RGB image into the flat patch rows the vision tower reads.

What the released checkpoint was trained on decides every step here, so each
one follows the image processor that transformers 4.57.3 hands out for the
Qwen3-Omni ``preprocessor_config.json`` (the torchvision-backed "fast"
Qwen2-VL processor, the default since 4.52):

1. size: :func:`smart_resize` picks a height and width that are multiples of
   ``patch_size * merge_size`` (32) with a pixel count inside
   ``[min_pixels, max_pixels]``, keeping the aspect ratio close;
2. resample: bicubic with antialiasing, run by torch's native *uint8* kernel on
   the CPU. That is what torchvision does for a uint8 image on the CPU, and it
   is not the same as resampling in float and rounding: the uint8 kernel
   stores the horizontal pass as uint8 before the vertical pass, which moves
   values by several levels near sharp edges. (PIL's bicubic, used by the slow
   processor, differs again: up to ~0.055 after normalisation.) We call
   ``torch.nn.functional.interpolate`` directly, so torchvision is not needed;
3. scale and normalise in float32 as ``(x - mean * 255) / (std * 255)``, the
   fused form the fast processor computes (the release: mean = std = 0.5);
4. patches: the still image is repeated to ``temporal_patch_size`` frames and
   cut into ``patch_size`` squares, ordered so that each ``merge_size`` x
   ``merge_size`` block of neighbouring patches is contiguous (the merger
   after the ViT folds exactly those rows into one token). A row holds
   ``channel, frame, y, x`` with x fastest: ``C * T * P * P`` values, the
   layout the Conv3d patch embedding expects.

Everything but :func:`image_to_patches` is torch-free, so the prompt builder
can count placeholder tokens (:func:`image_token_count`,
:meth:`ImageProcessorConfig.grid_for_size`) without importing torch.

Video goes through the same patch layout with ``temporal_patch_size``
consecutive frames per temporal patch; which frames, and the two resizes the
release applies to them, are in :mod:`.video`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from ..config import VisionEncoderConfig

# The values the released preprocessor_config.json sets (Qwen3-Omni-30B-A3B-*).
RELEASE_PATCH_SIZE = 16
RELEASE_TEMPORAL_PATCH_SIZE = 2
RELEASE_MERGE_SIZE = 2
RELEASE_MIN_PIXELS = 3136  # 56 * 56
RELEASE_MAX_PIXELS = 12845056  # 3584 * 3584
RELEASE_MEAN = (0.5, 0.5, 0.5)
RELEASE_STD = (0.5, 0.5, 0.5)
RESCALE_FACTOR = 1 / 255
MAX_ASPECT_RATIO = 200
_BICUBIC = 3  # PIL's enum value for BICUBIC, as preprocessor_config.json spells "resample"


def smart_resize(
    height: int,
    width: int,
    factor: int = RELEASE_PATCH_SIZE * RELEASE_MERGE_SIZE,
    min_pixels: int = RELEASE_MIN_PIXELS,
    max_pixels: int = RELEASE_MAX_PIXELS,
) -> tuple[int, int]:
    """The ``(height, width)`` an image is resampled to before it is cut into patches.

    Both sides become multiples of ``factor`` (so whole merge blocks tile the
    image). Each side is first rounded to the nearest multiple (Python's
    ``round``: halves go to the even multiple, as in the reference). If the
    area then exceeds ``max_pixels`` both sides shrink by the same ratio and
    round *down*; if it falls below ``min_pixels`` they grow and round *up*.
    Aspect ratios beyond 200:1 are refused, as the reference refuses them.
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"image size must be positive, got {height}x{width}")
    ratio = max(height, width) / min(height, width)
    if ratio > MAX_ASPECT_RATIO:
        raise ValueError(
            f"image aspect ratio {ratio:.1f} ({height}x{width}) exceeds {MAX_ASPECT_RATIO}: "
            "the vision preprocessing refuses such images"
        )
    new_h = round(height / factor) * factor
    new_w = round(width / factor) * factor
    if new_h * new_w > max_pixels:
        shrink = math.sqrt(height * width / max_pixels)
        new_h = max(factor, math.floor(height / shrink / factor) * factor)
        new_w = max(factor, math.floor(width / shrink / factor) * factor)
    elif new_h * new_w < min_pixels:
        grow = math.sqrt(min_pixels / (height * width))
        new_h = math.ceil(height * grow / factor) * factor
        new_w = math.ceil(width * grow / factor) * factor
    return new_h, new_w


def image_token_count(grid_thw: Sequence[int], merge_size: int = RELEASE_MERGE_SIZE) -> int:
    """Placeholder tokens one image takes in the prompt: ``t * h * w / merge_size**2``.

    ``grid_thw`` is the patch grid :func:`image_to_patches` returns; the merger
    turns each ``merge_size`` x ``merge_size`` block of patches into one
    embedding, so this is also the number of rows the encoder returns.
    """
    t, h, w = (int(v) for v in grid_thw)
    if h % merge_size or w % merge_size:
        raise ValueError(f"grid {t}x{h}x{w} is not whole {merge_size}x{merge_size} merge blocks")
    return t * h * w // (merge_size * merge_size)


@dataclass(frozen=True)
class ImageProcessorConfig:
    """The image half of ``preprocessor_config.json`` (the audio extractor shares the file).

    Defaults are the release's values. A key the file leaves out gets the
    release's value, not transformers' Qwen2-VL class default (patch 14, CLIP
    mean/std, 1003520 max pixels): those would not fit a Qwen3-Omni tower.
    """

    patch_size: int = RELEASE_PATCH_SIZE
    temporal_patch_size: int = RELEASE_TEMPORAL_PATCH_SIZE
    merge_size: int = RELEASE_MERGE_SIZE
    min_pixels: int = RELEASE_MIN_PIXELS
    max_pixels: int = RELEASE_MAX_PIXELS
    image_mean: tuple[float, ...] = RELEASE_MEAN
    image_std: tuple[float, ...] = RELEASE_STD
    rescale_factor: float = RESCALE_FACTOR
    do_resize: bool = True
    do_rescale: bool = True
    do_normalize: bool = True

    def __post_init__(self) -> None:
        for name in ("patch_size", "temporal_patch_size", "merge_size", "min_pixels"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"preprocessor_config.{name} must be positive")
        if self.max_pixels < self.min_pixels:
            raise ValueError(
                f"preprocessor_config: max_pixels ({self.max_pixels}) < min_pixels "
                f"({self.min_pixels})"
            )
        if len(self.image_mean) != 3 or len(self.image_std) != 3:
            raise ValueError("preprocessor_config: image_mean and image_std need 3 values (RGB)")
        if any(s == 0 for s in self.image_std):
            raise ValueError("preprocessor_config.image_std must not contain 0")

    @property
    def factor(self) -> int:
        """Side lengths are multiples of this: one merge block of patches, in pixels."""
        return self.patch_size * self.merge_size

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ImageProcessorConfig:
        """Read a ``preprocessor_config.json`` dict (or a processor dict with ``image_processor``).

        The pixel bounds may be spelled ``min_pixels``/``max_pixels`` or
        ``size: {shortest_edge, longest_edge}``; as in the reference, the
        explicit ``min_pixels``/``max_pixels`` win when both are present.
        """
        if isinstance(raw.get("image_processor"), Mapping):
            raw = raw["image_processor"]
        picked: dict[str, Any] = {}
        for name in ("patch_size", "temporal_patch_size", "merge_size"):
            if raw.get(name) is not None:
                picked[name] = int(raw[name])
        size = raw.get("size") if isinstance(raw.get("size"), Mapping) else {}
        for name, size_key in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
            value = raw.get(name)
            if value is None:
                value = size.get(size_key, size.get(name))
            if value is not None:
                picked[name] = int(value)
        for name in ("image_mean", "image_std"):
            value = raw.get(name)
            if value is not None:
                values = [value] * 3 if isinstance(value, (int, float)) else list(value)
                picked[name] = tuple(float(v) for v in values)
        if raw.get("rescale_factor") is not None:
            picked["rescale_factor"] = float(raw["rescale_factor"])
        for name in ("do_resize", "do_rescale", "do_normalize"):
            if raw.get(name) is not None:
                picked[name] = bool(raw[name])
        resample = raw.get("resample")
        if resample is not None and int(resample) != _BICUBIC:
            raise ValueError(
                f"preprocessor_config.resample {resample!r}: only bicubic ({_BICUBIC}) is supported"
            )
        return cls(**picked)

    def check_against(self, vision: VisionEncoderConfig) -> None:
        """Refuse a preprocessor whose patch geometry does not fit the vision tower."""
        pairs = (
            ("patch_size", self.patch_size, "patch_size", vision.patch_size),
            (
                "temporal_patch_size",
                self.temporal_patch_size,
                "temporal_patch_size",
                vision.temporal_patch_size,
            ),
            ("merge_size", self.merge_size, "spatial_merge_size", vision.spatial_merge_size),
        )
        for ours, value, theirs, expected in pairs:
            if value != expected:
                raise ValueError(
                    f"preprocessor_config.{ours} ({value}) must equal "
                    f"thinker_config.vision_config.{theirs} ({expected})"
                )

    def resized_size(self, height: int, width: int) -> tuple[int, int]:
        """The size an image of ``height`` x ``width`` is resampled to."""
        if not self.do_resize:
            if height % self.factor or width % self.factor:
                raise ValueError(
                    f"do_resize is off, so the image ({height}x{width}) must already be a "
                    f"multiple of {self.factor} on both sides"
                )
            return height, width
        return smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)

    def grid_for_size(self, height: int, width: int) -> tuple[int, int, int]:
        """The patch grid ``(t, h, w)`` of a still image of that size, without its pixels."""
        new_h, new_w = self.resized_size(height, width)
        return 1, new_h // self.patch_size, new_w // self.patch_size

    def token_count(self, height: int, width: int) -> int:
        """Placeholder tokens a still image of that size takes in the prompt."""
        return image_token_count(self.grid_for_size(height, width), self.merge_size)

    def process(self, image: Any) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """:func:`image_to_patches` with this config's values."""
        return image_to_patches(image, config=self)


def _as_rgb_array(image: Any) -> Any:
    """An ``H x W x 3`` uint8 numpy array from a PIL image or such an array.

    A PIL image in another mode is converted with ``convert("RGB")``, which is
    all the reference does (an alpha channel is dropped, not composited).
    PIL itself is not imported: only a PIL image's own methods are called.
    """
    import numpy as np

    if hasattr(image, "convert") and hasattr(image, "mode"):
        if image.mode != "RGB":
            image = image.convert("RGB")
        image = np.asarray(image)
    if not isinstance(image, np.ndarray):
        raise TypeError(
            f"expected a PIL image or an HxWx3 uint8 numpy array, got {type(image).__name__}"
        )
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"expected an HxWx3 RGB array, got shape {tuple(image.shape)}")
    if image.dtype != np.uint8:
        raise ValueError(f"expected uint8 pixels (0..255), got {image.dtype}")
    return image


def image_to_patches(
    image: Any,
    config: ImageProcessorConfig | None = None,
    *,
    patch_size: int | None = None,
    temporal_patch_size: int | None = None,
    merge_size: int | None = None,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """One image as ``(pixel_values, grid_thw)`` for the vision encoder.

    ``image`` is a PIL image or an ``H x W x 3`` uint8 numpy array (RGB).
    ``pixel_values`` is float32 ``[t*h*w, C*T*P*P]`` (rows in merge-block
    order, see the module docstring); ``grid_thw`` is the patch grid
    ``(t, h, w)`` with ``t == 1`` for a still image. Several images are sent
    to the encoder by concatenating their rows and stacking their grids.
    Settings come from ``config`` (default: the release's); a keyword given
    here overrides that one setting.
    """
    import torch

    cfg = config or ImageProcessorConfig()
    overrides = {
        "patch_size": patch_size,
        "temporal_patch_size": temporal_patch_size,
        "merge_size": merge_size,
        "min_pixels": min_pixels,
        "max_pixels": max_pixels,
        "image_mean": None if mean is None else tuple(float(v) for v in mean),
        "image_std": None if std is None else tuple(float(v) for v in std),
    }
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if overrides:
        cfg = dataclasses.replace(cfg, **overrides)
    pixels = _as_rgb_array(image)
    height, width = int(pixels.shape[0]), int(pixels.shape[1])
    new_h, new_w = cfg.resized_size(height, width)

    # [1, C, H, W] uint8, contiguous in the channel-first layout the reference resizes.
    frame = torch.from_numpy(pixels).permute(2, 0, 1).contiguous().unsqueeze(0)
    if (new_h, new_w) != (height, width):
        frame = torch.nn.functional.interpolate(
            frame, size=(new_h, new_w), mode="bicubic", align_corners=False, antialias=True
        )
    values = frame.to(torch.float32)
    if cfg.do_normalize:
        mean = torch.tensor(cfg.image_mean, dtype=torch.float32)
        std = torch.tensor(cfg.image_std, dtype=torch.float32)
        if cfg.do_rescale:
            # Fold the 1/255 into mean and std, exactly as the reference does.
            mean = mean * (1.0 / cfg.rescale_factor)
            std = std * (1.0 / cfg.rescale_factor)
        values = (values - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)
    elif cfg.do_rescale:
        values = values * cfg.rescale_factor
    return _frames_to_patches(values, cfg)


def _frames_to_patches(
    frames: torch.Tensor, cfg: ImageProcessorConfig
) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """Cut normalised frames ``[F, C, H, W]`` into patch rows in merge-block order."""
    import torch

    tps, p, m = cfg.temporal_patch_size, cfg.patch_size, cfg.merge_size
    if frames.shape[0] % tps:
        # Fill the last temporal patch with copies of the last frame (a still
        # image becomes ``tps`` identical frames).
        fill = frames[-1:].expand(tps - frames.shape[0] % tps, -1, -1, -1)
        frames = torch.cat([frames, fill], dim=0)
    n_frames, channels, height, width = frames.shape
    grid_t, grid_h, grid_w = n_frames // tps, height // p, width // p
    blocks = frames.reshape(grid_t, tps, channels, grid_h // m, m, p, grid_w // m, m, p)
    # -> (t, block_row, block_col, row_in_block, col_in_block, channel, frame, y, x)
    blocks = blocks.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    rows = blocks.reshape(grid_t * grid_h * grid_w, channels * tps * p * p).contiguous()
    return rows, (grid_t, grid_h, grid_w)
