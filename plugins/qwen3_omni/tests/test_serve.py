"""qwen3-omni-text served over HTTP and used through the official ``openai`` client.

One server (the built-in demo deploy file, tiny preset, dummy weights, CPU)
for the module; media come as data URLs, base64 ``input_audio`` and files
under ``server.media_dirs``.
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")
openai = pytest.importorskip("openai")

from media_samples import (  # noqa: E402
    audio_part,
    image_part,
    mp4_bytes,
    png_bytes,
    user,
    video_part,
)

from omni_core.plugins import OmniPlugins  # noqa: E402
from omni_core.testing import plan_on_cpu, short_private_dir  # noqa: E402

DEMO = Path(__file__).resolve().parents[3] / "examples" / "qwen3_omni_text_demo.toml"


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("media")
    (root / "cat.png").write_bytes(png_bytes(48, 64, seed=5))
    (root / "clip.mp4").write_bytes(mp4_bytes(1.0))
    return root


@pytest.fixture(scope="module")
def server(media: Path):
    with short_private_dir() as base:
        flags = ["--server.media_dirs", f'["{media}"]']
        planned = plan_on_cpu(OmniPlugins(env={}), base, deploy=DEMO, flags=flags)
        with planned.serve() as live:
            yield live


def _chat(server, messages, **kw):
    return server.client().chat.completions.create(model="tiny", messages=messages, **kw)


def test_a_text_answer_reports_usage_and_why_it_ended(server):
    reply = _chat(server, [{"role": "user", "content": "Hi"}], max_tokens=5, temperature=0)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length"
    assert reply.usage.completion_tokens == 5
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 5


def test_image_and_audio_stream_as_text_deltas_equal_to_the_whole_answer(server):
    messages = [
        {"role": "system", "content": "Answer briefly."},
        *user(image_part(64, 96), audio_part(1.0), text="What do you see and hear?"),
    ]
    whole = _chat(server, messages, max_completion_tokens=6, temperature=0)
    stream = _chat(
        server,
        messages,
        max_completion_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    deltas, usage, reasons = [], None, []
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            deltas.append(choice.delta.content or "")
            reasons.append(choice.finish_reason)
    assert "".join(deltas) == whole.choices[0].message.content
    assert reasons[-1] == "length"
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    text_only = _chat(server, [{"role": "user", "content": "x"}], max_tokens=1)
    assert whole.usage.prompt_tokens > text_only.usage.prompt_tokens + 6 + 13  # image + audio


def test_a_multi_turn_history_and_a_file_from_the_media_dir(server, media):
    messages = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi! Send me a picture."},
        *user({"type": "image_url", "image_url": {"url": str(media / "cat.png")}}),
    ]
    reply = _chat(server, messages, max_tokens=3, seed=11, temperature=0.8, top_p=0.9)
    again = _chat(server, messages, max_tokens=3, seed=11, temperature=0.8, top_p=0.9)
    assert reply.choices[0].message.content == again.choices[0].message.content  # same seed


def _thinker_positions(server) -> dict[str, float]:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    counts: dict[str, float] = {}
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as reply:
        metrics = reply.read().decode()
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            name, labels = sample.name, sample.labels
            if name == "omni_engine_prompt_positions_total" and labels["stage"] == "thinker":
                counts[labels["source"]] = sample.value
            if name == "omni_engine_prefill_chunks_total" and labels["stage"] == "thinker":
                counts["chunks"] = sample.value
    return counts


def _settled(server) -> float:
    """The thinker's copied positions once two reports agree (heartbeats carry them, 0.5 s
    apart, so a count read just after a request may not include it yet)."""
    import time

    deadline = time.monotonic() + 30
    last = None
    while time.monotonic() < deadline:
        cached = _thinker_positions(server).get("cached", 0.0)
        if cached == last:
            return cached
        last = cached
        time.sleep(1.1)
    raise AssertionError(f"the thinker's copied positions kept changing: {last}")


def test_a_second_turn_copies_the_first_turns_prompt_with_its_image(server, media):
    """The thinker computes the conversation's earlier prompt (an image in it) once."""
    first = user({"type": "image_url", "image_url": {"url": str(media / "cat.png")}})
    reply = _chat(server, first, max_tokens=2, temperature=0)
    second = [
        *first,
        {"role": "assistant", "content": reply.choices[0].message.content},
        {"role": "user", "content": "And the colours?"},
    ]
    # the first turn's whole prompt but its last position, in whole blocks of 16, and at
    # most its answer's fed positions too (where the answer tokenizes back the same)
    usage = reply.usage
    blocks = (usage.prompt_tokens - 1) // 16
    at_most = (usage.prompt_tokens + usage.completion_tokens - 1) // 16
    assert blocks >= 1
    before = _settled(server)  # other tests' requests counted in full first
    _chat(server, second, max_tokens=2, temperature=0)
    assert 16 * blocks <= _settled(server) - before <= 16 * at_most


@pytest.mark.parametrize(
    ("messages", "kw", "param", "words"),
    [
        (
            user({"type": "input_audio", "input_audio": {"data": "not base64!", "format": "wav"}}),
            {},
            "messages.0.content.0.input_audio.data",
            "base64",
        ),
        (
            user({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "aiff"}}),
            {},
            "messages.0.content.0.input_audio.format",
            "must be one of",
        ),
        (
            user({"type": "image_url", "image_url": {"url": "/etc/hostname"}}),
            {},
            "messages.0.content.0.image_url.url",
            "media_dirs",
        ),
        ([{"role": "user", "content": "hi"}], {"n": 2}, "n", "n"),
    ],
)
def test_bad_requests_are_refused_with_the_field_named(server, messages, kw, param, words):
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(server, messages, max_tokens=2, **kw)
    error = caught.value.body
    assert error["param"] == param
    assert words in error["message"]


@pytest.mark.parametrize(
    ("part", "words"),
    [
        (
            {
                "type": "image_url",
                "image_url": {
                    "url": "data:image/png;base64," + base64.b64encode(b"x" * 64).decode()
                },
            },
            "image",
        ),
        ({"type": "text", "text": "fake <|image_pad|> token"}, "control token"),
    ],
)
def test_media_and_text_the_stages_cannot_use_are_client_errors(server, part, words):
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(server, user(part), max_tokens=2)
    assert words in caught.value.body["message"]


def _descendants() -> list[int]:
    import os

    found, frontier = [], [os.getpid()]
    while frontier:
        pid = frontier.pop()
        children = []
        try:
            for task in os.listdir(f"/proc/{pid}/task"):  # a child belongs to its forking thread
                with open(f"/proc/{pid}/task/{task}/children") as handle:
                    children += [int(c) for c in handle.read().split()]
        except OSError:
            continue
        found += children
        frontier += children
    return found


def _peak_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def test_sixteen_huge_images_are_refused_from_their_headers_without_the_memory(server):
    """The attack that took 11 GB and 181 s of CPU: 16 PNGs of 8192 x 8192 (64 MB of
    pixels each, a few hundred KB of file) in one request. Refused from the headers,
    before any decode: no stage process's peak RSS grows by 200 MB."""
    import io
    import time

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8192, 8192), (200, 30, 90)).save(out, format="PNG")
    encoded = base64.b64encode(out.getvalue()).decode()
    part = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{encoded}"}}
    children = _descendants()
    assert children, "the server's stage processes are not children of this test"
    for pid in children:  # "5" resets the peak RSS (VmHWM) to the current RSS
        with open(f"/proc/{pid}/clear_refs", "w") as handle:
            handle.write("5")
    before = {pid: _peak_rss_kib(pid) for pid in children}
    started = time.perf_counter()
    with pytest.raises(openai.BadRequestError, match="max_request_pixels"):
        _chat(server, user(*[part] * 16), max_tokens=2)
    elapsed = time.perf_counter() - started
    growth = {pid: _peak_rss_kib(pid) - before[pid] for pid in children}
    assert max(growth.values()) < 200 * 1024, (growth, elapsed)


def test_chat_streams_dropped_after_the_first_chunk_leave_every_stage_idle(server):
    from drops import drop_streams_then_wait_idle

    body = {"model": "tiny", "messages": [{"role": "user", "content": "Tell me a story."}]}
    drop_streams_then_wait_idle(server.url, {**body, "max_tokens": 64, "stream": True}, 30)


def _video_tokens(raw: bytes) -> int:
    """Placeholders the release's sampling gives this clip (4 frames of 20 x 28 patches here)."""
    from omni_core.media import VideoLimits, probe_video
    from omni_qwen3_omni.vision.processor import ImageProcessorConfig
    from omni_qwen3_omni.vision.video import plan_video

    info = probe_video(raw, "clip", VideoLimits())
    plan = plan_video(info.height, info.width, info.frames, info.fps, ImageProcessorConfig())
    return plan.token_count


def test_a_video_answers_whole_and_streamed_and_usage_counts_its_tokens(server):
    raw = mp4_bytes(1.0)  # no sound track
    question = "What moves?"
    messages = user(video_part(raw), text=question)
    whole = _chat(server, messages, max_tokens=4, temperature=0)
    stream = _chat(
        server,
        messages,
        max_tokens=4,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    deltas, usage = [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        deltas += [choice.delta.content or "" for choice in chunk.choices]
    assert "".join(deltas) == whole.choices[0].message.content
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    text_only = _chat(server, user(text=question), max_tokens=1)
    # the video's placeholders plus <|vision_start|> and <|vision_end|>
    expected = _video_tokens(raw) + 2
    assert expected == 2 * 20 * 28 // 4 + 2
    assert whole.usage.prompt_tokens - text_only.usage.prompt_tokens == expected


def test_a_video_with_its_sound_track_and_an_image_in_one_message(server, media):
    import numpy as np

    t = np.arange(16000) / 16000
    tone = (0.3 * np.sin(2 * np.pi * 300 * t)).astype(np.float32)
    raw = mp4_bytes(1.0, sound=tone)
    question = "Describe both."
    both = user(image_part(64, 96), video_part(raw), text=question)
    reply = _chat(server, both, max_tokens=3, temperature=0)
    alone = _chat(server, user(image_part(64, 96), text=question), max_tokens=1)
    quiet = _chat(
        server, both, max_tokens=1, temperature=0, extra_body={"use_audio_in_video": False}
    )
    video = _video_tokens(raw) + 2
    assert quiet.usage.prompt_tokens - alone.usage.prompt_tokens == video
    # with its track (the default): 13 audio tokens a second, and audio start/end markers
    heard = reply.usage.prompt_tokens - quiet.usage.prompt_tokens
    assert 13 + 2 <= heard <= 15 + 2
    path = user({"type": "video_url", "video_url": {"url": str(media / "clip.mp4")}})
    assert _chat(server, path, max_tokens=1).usage.prompt_tokens > video


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b"RIFF\0\0\0\0AVI LIST" + bytes(200), "not a readable AVI video"),
        (b"\x00\x00\x00\x18ftypmp42" + bytes(300), "not a readable MP4 video"),
    ],
)
def test_an_undecodable_video_is_a_400_naming_the_part(server, raw, words):
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(server, user(video_part(raw)), max_tokens=1)
    assert caught.value.status_code == 400
    assert words in caught.value.body["message"]
    assert "messages.0.content.0.video_url" in caught.value.body["message"]


def test_a_video_declaring_8k_frames_is_refused_before_decoding(server):
    import fractions
    import io

    av = pytest.importorskip("av")
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=25)
        stream.width, stream.height, stream.pix_fmt = 7680, 4320, "yuv420p"
        stream.time_base = fractions.Fraction(1, 25)
        black = av.VideoFrame(7680, 4320, "yuv420p")
        for plane in black.planes:
            plane.update(bytes(plane.buffer_size))
        black.pts = 0
        for packet in [*stream.encode(black), *stream.encode()]:
            container.mux(packet)
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(server, user(video_part(out.getvalue())), max_tokens=1)
    assert "7680 x 4320 = 33177600 pixels per frame" in caught.value.body["message"]


@pytest.mark.slow
def test_a_prompt_longer_than_a_steps_budget_is_served_in_chunks(server):
    """A thinker whose steps prefill 24 positions at most (``engine.max_prefill_tokens``)
    serves an image and audio prompt several times that long, in chunks, with the answer
    the demo's one-step prefill gives."""
    messages = [
        {"role": "system", "content": "Answer briefly."},
        *user(image_part(64, 96), audio_part(1.0), text="What do you see and hear?"),
    ]
    whole = _chat(server, messages, max_completion_tokens=6, temperature=0)
    assert whole.usage.prompt_tokens >= 3 * 24
    with short_private_dir() as base:
        flags = ["--thinker.engine.max_prefill_tokens", "24"]
        planned = plan_on_cpu(OmniPlugins(env={}), base, deploy=DEMO, flags=flags)
        with planned.serve() as live:
            chunked = _chat(live, messages, max_completion_tokens=6, temperature=0)
            # at least two chunks before the last (the warm-up request's are counted too)
            import time

            deadline = time.monotonic() + 30
            while _thinker_positions(live).get("chunks", 0) < 2 and time.monotonic() < deadline:
                time.sleep(0.5)  # heartbeats carry the engine's counts
            assert _thinker_positions(live)["chunks"] >= 2
            assert _thinker_positions(server)["chunks"] == 0
    assert chunked.choices[0].message.content == whole.choices[0].message.content
    assert chunked.usage.prompt_tokens == whole.usage.prompt_tokens
