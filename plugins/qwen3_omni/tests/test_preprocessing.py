"""The preprocessing stage on its own: prompts, media, limits and sampling, as a stage sees them."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")
pytest.importorskip("av")
import numpy as np  # noqa: E402
from media_samples import (  # noqa: E402
    audio_part,
    image_part,
    mp4_bytes,
    user,
    video_part,
    wav_bytes,
)

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
        ({"max_videos": 0}, user(video_part(mp4_bytes(1.0))), {}, "factory.max_videos"),
        ({"max_video_seconds": 1.0}, user(video_part(mp4_bytes(2.0))), {}, "the limit is 1 s"),
        ({"max_video_pixels": 1000}, user(video_part(mp4_bytes(1.0))), {}, "the limit is 1000"),
        ({"max_video_frames": 5}, user(video_part(mp4_bytes(1.0))), {}, "declares 10 frames"),
        ({}, user(video_part(b"RIFF0000AVI " + bytes(64))), {}, "header is damaged"),
        ({}, user(video_part(wav_bytes(0.5))), {}, "is not a readable video"),
        ({"max_image_pixels": 1000}, user(image_part(32, 32)), {}, "the limit is 1000 pixels"),
        (
            {"max_request_pixels": 64 * 96 + 10},
            user(image_part(64, 96), image_part(8, 8)),
            {},
            "factory.max_request_pixels",
        ),
        (
            {"max_request_audio_seconds": 1.5},
            user(audio_part(1.0), audio_part(1.0)),
            {},
            "2.0 s together",
        ),
        ({"max_prompt_tokens": 20}, user(image_part(64, 96)), {}, "factory.max_prompt_tokens"),
        ({"max_prompt_tokens": 20}, [{"role": "user", "content": "hi " * 30}], {}, "about"),
    ],
)
async def test_what_a_client_gets_wrong_is_a_request_error(factory, messages, sampling, words):
    stage = create_preprocessing("tiny", **factory)
    with pytest.raises(RequestError, match=words):
        await _run(stage, messages, **sampling)


async def test_media_over_budget_are_refused_from_their_headers_before_any_decode(monkeypatch):
    """16 images of 8192 x 8192 (a few hundred KB of PNG each) must cost no decoding: the
    token budget is read from the headers, so the decoder is never reached."""
    import io

    from PIL import Image

    from omni_qwen3_omni import preprocessing

    out = io.BytesIO()
    Image.new("L", (8192, 8192)).save(out, format="PNG")
    encoded = __import__("base64").b64encode(out.getvalue()).decode()
    part = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{encoded}"}}

    def never(*args, **kwargs):
        raise AssertionError("an image was decoded")

    monkeypatch.setattr(preprocessing.Preprocessing, "_image", never)
    stage = create_preprocessing("tiny", max_request_pixels=2**40)
    with pytest.raises(RequestError, match=r"factory\.max_prompt_tokens"):
        await _run(stage, user(*[part] * 16))
    stage = create_preprocessing("tiny")
    with pytest.raises(RequestError, match=r"factory\.max_request_pixels"):
        await _run(stage, user(*[part] * 16))


async def test_the_budget_estimate_never_falls_short_of_the_prompt_built():
    """The estimate from headers is an upper bound: a request at exactly its estimated
    size is admitted, and the prompt it builds is no longer than the estimate."""
    messages = user(image_part(64, 96), audio_part(1.37), image_part(200, 30))
    full = await _run(create_preprocessing("tiny"), messages)
    built = len(full["prompt"]["token_ids"])
    for budget in range(built, built + 8):
        try:
            await _run(create_preprocessing("tiny", max_prompt_tokens=budget), messages)
            break
        except RequestError:
            continue
    else:
        raise AssertionError("the estimate is more than 8 tokens above the prompt built")
    with pytest.raises(RequestError, match="max_prompt_tokens"):
        await _run(create_preprocessing("tiny", max_prompt_tokens=built - 1), messages)


async def test_a_speech_input_is_the_users_turn_so_the_speech_pipelines_say_they_answer_it():
    """``speech_input = "answer"`` (what the playground's Speech card reads) is true: the
    preprocessing stage makes a speech request's ``input`` the user's turn, the same prompt
    as a chat message saying it, so the model answers the text rather than reading it."""
    from omni_core.serve.service import Serving
    from omni_qwen3_omni.pipeline import Qwen3OmniColocatedPipeline, Qwen3OmniSpeechPipeline

    for pipeline in (Qwen3OmniSpeechPipeline, Qwen3OmniColocatedPipeline):
        assert "speech" in pipeline.api
        assert Serving.of(pipeline).speech_input == "answer"
    stage = create_preprocessing("tiny")
    text = "What colour is the sea?"
    spoken = await stage.run(StageRequest("r1", {"input": text, "sampling": {}}))
    chat = await _run(stage, [{"role": "user", "content": text}])
    assert spoken["prompt"]["token_ids"] == chat["prompt"]["token_ids"]


async def test_a_video_becomes_temporal_patches_with_time_positions():
    stage = create_preprocessing("tiny")
    out = await _run(stage, user(video_part(mp4_bytes(2.0, fps=10))))
    ids = stage.config
    tokens = torch.tensor(out["prompt"]["token_ids"])
    (video,) = out["images"]
    # 20 frames at 10 fps: 4 sampled (2 per second), 2 temporal patches; 64 x 96 grows to
    # 280 x 392 (qwen-omni-utils), then 320 x 448 (the processor): 20 x 28 patches.
    assert video["grid_thw"] == [2, 20, 28]
    assert video["pixel_values"].shape == (2 * 20 * 28, 3 * 2 * 16 * 16)
    assert int((tokens == ids.video_token_id).sum()) == 2 * 20 * 28 // 4
    assert out["audios"] == []  # no sound track
    at = int(torch.nonzero(tokens == ids.video_token_id)[0])
    temporal = out["prompt"]["positions"][0]
    # the second temporal patch starts 2 s (26 positions at 13 per second) after the first
    assert int(temporal[at + 140]) - int(temporal[at]) == 26


async def test_a_videos_sound_track_is_interleaved_unless_the_request_says_not():
    stage = create_preprocessing("tiny")
    t = np.arange(32000) / 16000
    tone = (0.3 * np.sin(2 * np.pi * 300 * t)).astype(np.float32)
    part = video_part(mp4_bytes(2.0, sound=tone))
    ids = stage.config
    out = await _run(stage, user(part))
    tokens = out["prompt"]["token_ids"]
    assert len(out["audios"]) == 1 and out["audios"][0].shape[0] == 128
    audio = tokens.count(ids.audio_token_id)
    assert 24 <= audio <= 28  # 13 per second
    start = tokens.index(ids.vision_start_token_id)
    assert tokens[start + 1] == ids.audio_start_token_id
    run = tokens[start + 2 : start + 2 + 140 + 140 + audio]
    assert set(run) == {ids.video_token_id, ids.audio_token_id}
    # 2 s per temporal step (26 positions): audio tokens 0-25 come between the two steps'
    # frames, the second step goes before audio token 26 (a tie goes to the video)
    audio_id, video_id = ids.audio_token_id, ids.video_token_id
    assert run == [video_id] * 140 + [audio_id] * 26 + [video_id] * 140 + [audio_id] * (audio - 26)
    assert route_to_aggregate(out) == ["audio_encoder", "image_encoder", "mm_aggregate"]
    quiet = await stage.run(
        StageRequest("r2", {"messages": user(part), "sampling": {}, "use_audio_in_video": False})
    )
    assert quiet["audios"] == [] and ids.audio_token_id not in quiet["prompt"]["token_ids"]
    silent = video_part(mp4_bytes(1.0))
    with pytest.raises(RequestError, match="no sound track"):
        await stage.run(
            StageRequest(
                "r3", {"messages": user(silent), "sampling": {}, "use_audio_in_video": True}
            )
        )


async def test_videos_images_and_audio_keep_prompt_order_for_the_encoders():
    stage = create_preprocessing("tiny")
    t = np.arange(16000) / 16000
    tone = (0.3 * np.sin(2 * np.pi * 300 * t)).astype(np.float32)
    messages = user(image_part(64, 96), video_part(mp4_bytes(1.0, sound=tone)), audio_part(1.0))
    out = await _run(stage, messages)
    assert [im["grid_thw"][0] for im in out["images"]] == [1, 2]  # the image, then the video
    assert len(out["audios"]) == 2  # the track (first in the prompt), then the audio part
