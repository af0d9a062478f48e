"""MOSS-TTS served: the official ``openai`` client against the demo deployment (tiny, CPU).

The deployment is ``examples/moss_tts_demo.toml`` (the tiny preset's real
architecture with dummy weights), planned on the CPU and served in-process on
a free port; requests go over real HTTP.
"""

from __future__ import annotations

import base64
import io
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
openai = pytest.importorskip("openai")
soundfile = pytest.importorskip("soundfile")

from omni_core.plugins import OmniPlugins  # noqa: E402
from omni_core.testing import plan_on_cpu, short_private_dir  # noqa: E402

DEMO = Path(__file__).resolve().parents[3] / "examples" / "moss_tts_demo.toml"
FRAME = 1920  # samples per frame at 24 kHz


@pytest.fixture(scope="module")
def server():
    with short_private_dir() as base:
        flags = ["--preprocessing.factory.max_frames", "40"]
        planned = plan_on_cpu(OmniPlugins(env={}), base, deploy=DEMO, flags=flags)
        with planned.serve() as live:
            yield live


def speak(server, **extra):
    body = {"seed": 7, **extra.pop("extra_body", {})}
    return server.client().audio.speech.create(
        model="tiny", voice=extra.pop("voice", "default"), extra_body=body, **extra
    )


def wav_samples(data: bytes) -> tuple[np.ndarray, int]:
    samples, rate = soundfile.read(io.BytesIO(data), dtype="int16")
    return samples, rate


def test_speech_is_24_khz_wav_of_whole_frames(server):
    reply = speak(server, input="Hello from MOSS.", response_format="wav")
    samples, rate = wav_samples(reply.content)
    assert rate == 24000
    assert samples.size > 0 and samples.size % FRAME == 0
    assert np.abs(samples).max() > 0  # not silence


def test_streamed_wav_equals_the_whole_answer(server):
    whole, _ = wav_samples(speak(server, input="Streaming test.", response_format="wav").content)
    with server.client().audio.speech.with_streaming_response.create(
        model="tiny",
        voice="default",
        input="Streaming test.",
        response_format="pcm",
        extra_body={"seed": 7, "stream": True},
    ) as response:
        chunks = list(response.iter_bytes())
    streamed = np.frombuffer(b"".join(chunks), dtype="<i2")
    assert len(chunks) > 1  # it arrived in pieces, as it was made
    assert np.array_equal(streamed, whole)


def test_sixteen_concurrent_requests_each_get_their_own_seeded_audio(server):
    texts = [f"Request number {i}." for i in range(16)]

    def one(i: int) -> bytes:
        return speak(server, input=texts[i], extra_body={"seed": i}).content

    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(one, range(16)))
    assert all(wav_samples(data)[0].size > 0 for data in together)
    for i in (0, 7, 15):  # alone, the same seed gives the same audio
        alone, batched = wav_samples(one(i))[0], wav_samples(together[i])[0]
        # The same codes (the engine is exact alone and batched); the vocoder stacks
        # concurrent chunks into one codec call, whose float rounding may move a
        # 16-bit sample by one step.
        assert alone.shape == batched.shape
        assert np.abs(alone.astype(np.int32) - batched.astype(np.int32)).max() <= 2


def test_an_unknown_voice_is_refused_with_the_voices_listed(server):
    with pytest.raises(openai.BadRequestError) as caught:
        speak(server, input="Hi.", voice="alloy")
    assert "unknown voice 'alloy'; voices: default" in caught.value.body["message"]


def _clip(seconds: float, amplitude: float = 0.3) -> str:
    t = np.arange(int(24000 * seconds)) / 24000
    wave = amplitude * np.sin(2 * np.pi * 220 * t) * np.sin(np.pi * t / max(seconds, 1e-9))
    buffer = io.BytesIO()
    soundfile.write(buffer, wave.astype(np.float32), 24000, format="WAV", subtype="PCM_16")
    return base64.b64encode(buffer.getvalue()).decode()


@pytest.mark.parametrize(
    ("clip", "why"),
    [
        (_clip(0.2), "at least 0.5 s"),
        (_clip(1.0, amplitude=0.0), "silent"),
        ("bm90IGF1ZGlv", "ref_audio"),  # base64 of "not audio"
    ],
)
def test_a_bad_reference_clip_is_refused_saying_why(server, clip, why):
    with pytest.raises(openai.BadRequestError) as caught:
        speak(server, input="Clone me.", extra_body={"ref_audio": clip})
    assert why in caught.value.body["message"]


def test_voice_cloning_with_and_without_the_transcript(server):
    clip = _clip(1.5)
    zero_shot = speak(server, input="Cloned voice.", extra_body={"ref_audio": clip})
    prefix = speak(
        server,
        input="Cloned voice.",
        extra_body={"ref_audio": clip, "ref_text": "A tone."},
    )
    plain = speak(server, input="Cloned voice.")
    for reply in (zero_shot, prefix):
        samples, rate = wav_samples(reply.content)
        assert rate == 24000 and samples.size > 0
    assert zero_shot.content != plain.content  # the reference changed the prompt
    assert prefix.content != zero_shot.content


def test_the_metrics_count_the_template_positions_copied_instead_of_computed(server):
    import time
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    for text in ("The first of two.", "The second of two."):
        speak(server, input=text)
    deadline = time.monotonic() + 30
    while True:  # heartbeats carry the engine's counts: at most a report old
        counts, misses = {}, {}
        with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as reply:
            metrics = reply.read().decode()
        for family in text_string_to_metric_families(metrics):
            for sample in family.samples:
                if sample.name == "omni_engine_prompt_positions_total":
                    counts[sample.labels["source"]] = sample.value
                    assert sample.labels["stage"] == "tts_engine"
                if sample.name == "omni_engine_compiled_step_misses_total":
                    misses[sample.labels["stage"]] = sample.value
        if counts.get("cached", 0) >= 2 * 128 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    # every prompt after the first copies the instruction template (8+ blocks of 16)
    assert counts["cached"] >= 2 * 128, counts
    assert counts["computed"] > 0
    # each torch engine stage reports its steps that missed the compiled graphs: none,
    # as this one decodes eagerly (tests/engine/test_compiled.py counts real misses)
    assert misses == {"tts_engine": 0}, misses
