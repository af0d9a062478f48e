"""The encoder stages batch concurrent requests (factory.max_batch_size) and split the rows back.

Each request must get exactly the rows it would get alone: the towers treat
every clip and image independently, and the stage owns the bookkeeping of
which rows belong to whom.
"""

from __future__ import annotations

from types import SimpleNamespace

import anyio
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from omni_qwen3_omni.audio.encoder import AudioEncoder as AudioTower  # noqa: E402
from omni_qwen3_omni.config import AudioEncoderConfig, VisionEncoderConfig  # noqa: E402
from omni_qwen3_omni.stages import AudioEncoder, ImageEncoder  # noqa: E402
from omni_qwen3_omni.vision.encoder import VisionEncoder  # noqa: E402
from omni_qwen3_omni.vision.processor import image_to_patches  # noqa: E402

AUDIO = AudioEncoderConfig(
    encoder_layers=2,
    encoder_attention_heads=4,
    encoder_ffn_dim=128,
    d_model=64,
    downsample_hidden_size=32,
    output_dim=48,
    n_window=50,
    n_window_infer=200,
)
VISION = VisionEncoderConfig(
    depth=3,
    hidden_size=32,
    intermediate_size=64,
    num_heads=4,
    out_hidden_size=48,
    num_position_embeddings=64,
    deepstack_visual_indexes=(0, 2),
)


def _random(module: torch.nn.Module) -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(0.1 * torch.randn_like(p))
    return module.eval()


def _serve_concurrently(stage, payloads: list[dict]) -> list[dict]:
    """Every payload as its own request, all in flight at once."""
    results: list[dict] = [{}] * len(payloads)

    async def one(i: int) -> None:
        results[i] = await stage.run(SimpleNamespace(data=payloads[i]))

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for i in range(len(payloads)):
                tg.start_soon(one, i)

    anyio.run(main)
    return results


def test_concurrent_audio_requests_share_tower_calls_and_get_their_own_rows() -> None:
    stage = AudioEncoder(_random(AudioTower(AUDIO)), "cpu", max_batch_size=3)
    rng = np.random.default_rng(1)
    requests = [
        [torch.from_numpy(rng.standard_normal((128, frames)).astype(np.float32)) for frames in clip]
        for clip in ([370], [60, 150], [1031], [99], [200, 7])
    ]
    got = _serve_concurrently(stage, [{"audios": clips} for clips in requests])
    assert sum(stage.coalescer.batch_sizes) == 5
    assert max(stage.coalescer.batch_sizes) == 3  # the limit, and batching happened
    for clips, result in zip(requests, got, strict=True):
        alone = stage._encode(clips)["embeds"]
        assert result["embeds"].shape == alone.shape
        torch.testing.assert_close(result["embeds"], alone, atol=1e-5, rtol=1e-5)


def test_concurrent_image_requests_share_tower_calls_and_get_their_own_rows() -> None:
    stage = ImageEncoder(_random(VisionEncoder(VISION)), "cpu", max_batch_size=8)
    rng = np.random.default_rng(2)

    def image(height: int, width: int) -> dict:
        rows, grid = image_to_patches(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
        return {"pixel_values": rows, "grid_thw": list(grid)}

    requests = [[image(64, 96)], [image(96, 64), image(64, 64)], [image(32, 96)]]
    got = _serve_concurrently(stage, [{"images": images} for images in requests])
    assert sorted(stage.coalescer.batch_sizes) == [1, 2]  # one alone, then the two that waited
    for images, result in zip(requests, got, strict=True):
        alone = stage._encode(images)
        torch.testing.assert_close(result["embeds"], alone["embeds"], atol=1e-5, rtol=1e-5)
        assert len(result["deepstack"]) == len(alone["deepstack"]) == 2
        for mine, own in zip(result["deepstack"], alone["deepstack"], strict=True):
            torch.testing.assert_close(mine, own, atol=1e-5, rtol=1e-5)
