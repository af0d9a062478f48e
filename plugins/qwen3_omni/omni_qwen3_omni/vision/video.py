"""A video as the release feeds it to the vision tower: which frames, what size, which patches.

The release reads video in two steps, and both decide what the model sees:

1. ``qwen-omni-utils`` 0.0.9 (``process_mm_info``, called with its default
   ``image_patch_size`` of 14, as the Qwen3-Omni cookbook does) picks the
   frames and a first size:

   - frames: ``total / video_fps * 2`` (2 frames per second), clamped to at
     least 4 and at most ``min(768, total)`` (both rounded to a multiple of
     ``FRAME_FACTOR`` = 2: the minimum up, the maximum down), then rounded
     *down* to a multiple of 2; fewer than 2 is refused. The frames taken are
     ``linspace(0, total - 1, n)`` rounded half to even (torch's ``round``);
   - size: its own ``smart_resize`` to multiples of 28, with at least
     ``128 * 28 * 28`` pixels and at most ``min(768 * 28 * 28,
     0.9 * 128000 * 28 * 28 / n * 2)``; unlike the image rule, a side never
     rounds below 28, and the shrinking branch may;
   - resample: torchvision's tensor ``resize`` (bicubic, antialias) of the
     uint8 frames: computed in float32, clamped to 0..255, rounded back to
     uint8; then converted to float.

2. transformers 4.57.3's processor (``Qwen2VLVideoProcessor`` under
   ``Qwen3OmniMoeProcessor``'s call defaults) resizes again, with the image
   rule (:func:`~.processor.smart_resize`) to multiples of ``patch * merge``
   (32) between ``128 * 32 * 32`` and ``768 * 32 * 32`` pixels, this time in
   float32 with no clamp or rounding (the frames are float by now); then
   rescales and normalises like an image and cuts ``temporal_patch_size``
   consecutive frames into one temporal patch (2: so grid ``t`` is half the
   frame count).

Timing: the processor gives each temporal grid step ``temporal_patch_size /
fps`` seconds, with ``fps`` its call default of 1.0 since the cookbook passes
none: 2 s per step whatever the clip's frame rate, which is what the
release's positions (and its audio-in-video interleaving) are built on.

Frame indices and sizes come from the header alone (:func:`plan_video`), so a
request is priced and refused before decoding, and each decoded frame is
shrunk at once (:func:`first_resize`), so only small frames are kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .processor import ImageProcessorConfig, smart_resize

if TYPE_CHECKING:
    import torch

# qwen-omni-utils 0.0.9 (qwen_omni_utils/v2_5/vision_process.py)
FPS = 2.0
FRAME_FACTOR = 2
FPS_MIN_FRAMES = 4
FPS_MAX_FRAMES = 768
UTILS_PATCH_SIZE = 14  # process_mm_info's default image_patch_size
UTILS_MERGE_SIZE = 2
VIDEO_MIN_TOKENS = 128
VIDEO_MAX_TOKENS = 768
MODEL_SEQ_LEN = 128000
# transformers 4.57.3 Qwen3OmniMoeProcessor's videos_kwargs defaults
PROCESSOR_MIN_PIXELS = 128 * 32 * 32
PROCESSOR_MAX_PIXELS = 768 * 32 * 32
PROCESSOR_FPS = 1.0


class VideoRefused(ValueError):
    """A video the release's rules cannot sample (too few frames, an extreme aspect ratio)."""


@dataclass(frozen=True)
class VideoPlan:
    """Everything about one video that its header decides."""

    indices: tuple[int, ...]  # the frames taken, 0-based
    first_size: tuple[int, int]  # (height, width) after qwen-omni-utils' resize
    size: tuple[int, int]  # (height, width) the patches are cut from
    grid: tuple[int, int, int]  # (t, h, w) in patches
    seconds_per_grid: float

    @property
    def token_count(self) -> int:
        t, h, w = self.grid
        return t * h * w // (UTILS_MERGE_SIZE * UTILS_MERGE_SIZE)


def sample_frame_count(total_frames: int, video_fps: float, fps: float = FPS) -> int:
    """How many frames the release takes from a video of ``total_frames`` at ``video_fps``."""
    min_frames = math.ceil(FPS_MIN_FRAMES / FRAME_FACTOR) * FRAME_FACTOR
    max_frames = math.floor(min(FPS_MAX_FRAMES, total_frames) / FRAME_FACTOR) * FRAME_FACTOR
    wanted = total_frames / video_fps * fps
    wanted = min(min(max(wanted, min_frames), max_frames), total_frames)
    count = math.floor(wanted / FRAME_FACTOR) * FRAME_FACTOR
    if not FRAME_FACTOR <= count <= total_frames:
        raise VideoRefused(
            f"the video has {total_frames} frame(s); at least {FRAME_FACTOR} are needed"
        )
    return count


def sample_indices(total_frames: int, count: int) -> tuple[int, ...]:
    """``count`` frame indices spread evenly from the first frame to the last, as the release."""
    import torch

    picks = torch.linspace(0, total_frames - 1, count).round().long()
    return tuple(int(i) for i in picks.tolist())


def utils_smart_resize(height: int, width: int, min_pixels: float, max_pixels: float) -> tuple:
    """qwen-omni-utils' size rule (factor 28): the first resize of every frame."""
    factor = UTILS_PATCH_SIZE * UTILS_MERGE_SIZE
    if max(height, width) / min(height, width) > 200:
        raise VideoRefused(
            f"the video's aspect ratio ({width} x {height}) exceeds 200: the release refuses it"
        )
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = math.floor(height / beta / factor) * factor
        w_bar = math.floor(width / beta / factor) * factor
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    if h_bar < 1 or w_bar < 1:
        raise VideoRefused(f"the video's frames ({width} x {height}) resize to nothing")
    return h_bar, w_bar


def plan_video(
    height: int, width: int, total_frames: int, video_fps: float, cfg: ImageProcessorConfig
) -> VideoPlan:
    """Frames, sizes, grid and timing of one video, from its header alone."""
    count = sample_frame_count(total_frames, video_fps)
    factor = UTILS_PATCH_SIZE * UTILS_MERGE_SIZE
    min_pixels = VIDEO_MIN_TOKENS * factor * factor
    total_pixels = MODEL_SEQ_LEN * factor * factor * 0.9
    max_pixels = max(
        min(VIDEO_MAX_TOKENS * factor * factor, total_pixels / count * FRAME_FACTOR),
        int(min_pixels * 1.05),
    )
    first = utils_smart_resize(height, width, min_pixels, max_pixels)
    try:
        size = smart_resize(*first, cfg.factor, PROCESSOR_MIN_PIXELS, PROCESSOR_MAX_PIXELS)
    except ValueError as exc:
        raise VideoRefused(str(exc)) from None
    tps = cfg.temporal_patch_size
    grid = (math.ceil(count / tps), size[0] // cfg.patch_size, size[1] // cfg.patch_size)
    return VideoPlan(sample_indices(total_frames, count), first, size, grid, tps / PROCESSOR_FPS)


def first_resize(pixels: Any, plan: VideoPlan) -> torch.Tensor:
    """One decoded ``[H, W, 3]`` uint8 frame as qwen-omni-utils resizes it: ``[3, h, w]`` uint8."""
    import numpy as np
    import torch

    frame = torch.from_numpy(np.ascontiguousarray(pixels)).permute(2, 0, 1)
    if tuple(frame.shape[1:]) == plan.first_size:
        return frame.contiguous()
    values = torch.nn.functional.interpolate(
        frame[None].to(torch.float32),
        size=list(plan.first_size),
        mode="bicubic",
        align_corners=False,
        antialias=True,
    )[0]
    return values.clamp(0, 255).round().to(torch.uint8)


def video_to_patches(
    frames: list[torch.Tensor], plan: VideoPlan, cfg: ImageProcessorConfig
) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """The frames :func:`first_resize` returned as ``(pixel_values_videos, grid_thw)``."""
    import torch

    from .processor import _frames_to_patches

    values = torch.stack(frames).to(torch.float32)  # [F, 3, h, w]
    if tuple(values.shape[2:]) != plan.size:
        values = torch.nn.functional.interpolate(
            values, size=list(plan.size), mode="bicubic", align_corners=False, antialias=True
        )
    if cfg.do_normalize:
        mean = torch.tensor(cfg.image_mean, dtype=torch.float32)
        std = torch.tensor(cfg.image_std, dtype=torch.float32)
        if cfg.do_rescale:
            mean, std = mean / cfg.rescale_factor, std / cfg.rescale_factor
        values = (values - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)
    elif cfg.do_rescale:
        values = values * cfg.rescale_factor
    rows, grid = _frames_to_patches(values, cfg)
    if grid != plan.grid:
        raise AssertionError(f"video grid {grid} differs from its plan {plan.grid}")
    return rows, grid
