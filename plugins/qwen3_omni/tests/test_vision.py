"""Image preprocessing and the vision tower, without the reference (see test_vision_reference.py).

Sizes follow the reference's rules (checked against transformers 4.57.3 in the
reference test); here we pin known cases, the patch layout (rows rebuilt into
the image), token counts, and the encoder's batching contract: images in one
call never see each other, so a batch equals each image encoded alone.
"""

from __future__ import annotations

import math

import pytest

from omni_qwen3_omni.vision.processor import (
    RELEASE_MAX_PIXELS,
    RELEASE_MIN_PIXELS,
    ImageProcessorConfig,
    image_token_count,
    smart_resize,
)
from omni_qwen3_omni.vision.video import (
    VideoRefused,
    plan_video,
    sample_frame_count,
    utils_smart_resize,
)

# ---------------------------------------------------------------- torch-free


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        ((64, 96), (64, 96)),  # already whole merge blocks
        ((80, 48), (64, 64)),  # 2.5 and 1.5 blocks: Python's round goes to even
        ((20, 30), (64, 96)),  # too small: grown to min_pixels, rounded up
        ((10, 10), (64, 64)),
        ((150, 230), (160, 224)),
        ((1080, 1920), (1088, 1920)),
    ],
)
def test_smart_resize_known_cases(size, expected):
    assert smart_resize(*size) == expected


def test_smart_resize_tiny_image_reaches_min_pixels():
    h, w = smart_resize(3, 5, factor=32, min_pixels=RELEASE_MIN_PIXELS)
    assert h % 32 == 0 and w % 32 == 0
    assert h * w >= RELEASE_MIN_PIXELS
    assert w > h  # the aspect ratio survives


def test_smart_resize_huge_image_shrinks_to_max_pixels():
    h, w = smart_resize(12000, 9000)
    assert h % 32 == 0 and w % 32 == 0
    assert h * w <= RELEASE_MAX_PIXELS
    assert h * w > 0.9 * RELEASE_MAX_PIXELS
    assert math.isclose(h / w, 12000 / 9000, rel_tol=0.02)
    # A small cap takes the same branch.
    assert smart_resize(300, 500, factor=32, min_pixels=3136, max_pixels=128 * 128) == (96, 160)


def test_smart_resize_refuses_extreme_aspect_ratio():
    assert smart_resize(10, 2000)  # exactly 200:1 is allowed
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(10, 2010)
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(5000, 20)
    with pytest.raises(ValueError):
        smart_resize(0, 20)


def test_image_token_count():
    assert image_token_count((1, 4, 6)) == 6
    assert image_token_count((1, 10, 14), merge_size=2) == 35
    assert image_token_count((2, 4, 4)) == 8
    with pytest.raises(ValueError):
        image_token_count((1, 3, 4))


def test_processor_config_from_release_dict():
    raw = {
        "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": 128,
        "image_processor_type": "Qwen2VLImageProcessor",
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "patch_size": 16,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "min_pixels": 3136,
        "max_pixels": 12845056,
        "processor_class": "Qwen3OmniMoeProcessor",
    }
    cfg = ImageProcessorConfig.from_dict(raw)
    assert cfg == ImageProcessorConfig()
    assert cfg.factor == 32
    assert cfg.grid_for_size(64, 96) == (1, 4, 6)
    assert cfg.token_count(64, 96) == 6
    assert cfg.token_count(1080, 1920) == (1088 // 32) * (1920 // 32)


def test_processor_config_spellings_and_errors():
    sized = ImageProcessorConfig.from_dict({"size": {"shortest_edge": 4096, "longest_edge": 65536}})
    assert (sized.min_pixels, sized.max_pixels) == (4096, 65536)
    both = ImageProcessorConfig.from_dict(
        {"min_pixels": 1024, "size": {"shortest_edge": 4096, "longest_edge": 65536}}
    )
    assert (both.min_pixels, both.max_pixels) == (1024, 65536)
    nested = ImageProcessorConfig.from_dict({"image_processor": {"max_pixels": 9999}})
    assert nested.max_pixels == 9999
    with pytest.raises(ValueError, match="resample"):
        ImageProcessorConfig.from_dict({"resample": 2})
    with pytest.raises(ValueError):
        ImageProcessorConfig.from_dict({"min_pixels": 10, "max_pixels": 5})
    with pytest.raises(ValueError):
        ImageProcessorConfig(image_std=(0.5, 0.0, 0.5))

    from omni_qwen3_omni.config import VisionEncoderConfig

    ImageProcessorConfig().check_against(VisionEncoderConfig())
    with pytest.raises(ValueError, match="spatial_merge_size"):
        ImageProcessorConfig(merge_size=4).check_against(VisionEncoderConfig())


@pytest.mark.parametrize(
    ("total", "fps", "expected"),
    [
        (25, 25.0, 4),  # 1 s: 2 frames wanted, raised to the minimum of 4
        (82, 25.0, 6),  # 3.28 s: 6.56 wanted, rounded down to a multiple of 2
        (300, 30.0, 20),  # 10 s at 2 per second
        (3, 25.0, 2),  # fewer frames than the minimum: as many as there are, even
        (10_000, 10.0, 768),  # the maximum
    ],
)
def test_frame_count_follows_the_release(total, fps, expected):
    assert sample_frame_count(total, fps) == expected


def test_a_one_frame_video_is_refused():
    with pytest.raises(VideoRefused, match="at least 2"):
        sample_frame_count(1, 25.0)


def test_first_resize_never_rounds_a_side_below_28_and_respects_the_budget():
    assert utils_smart_resize(10, 1000, 28 * 28 * 128, 28 * 28 * 768)[0] >= 28
    with pytest.raises(VideoRefused, match="aspect ratio"):
        utils_smart_resize(10, 4000, 28 * 28 * 128, 28 * 28 * 768)
    h, w = utils_smart_resize(1080, 1920, 28 * 28 * 128, 28 * 28 * 768)
    assert h % 28 == 0 and w % 28 == 0 and h * w <= 28 * 28 * 768


def test_plan_of_a_small_clip():
    plan = plan_video(120, 160, 82, 25.0, ImageProcessorConfig())
    assert plan.indices == (0, 16, 32, 49, 65, 81)
    assert plan.first_size == (280, 392)  # grown to 128 * 28 * 28 pixels
    assert plan.size == (320, 448)  # then to 128 * 32 * 32 by the processor's rule
    assert plan.grid == (3, 20, 28) and plan.token_count == 3 * 20 * 28 // 4
    assert plan.seconds_per_grid == 2.0


# ---------------------------------------------------------------- with torch

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from omni_qwen3_omni.config import VisionEncoderConfig  # noqa: E402
from omni_qwen3_omni.vision.encoder import VisionEncoder  # noqa: E402
from omni_qwen3_omni.vision.processor import image_to_patches  # noqa: E402

TINY = VisionEncoderConfig(
    depth=3,
    hidden_size=32,
    intermediate_size=64,
    num_heads=4,
    out_hidden_size=48,
    num_position_embeddings=64,
    deepstack_visual_indexes=(0, 2),
)


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _image(height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def test_patch_layout_rebuilds_the_image():
    image = _image(64, 96)  # no resize
    raw = ImageProcessorConfig(do_rescale=False, do_normalize=False)
    rows, grid = image_to_patches(image, raw)
    assert grid == (1, 4, 6)
    assert rows.dtype == torch.float32 and rows.shape == (24, 3 * 2 * 16 * 16)
    patches = rows.view(24, 3, 2, 16, 16)
    assert torch.equal(patches[:, :, 0], patches[:, :, 1])  # a still image fills both frames
    rebuilt = np.zeros_like(image)
    i = 0
    for block_row in range(2):
        for block_col in range(3):
            for dy in range(2):
                for dx in range(2):
                    y, x = (block_row * 2 + dy) * 16, (block_col * 2 + dx) * 16
                    patch = patches[i, :, 0].permute(1, 2, 0).numpy()
                    rebuilt[y : y + 16, x : x + 16] = patch.astype(np.uint8)
                    i += 1
    assert np.array_equal(rebuilt, image)


def test_normalisation_and_resize():
    image = np.full((64, 64, 3), 255, dtype=np.uint8)
    rows, _ = image_to_patches(image)
    assert torch.allclose(rows, torch.ones_like(rows))  # (1 - 0.5) / 0.5
    rows, grid = image_to_patches(_image(20, 30))
    assert grid == (1, 4, 6)
    assert rows.shape == (24, 1536)
    assert rows.min() >= -1.0 - 1e-6 and rows.max() <= 1.0 + 1e-6  # uint8 resize stays in range
    rows, grid = image_to_patches(_image(300, 500), max_pixels=128 * 128)
    assert grid == (1, 6, 10)
    assert grid == ImageProcessorConfig(max_pixels=128 * 128).grid_for_size(300, 500)


def test_input_checks_and_pil_like_objects():
    with pytest.raises(ValueError, match="uint8"):
        image_to_patches(np.zeros((32, 32, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="HxWx3"):
        image_to_patches(np.zeros((32, 32), dtype=np.uint8))
    with pytest.raises(TypeError):
        image_to_patches([[1, 2, 3]])

    class FakePil:  # what the processor uses of a PIL image: mode, convert(), the array protocol
        def __init__(self, array, mode):
            self.array, self.mode = array, mode

        def convert(self, mode):
            assert mode == "RGB"
            return FakePil(self.array[..., :3], "RGB")

        def __array__(self, dtype=None, copy=None):
            return self.array

    rgba = np.concatenate([_image(64, 64), np.zeros((64, 64, 1), np.uint8)], axis=-1)
    ours, _ = image_to_patches(FakePil(rgba, "RGBA"))
    direct, _ = image_to_patches(rgba[..., :3].copy())
    assert torch.equal(ours, direct)


def _encoder(seed: int = 0) -> VisionEncoder:
    torch.manual_seed(seed)
    model = VisionEncoder(TINY).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def test_state_dict_names_are_the_release_ones():
    names = set(VisionEncoder(TINY).state_dict())
    expected = {"patch_embed.proj.weight", "patch_embed.proj.bias", "pos_embed.weight"}
    for b in range(TINY.depth):
        for part in ("norm1", "norm2", "attn.qkv", "attn.proj", "mlp.linear_fc1", "mlp.linear_fc2"):
            expected |= {f"blocks.{b}.{part}.weight", f"blocks.{b}.{part}.bias"}
    for merger in ["merger", "merger_list.0", "merger_list.1"]:
        for part in ("ln_q", "mlp.0", "mlp.2"):
            expected |= {f"{merger}.{part}.weight", f"{merger}.{part}.bias"}
    assert names == expected
    model = VisionEncoder(TINY)
    assert model.patch_embed.proj.weight.shape == (32, 3, 2, 16, 16)
    assert model.merger.ln_q.weight.shape == (32,)
    assert model.merger_list[0].ln_q.weight.shape == (128,)
    assert model.merger.mlp[2].weight.shape == (48, 128)


def test_encoder_shapes_for_two_sizes():
    model = _encoder()
    rows_a, grid_a = image_to_patches(_image(64, 96, 1))
    rows_b, grid_b = image_to_patches(_image(96, 64, 2))
    rows = torch.cat([rows_a, rows_b])
    with torch.no_grad():
        embeds, deepstack = model(rows, torch.tensor([grid_a, grid_b]))
    tokens = image_token_count(grid_a) + image_token_count(grid_b)
    assert embeds.shape == (tokens, 48)
    assert len(deepstack) == 2
    assert all(d.shape == (tokens, 48) for d in deepstack)
    assert torch.isfinite(embeds).all()


def test_batch_equals_each_image_alone():
    model = _encoder()
    images = [_image(64, 96, 1), _image(96, 64, 2), _image(64, 96, 3)]
    parts = [image_to_patches(im) for im in images]
    with torch.no_grad():
        alone = [model(rows, [grid]) for rows, grid in parts]
        batch = model(torch.cat([r for r, _ in parts]), [g for _, g in parts])
        # Equal-sized images take the batched attention path.
        pair = model(torch.cat([parts[0][0], parts[2][0]]), [parts[0][1], parts[2][1]])
    counts = [image_token_count(g) for _, g in parts]
    for got, want in zip(batch[0].split(counts), [a[0] for a in alone], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for k in range(2):
        for got, want in zip(batch[1][k].split(counts), [a[1][k] for a in alone], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pair[0], torch.cat([alone[0][0], alone[2][0]]), rtol=1e-5, atol=1e-5)


def test_temporal_patches_attend_separately():
    # Two temporal patches of identical rows: each is its own attention segment with the
    # same positions, so both give the same embeddings as a single still image.
    model = _encoder()
    rows, (_, h, w) = image_to_patches(_image(64, 64, 4))
    with torch.no_grad():
        single, _ = model(rows, [(1, h, w)])
        double, _ = model(torch.cat([rows, rows]), [(2, h, w)])
    torch.testing.assert_close(double, torch.cat([single, single]), rtol=1e-5, atol=1e-5)


def test_videos_and_images_in_one_batch_equal_each_alone():
    """A request's images and videos go to the tower together, in prompt order: each one's
    rows must be what it gives alone (attention per temporal patch, positions per grid)."""
    from omni_qwen3_omni.vision.video import first_resize, plan_video, video_to_patches

    model = _encoder()
    cfg = ImageProcessorConfig()
    rng = np.random.default_rng(7)
    items = []
    for height, width, frames in ((48, 64, 20), (40, 40, 12)):
        plan = plan_video(height, width, frames, 10.0, cfg)
        raw = rng.integers(0, 256, (frames, height, width, 3), dtype=np.uint8)
        items.append(
            video_to_patches([first_resize(raw[i], plan) for i in plan.indices], plan, cfg)
        )
    items.insert(1, image_to_patches(_image(64, 96, 5)))
    assert [g[0] for _, g in items] == [2, 1, 2]
    with torch.no_grad():
        alone = [model(rows, [grid]) for rows, grid in items]
        mixed = model(torch.cat([r for r, _ in items]), [g for _, g in items])
    counts = [image_token_count(g) for _, g in items]
    for got, want in zip(mixed[0].split(counts), [a[0] for a in alone], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for k in range(2):
        for got, want in zip(mixed[1][k].split(counts), [a[1][k] for a in alone], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_encoder_input_checks():
    model = VisionEncoder(TINY)
    rows, grid = image_to_patches(_image(64, 64))
    with pytest.raises(ValueError, match="patch rows"):
        model(rows[:-1], [grid])
    with pytest.raises(ValueError, match="spatial_merge_size"):
        model(rows[:12], [(1, 3, 4)])
    with pytest.raises(ValueError, match="pixel_values"):
        model(rows[:, :-1], [grid])
    with pytest.raises(ValueError):
        VisionEncoder(VisionEncoderConfig(hidden_act="tanh", depth=1, hidden_size=32, num_heads=4))


def test_bfloat16_runs():
    model = _encoder().to(torch.bfloat16)
    rows, grid = image_to_patches(_image(64, 96))
    with torch.no_grad():
        embeds, deepstack = model(rows, [grid])
    assert embeds.dtype == torch.bfloat16 and embeds.shape == (6, 48)
    assert all(d.dtype == torch.bfloat16 for d in deepstack)
