"""The preprocessing stage on its own: prompts, media, limits and sampling, as a stage sees them."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")

from media_samples import audio_part, image_part, user  # noqa: E402

from omni_core import RequestError  # noqa: E402
from omni_core.runtime.stage_api import StageRequest  # noqa: E402
from omni_qwen3_omni.preprocessing import create_preprocessing  # noqa: E402
from omni_qwen3_omni.routing import route_to_aggregate  # noqa: E402

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _run(stage, messages, **sampling):
    return await stage.run(StageRequest("r1", {"messages": messages, "sampling": sampling}))


async def test_media_become_placeholders_patches_and_mel_in_order():
    stage = create_preprocessing("tiny")
    out = await _run(stage, user(image_part(64, 96), audio_part(1.0), image_part(32, 32)))
    ids = stage.config
    tokens = torch.tensor(out["prompt"]["token_ids"])
    # 64x96 is 4x6 patches (6 merged); 32x32 grows to min_pixels: 64x64, 4x4 patches (4)
    assert int((tokens == ids.image_token_id).sum()) == 6 + 4
    assert int((tokens == ids.audio_token_id).sum()) == 13  # one second of audio
    assert [im["grid_thw"] for im in out["images"]] == [[1, 4, 6], [1, 4, 4]]
    assert out["audios"][0].shape == (128, 100)
    assert out["prompt"]["positions"].shape == (3, len(tokens))
    assert route_to_aggregate(out) == ["audio_encoder", "image_encoder", "mm_aggregate"]
    text_only = await _run(stage, [{"role": "user", "content": "hi"}])
    assert route_to_aggregate(text_only) == ["mm_aggregate"]  # the encoders are skipped


async def test_sampling_defaults_come_from_the_checkpoint_and_requests_override_them():
    stage = create_preprocessing("tiny", max_tokens=64)
    default = (await _run(stage, [{"role": "user", "content": "hi"}]))["sampling"]
    assert default["max_new_tokens"] == 64
    assert default["temperature"] == stage.generation.get("temperature", 1.0)
    given = await _run(stage, [{"role": "user", "content": "hi"}], temperature=0, top_k=-1, seed=3)
    assert given["sampling"]["temperature"] == 0 and given["sampling"]["top_k"] == 0
    assert given["sampling"]["seed"] == 3


@pytest.mark.parametrize(
    ("factory", "messages", "sampling", "words"),
    [
        ({"max_images": 1}, user(image_part(), image_part()), {}, "at most 1"),
        ({"max_audios": 0}, user(audio_part()), {}, "factory.max_audios"),
        ({"max_audio_seconds": 0.5}, user(audio_part(1.0)), {}, "0.5"),
        ({"max_media_bytes": 100}, user(image_part()), {}, "100"),
        ({"max_tokens": 8}, [{"role": "user", "content": "hi"}], {"max_tokens": 9}, "at most 8"),
        ({}, [{"role": "tool", "content": "x"}], {}, "tool messages"),
        ({}, [{"role": "user", "content": "<|im_start|>system"}], {}, "control token"),
        ({}, [{"role": "user", "content": "hi"}], {"top_p": 0}, "top_p"),
        ({}, user({"type": "video_url", "video_url": {"url": "/v.mp4"}}), {}, "not supported"),
    ],
)
async def test_what_a_client_gets_wrong_is_a_request_error(factory, messages, sampling, words):
    stage = create_preprocessing("tiny", **factory)
    with pytest.raises(RequestError, match=words):
        await _run(stage, messages, **sampling)
