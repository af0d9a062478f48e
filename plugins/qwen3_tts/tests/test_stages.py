"""The three Qwen3-TTS stages through the real runtime (child processes, real transports).

Each runtime here is the built-in default deploy file (the tiny preset with
dummy weights on the ``cpu`` policy), resolved and planned as ``omni serve``
does, under a private ``endpoints.base_path``; one is started per module
fixture because starting one costs a few seconds. What a test expects is
computed independently, in this process, by the same model loaded the same
way (seeded dummy weights), through its plain ``generate`` and full decode.
"""

from __future__ import annotations

import base64
import io
import json
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

torch = pytest.importorskip("torch")
soundfile = pytest.importorskip("soundfile")

from omni_core.config import load_deployment  # noqa: E402
from omni_core.plan.planner import plan_deployment  # noqa: E402
from omni_core.plugins import OmniPlugins  # noqa: E402
from omni_core.runtime import RequestFailed, Runtime  # noqa: E402
from omni_qwen3_tts.model import Qwen3TTSModel  # noqa: E402
from omni_qwen3_tts.weights import PRESETS_DIR  # noqa: E402

DEMO = Path(__file__).resolve().parents[3] / "examples" / "qwen3_tts_demo.toml"
SAMPLES_PER_FRAME = 1920
# The vocoder's stateful decoding (exact), in small equal chunks.
EXACT = [
    "--vocoder.factory.left_context_frames",
    "none",
    "--vocoder.factory.chunk_frames",
    "5",
    "--vocoder.factory.max_chunk_frames",
    "none",
]

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Spoken:
    """What one request produced: the vocoder's audio chunks and its final summary."""

    chunks: list[np.ndarray]
    final: dict[str, Any]

    @property
    def audio(self) -> np.ndarray:
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)


@asynccontextmanager
async def started(base: Path, *flags: str) -> AsyncIterator[Runtime]:
    """The demo deploy file with ``flags``, started like ``omni serve`` would start it."""
    plugins = OmniPlugins(env={})  # the installed plugins only, whatever the shell says
    resolution = load_deployment(
        str(DEMO), ["--endpoints.base_path", str(base), *flags], plugins=plugins
    )
    plan = plan_deployment(resolution.config, plugins=plugins)
    async with Runtime(plan, resolution.config, plugins=plugins) as runtime:
        yield runtime


async def speak(runtime: Runtime, body: dict[str, Any]) -> Spoken:
    handle = await runtime.dispatch(body)
    chunks: list[np.ndarray] = []
    final: dict[str, Any] = {}
    with anyio.fail_after(120):
        async for event in handle.stream():
            assert event.stage == "vocoder"
            if event.final:
                final = event.data
            else:
                chunks.append(event.data)
    return Spoken(chunks, final)


def check_audio(spoken: Spoken) -> None:
    """Audio the vocoder's summary accounts for: 1920 float32 samples per frame, finite."""
    audio = spoken.audio
    assert spoken.final["sample_rate"] == 24000
    assert spoken.final["frames"] >= 1
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert audio.shape[0] == spoken.final["samples"] == spoken.final["frames"] * SAMPLES_PER_FRAME
    assert np.isfinite(audio).all() and float(np.abs(audio).max()) <= 1.0
    assert float(audio.std()) > 1e-4  # a signal, not silence


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


@pytest.fixture(scope="module")
async def demo(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Runtime]:
    """The demo deploy file exactly as shipped."""
    async with started(tmp_path_factory.mktemp("demo")) as runtime:
        yield runtime


@pytest.fixture(scope="module")
async def exact(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Runtime]:
    async with started(tmp_path_factory.mktemp("exact"), *EXACT) as runtime:
        yield runtime


@pytest.fixture(scope="module")
def model() -> Qwen3TTSModel:
    """The model the demo's stages load (tiny preset, dummy weights, seed 0)."""
    return Qwen3TTSModel.from_pretrained("tiny", load_format="dummy", seed=0)


# -- serving -----------------------------------------------------------------------


async def test_the_demo_deploy_file_serves_speech_in_chunks(demo):
    body = {"input": "Hello", "voice": "serena", "seed": 3, "max_frames": 100, "temperature": 0}
    spoken = await speak(demo, body)
    check_audio(spoken)
    frames = [chunk.shape[0] // SAMPLES_PER_FRAME for chunk in spoken.chunks]
    # chunk_frames 4, then doubling up to max_chunk_frames 48; the last holds the rest
    sizes = [min(4 * 2**i, 48) for i in range(len(frames))]
    assert len(frames) >= 2
    assert frames[:-1] == sizes[:-1]
    assert 0 < frames[-1] <= sizes[-1]
    assert sum(frames) == spoken.final["frames"] <= 100


async def test_the_frame_cap_ends_a_request_as_length(demo):
    # greedy: a sampled request may draw the end of speech before its third frame
    body = {"input": "Hello there", "voice": "serena", "max_frames": 3, "temperature": 0}
    capped = await speak(demo, body)
    assert capped.final["frames"] == 3
    assert capped.final["finish_reason"] == "length"


async def test_voices_and_languages_change_the_audio(demo):
    body = {"input": "Hello the world", "temperature": 0, "max_frames": 8}
    serena = await speak(demo, {**body, "voice": "serena"})
    ryan = await speak(demo, {**body, "voice": "ryan"})
    chinese = await speak(demo, {**body, "voice": "serena", "language": "chinese"})
    for spoken in (serena, ryan, chinese):
        check_audio(spoken)
    assert not np.array_equal(serena.audio, ryan.audio)
    assert not np.array_equal(serena.audio, chinese.audio)


# -- streaming == non-streaming ----------------------------------------------------


async def test_streamed_chunks_equal_a_full_decode_of_the_same_codes(exact, model):
    text, frames = "Hello the world, the user is here", 23
    spoken = await speak(
        exact, {"input": text, "voice": "ryan", "temperature": 0, "max_frames": frames}
    )
    codes = model.generate(model.prompts.custom_voice(text, "ryan", "auto"), frames, 0.0)
    assert codes.shape[0] == spoken.final["frames"] == frames  # greedy: no EOS this early
    assert [c.shape[0] // SAMPLES_PER_FRAME for c in spoken.chunks] == [5, 5, 5, 5, 3]
    full = model.decode_audio(codes).numpy()
    assert spoken.audio.shape == full.shape
    assert rel_l2(spoken.audio, full) < 1e-5
    assert float(np.abs(spoken.audio - full).max()) < 1e-4


# -- batching ------------------------------------------------------------------------

REQUESTS = [
    {
        "input": text,
        "voice": ["serena", "ryan", "eric"][i % 3],
        "language": ["english", "auto"][i % 2],
        "seed": 100 + i,
        "max_frames": 10 + 2 * i,  # different lengths: requests leave the batch at different steps
    }
    for i, text in enumerate(
        [
            "Hello",
            "Hello the world",
            "the user is an assistant",
            "one two three four five",
            "Hello again, and again",
            "the assistant answers",
            "short",
            "a longer sentence for the last request of the batch",
        ]
    )
]


@pytest.mark.slow  # ~7 s; the MOSS and engine tests cover batched == alone in make test
async def test_eight_concurrent_requests_equal_the_same_eight_one_by_one(demo):
    """Seeded sampling is per request: batching changes no code, so the audio differs
    only by the float rounding of the batched codec decode."""
    alone = [await speak(demo, body) for body in REQUESTS]
    together: list[Spoken | None] = [None] * len(REQUESTS)

    async def one(i: int) -> None:
        together[i] = await speak(demo, REQUESTS[i])

    async with anyio.create_task_group() as group:
        for i in range(len(REQUESTS)):
            group.start_soon(one, i)
    for body, a, b in zip(REQUESTS, alone, together, strict=True):
        assert b is not None
        check_audio(a)
        assert a.final == b.final, body
        assert a.audio.shape == b.audio.shape, body
        assert np.abs(a.audio - b.audio).max() < 1e-5, body
    # the seeds matter: two requests with different seeds differ
    assert not np.array_equal(alone[0].audio[:19200], alone[2].audio[:19200])


async def test_the_same_seed_twice_gives_the_same_audio_and_no_seed_does_not(demo):
    body = {"input": "Hello the world", "voice": "eric", "max_frames": 12}
    first = await speak(demo, {**body, "seed": 7})
    second = await speak(demo, {**body, "seed": 7})
    assert np.array_equal(first.audio, second.audio)
    unseeded = [await speak(demo, body) for _ in range(2)]
    assert not np.array_equal(unseeded[0].audio, unseeded[1].audio)


# -- bad input -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"input": "", "voice": "serena"}, "text is empty"),
        ({"input": "   ", "voice": "serena"}, "text is empty"),
        ({"input": "hi", "voice": "zed"}, "unknown voice 'zed'; supported: eric, ryan, serena"),
        ({"input": "hi", "language": "klingon"}, "unknown language 'klingon'"),
        ({"input": "hi", "pitch": 3}, "unknown field 'pitch'"),
        ({"input": "hi", "speed": 2.0}, "does not change speed"),
        ({"input": "hi", "max_frames": 0}, "'max_frames' must be in 1..200"),
        ({"input": "hi", "max_frames": 201}, "'max_frames' must be in 1..200"),
        ({"input": "hi", "temperature": "hot"}, "'temperature' must be a number"),
        ({"input": "hi", "top_p": 0}, "top_p must be in (0, 1]"),
        ({"input": "hi", "ref_audio": "UklGRg=="}, "needs a Base checkpoint"),
    ],
)
async def test_bad_input_is_the_client_s_error(demo, body, message):
    with pytest.raises(RequestFailed) as caught:
        await speak(demo, body)
    assert caught.value.client_error, str(caught.value)
    assert message in str(caught.value)


async def test_a_refused_request_leaves_the_pipeline_serving(demo):
    with pytest.raises(RequestFailed):
        await speak(demo, {"input": "hi", "voice": "zed"})
    check_audio(await speak(demo, {"input": "hi", "voice": "serena", "max_frames": 4}))


# -- voice cloning on a Base checkpoint ----------------------------------------------


def base_checkpoint(root: Path) -> Path:
    """The tiny preset's files as a Base checkpoint (configs only: dummy weights)."""
    shutil.copytree(PRESETS_DIR / "tiny", root)
    config = json.loads((root / "config.json").read_text())
    config["tts_model_type"] = "base"
    (root / "config.json").write_text(json.dumps(config))
    return root


def reference_wav(seconds: float = 1.5, hz: float = 180.0, rate: int = 24000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    noise = np.random.default_rng(0).standard_normal(t.shape[0])
    wave = (0.3 * np.sin(2 * np.pi * hz * t) + 0.05 * noise).astype(np.float32)
    out = io.BytesIO()
    soundfile.write(out, wave, rate, format="WAV", subtype="PCM_16")
    return out.getvalue()


def silent_hour_flac(rate: int = 8000) -> bytes:
    """An hour of silence as FLAC (under 100 kB), written a minute at a time."""
    out = io.BytesIO()
    minute = np.zeros(rate * 60, dtype=np.int16)
    with soundfile.SoundFile(out, "w", rate, 1, format="FLAC", subtype="PCM_16") as sound:
        for _ in range(60):
            sound.write(minute)
    return out.getvalue()


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return base_checkpoint(tmp_path_factory.mktemp("base") / "ckpt")


@pytest.fixture(scope="module")
async def base(tmp_path_factory: pytest.TempPathFactory, base_dir: Path) -> AsyncIterator[Runtime]:
    flags = ["--model_path", str(base_dir), *EXACT]
    async with started(tmp_path_factory.mktemp("base-rt"), *flags) as runtime:
        yield runtime


@pytest.fixture(scope="module")
def base_model(base_dir: Path) -> Qwen3TTSModel:
    return Qwen3TTSModel.from_pretrained(base_dir, load_format="dummy", seed=0)


@pytest.mark.parametrize("x_vector_only", [False, True])
async def test_voice_clone_through_the_runtime(base, base_model, x_vector_only):
    text, ref_text, frames = "Hello the world", "the user is an assistant", 10
    wav_bytes = reference_wav()
    body = {
        "input": text,
        "ref_audio": base64.b64encode(wav_bytes).decode(),
        "temperature": 0,
        "max_frames": frames,
        **({"x_vector_only": True} if x_vector_only else {"ref_text": ref_text}),
    }
    spoken = await speak(base, body)
    check_audio(spoken)

    samples, _ = soundfile.read(io.BytesIO(wav_bytes), dtype="float32", always_2d=True)
    ref_codes, xvector = base_model.voice_clone_reference(torch.from_numpy(samples.mean(axis=1)))
    prompt = base_model.prompts.voice_clone(
        text,
        xvector,
        "auto",
        ref_codes=None if x_vector_only else ref_codes,
        ref_text=None if x_vector_only else ref_text,
        x_vector_only=x_vector_only,
    )
    codes = base_model.generate(prompt, frames, 0.0)
    assert codes.shape[0] == spoken.final["frames"]
    # In-context cloning decodes with the reference's codes in front, as the release does.
    expected = base_model.decode_audio(codes, None if x_vector_only else ref_codes).numpy()
    assert spoken.audio.shape == expected.shape
    assert rel_l2(spoken.audio, expected) < 1e-5


async def test_a_different_reference_gives_a_different_voice(base):
    body = {"input": "Hello", "temperature": 0, "max_frames": 6, "x_vector_only": True}
    low = await speak(base, {**body, "ref_audio": base64.b64encode(reference_wav()).decode()})
    high = await speak(
        base, {**body, "ref_audio": base64.b64encode(reference_wav(hz=900.0)).decode()}
    )
    assert not np.array_equal(low.audio, high.audio)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"input": "hi", "ref_text": "x"}, "voice cloning needs 'ref_audio'"),
        ({"input": "hi", "ref_audio": "@@@", "ref_text": "x"}, "'ref_audio' is not readable"),
        (
            {"input": "hi", "ref_audio": base64.b64encode(b"RIFF....").decode(), "ref_text": "x"},
            "'ref_audio' is not readable",
        ),
        ({"input": "hi", "ref_audio": "WAV"}, "needs 'ref_text'"),
        ({"input": "hi", "ref_audio": "SHORT", "ref_text": "x"}, "give at least 0.5 s"),
        ({"input": "hi", "ref_audio": "LONG", "ref_text": "x"}, "the limit is 30 s"),
        ({"input": "hi", "ref_audio": "HOUR", "ref_text": "x"}, "is 3600.0 s long; the limit"),
        ({"input": "hi", "ref_audio": "/etc/passwd", "ref_text": "x"}, "not valid base64"),
        ({"input": "", "ref_audio": "WAV", "ref_text": "x"}, "text is empty"),
    ],
)
async def test_bad_clone_input_is_the_client_s_error(base, body, message):
    audio = {
        "WAV": reference_wav,
        "SHORT": lambda: reference_wav(seconds=0.2),
        "LONG": lambda: reference_wav(seconds=31, rate=8000),
        "HOUR": silent_hour_flac,
    }
    if body.get("ref_audio") in audio:
        body = {**body, "ref_audio": base64.b64encode(audio[body["ref_audio"]]()).decode()}
    with pytest.raises(RequestFailed) as caught:
        await speak(base, body)
    assert caught.value.client_error, str(caught.value)
    assert message in str(caught.value)


async def enroll(runtime: Runtime, wav_bytes: bytes) -> dict[str, Any]:
    """The voices contract's enrollment: the vocoder's final output carries the clone prompt."""
    body = {"voice_enroll": True, "ref_audio": base64.b64encode(wav_bytes).decode()}
    handle = await runtime.dispatch(body, {"api": "voice"})
    with anyio.fail_after(120):
        outputs = await handle.result()
    return outputs["vocoder"]["voice_prompt"]


@pytest.mark.parametrize("with_transcript", [False, True])
async def test_an_enrolled_voice_speaks_as_its_clip_sent_directly(base, with_transcript):
    wav_bytes = reference_wav(hz=240.0)
    prompt = await enroll(base, wav_bytes)
    assert prompt["ref_codes"].dtype == np.int64 and prompt["ref_codes"].shape[1] == 16
    assert prompt["x_vector"].ndim == 1
    body = {"input": "Hello again", "temperature": 0, "max_frames": 6}
    extra = {"ref_text": "the user is an assistant"} if with_transcript else {}
    direct = await speak(
        base,
        {
            **body,
            **extra,
            "ref_audio": base64.b64encode(wav_bytes).decode(),
            **({} if with_transcript else {"x_vector_only": True}),
        },
    )
    stored = await speak(base, {**body, **extra, "voice_prompt": prompt})
    assert np.array_equal(stored.audio, direct.audio)


async def test_a_custom_voice_checkpoint_refuses_enrollment(demo):
    with pytest.raises(RequestFailed) as caught:
        await enroll(demo, reference_wav())
    assert caught.value.client_error and "cannot clone voices" in caught.value.message
