"""``omni serve examples/qwen3_asr_demo.toml`` through the official ``openai`` client.

One server for the module (tiny preset, dummy weights, CPU, one process). The
transcript of random weights is meaningless but greedy, so every response
format of one clip carries the same text and a stream's deltas join to it.
The realtime API transcribes each committed turn on this listening-only
pipeline, and refuses to answer. The server cuts clips longer than 8 s into
pieces (``factory.max_piece_seconds``, 1200 s by default, lowered so that a
few spoken phrases make a long clip): such a clip's answer is its pieces'
answers, each as the piece alone gets it, joined in order.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
openai = pytest.importorskip("openai")
pytest.importorskip("websockets")
sf = pytest.importorskip("soundfile")

from omni_core.plugins import OmniPlugins  # noqa: E402
from omni_core.serve.realtime.formats import resample  # noqa: E402
from omni_core.testing import plan_on_cpu, short_private_dir  # noqa: E402
from omni_qwen3_asr.split import split_clip  # noqa: E402
from omni_qwen3_asr.words import split_words  # noqa: E402

DEMO = Path(__file__).resolve().parents[3] / "examples" / "qwen3_asr_demo.toml"
PIECE_SECONDS = 8.0
FLAGS = [
    *("--preprocessing.factory.max_tokens", "12"),  # short transcripts, fast tests
    *("--preprocessing.factory.max_piece_seconds", str(PIECE_SECONDS)),
    *("--preprocessing.factory.max_aligned_piece_seconds", str(PIECE_SECONDS)),
]


@pytest.fixture(scope="module")
def server():
    with short_private_dir() as base:
        planned = plan_on_cpu(OmniPlugins(env={}), base, deploy=DEMO, flags=FLAGS)
        with planned.serve() as live:
            yield live


def _transcribe(server, audio: bytes, **kw):
    return server.client().audio.transcriptions.create(
        model="qwen3-asr", file=("clip.wav", io.BytesIO(audio)), **kw
    )


def _seconds(wav: bytes) -> float:
    info = sf.info(io.BytesIO(wav))
    return info.frames / info.samplerate


def test_every_response_format_carries_the_same_greedy_transcript(server, hello_wav) -> None:
    whole = _transcribe(server, hello_wav)
    assert isinstance(whole.text, str) and whole.text
    assert whole.usage.type == "tokens" and whole.usage.output_tokens == 12
    assert _transcribe(server, hello_wav, response_format="text") == whole.text
    stamp = f"00:00:0{_seconds(hello_wav):.3f}"
    srt = _transcribe(server, hello_wav, response_format="srt")
    assert srt == f"1\n00:00:00,000 --> {stamp.replace('.', ',')}\n{whole.text}\n\n"
    vtt = _transcribe(server, hello_wav, response_format="vtt")
    assert vtt == f"WEBVTT\n\n00:00:00.000 --> {stamp}\n{whole.text}\n\n"
    verbose = _transcribe(server, hello_wav, response_format="verbose_json", language="en")
    assert (verbose.task, verbose.language) == ("transcribe", "en")
    assert verbose.duration == pytest.approx(_seconds(hello_wav), abs=1e-3)
    (segment,) = verbose.segments
    assert segment.start == 0.0 and segment.text == verbose.text


def test_word_timings_come_from_the_forced_aligner(server, hello_wav) -> None:
    plain = _transcribe(server, hello_wav, response_format="verbose_json")
    assert getattr(plain, "words", None) is None  # not asked for: not sent
    timed = _transcribe(
        server,
        hello_wav,
        response_format="verbose_json",
        timestamp_granularities=["word", "segment"],
    )
    assert timed.text == plain.text
    words = [w.word for w in timed.words]
    # the aligner times the transcript's words: letters and digits, split at spaces
    assert words == ["".join(filter(str.isalnum, w)) for w in timed.text.split()]
    starts = [w.start for w in timed.words]
    assert starts == sorted(starts)  # repaired into order, whatever the random head says
    assert all(0.0 <= w.start <= w.end for w in timed.words)


def test_japanese_and_korean_words_are_the_units_the_release_times(server, hello_wav) -> None:
    timed = {"response_format": "verbose_json", "timestamp_granularities": ["word"]}
    korean = _transcribe(server, hello_wav, language="ko", **timed)
    assert korean.language == "ko" and korean.text
    # eojeol, or the release's cuts where its word list (qwen-asr) is installed
    assert [w.word for w in korean.words] == split_words(korean.text, "Korean")
    if importlib.util.find_spec("nagisa") is None:
        with pytest.raises(openai.BadRequestError) as refused:
            _transcribe(server, hello_wav, language="ja", **timed)
        assert "pip install 'omni-qwen3-asr[ja]'" in str(refused.value)
        return
    japanese = _transcribe(server, hello_wav, language="ja", **timed)
    assert [w.word for w in japanese.words] == split_words(japanese.text, "Japanese")
    starts = [w.start for w in japanese.words]
    assert starts == sorted(starts) and all(w.start <= w.end for w in japanese.words)


def test_a_forced_language_and_a_context_change_the_prompt_not_the_protocol(
    server, hello_wav
) -> None:
    plain = _transcribe(server, hello_wav)
    forced = _transcribe(server, hello_wav, language="de", prompt="Grafana, Kubernetes")
    assert forced.text and forced.usage.input_tokens > plain.usage.input_tokens


def test_the_stream_sends_deltas_that_join_to_the_done_text(server, hello_wav) -> None:
    whole = _transcribe(server, hello_wav)
    for response_format in ("json", "text"):
        deltas, done = [], []
        events = _transcribe(server, hello_wav, stream=True, response_format=response_format)
        for event in events:
            if event.type == "transcript.text.delta":
                deltas.append(event.delta)
            elif event.type == "transcript.text.done":
                done.append(event)
        assert len(deltas) > 1 and "".join(deltas) == whole.text == done[0].text
        assert done[0].usage.output_tokens == 12


def test_translations_answer_in_every_format(server, hello_wav) -> None:
    client = server.client()
    made = client.audio.translations.create(
        model="qwen3-asr", file=("clip.wav", io.BytesIO(hello_wav))
    )
    assert made.text
    verbose = client.audio.translations.create(
        model="qwen3-asr", file=("clip.wav", io.BytesIO(hello_wav)), response_format="verbose_json"
    )
    assert verbose.language == "english" and verbose.text == made.text


def test_client_mistakes_are_400s_naming_the_field(server, hello_wav) -> None:
    with pytest.raises(openai.BadRequestError) as language:
        _transcribe(server, hello_wav, language="Klingon")
    assert "Klingon" in str(language.value) and "ISO-639-1" in str(language.value)
    with pytest.raises(openai.BadRequestError) as words:
        _transcribe(server, hello_wav, timestamp_granularities=["word"])  # json: no timings
    assert "needs response_format verbose_json" in str(words.value)
    assert words.value.body["param"] == "timestamp_granularities"
    with pytest.raises(openai.BadRequestError) as garbage:
        _transcribe(server, b"RIFF not a wave file at all")
    assert "'file'" in str(garbage.value)


def _pcm24(wav: bytes) -> bytes:
    samples, rate = sf.read(io.BytesIO(wav), dtype="int16")
    return resample(samples, rate, 24000).astype("<i2").tobytes()


async def _until(conn: Any, kind: str, seen: list) -> Any:
    async with asyncio.timeout(60):
        async for event in conn:
            seen.append(event)
            if event.type == kind:
                return event
    raise AssertionError(f"the connection closed before {kind}")


def test_a_realtime_session_transcribes_each_turn_and_never_answers(server, speak) -> None:
    speech = _pcm24(speak("hello there, how are you today"))
    silence = bytes(24000 * 2)  # one second: the server's VAD ends the turn

    async def session() -> tuple[Any, Any, list]:
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
        seen: list = []
        async with client.realtime.connect(model="qwen3-asr") as conn:
            created = await _until(conn, "session.created", seen)
            assert created.session.audio.input.transcription is not None  # on from the start
            pcm = silence + speech + silence + silence
            for i in range(0, len(pcm), 9600):
                chunk = base64.b64encode(pcm[i : i + 9600]).decode()
                await conn.input_audio_buffer.append(audio=chunk)
            committed = await _until(conn, "input_audio_buffer.committed", seen)
            done = await _until(conn, "conversation.item.input_audio_transcription.completed", seen)
            await conn.response.create()
            refused = await _until(conn, "error", seen)
            return committed, done, [refused, *seen]

    committed, done, seen = asyncio.run(session())
    assert done.item_id == committed.item_id and done.transcript
    refused = seen[0]
    assert refused.error.code == "unsupported_api" and "only transcribes" in refused.error.message
    assert not [e for e in seen[1:] if e.type.startswith("response.")]


def test_the_sessions_transcription_language_and_prompt_reach_the_model(server, speak) -> None:
    speech = _pcm24(speak("good morning everyone"))

    async def turn(conn: Any, seen: list) -> Any:
        for i in range(0, len(speech), 9600):
            chunk = base64.b64encode(speech[i : i + 9600]).decode()
            await conn.input_audio_buffer.append(audio=chunk)
        await conn.input_audio_buffer.commit()
        return await _until(conn, "conversation.item.input_audio_transcription.completed", seen)

    async def session() -> tuple[Any, Any, Any, Any]:
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
        seen: list = []
        async with client.realtime.connect(model="qwen3-asr") as conn:
            await _until(conn, "session.created", seen)
            quiet = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
            await conn.session.update(session=quiet)
            await _until(conn, "session.updated", seen)
            plain = await turn(conn, seen)
            hinted = {"model": "qwen3-asr", "language": "de", "prompt": "Grafana, Kubernetes"}
            config = {"type": "realtime", "audio": {"input": {"transcription": hinted}}}
            await conn.session.update(session=config)
            updated = await _until(conn, "session.updated", seen)
            forced = await turn(conn, seen)
            bad = {"type": "realtime", "audio": {"input": {"transcription": {"language": 7}}}}
            await conn.session.update(session=bad)
            refused = await _until(conn, "error", seen)
            return plain, updated, forced, refused

    plain, updated, forced, refused = asyncio.run(session())
    described = updated.session.audio.input.transcription
    assert (described.language, described.prompt) == ("de", "Grafana, Kubernetes")
    # the same clip, heard with a forced language and a context: another greedy answer
    assert plain.transcript and forced.transcript and forced.transcript != plain.transcript
    assert refused.error.param == "session.audio.input.transcription.language"


PHRASES = (
    "one two three four",
    "the weather is nice today",
    "see you tomorrow",
    "where is the station",
    "thank you very much",
    "good night",
)


@pytest.fixture(scope="module")
def long_clip(speak) -> np.ndarray:
    """Spoken phrases with silences between them, 16 kHz int16: longer than a piece."""
    soxr = pytest.importorskip("soxr")
    parts = []
    for text in PHRASES:
        samples, rate = sf.read(io.BytesIO(speak(text)), dtype="float32")
        parts += [soxr.resample(samples, rate, 16000), np.zeros(9600, np.float32)]
    clip = np.round(np.concatenate(parts) * 32767).astype(np.int16)
    assert len(clip) > PIECE_SECONDS * 16000
    return clip


def _pcm16_wav(samples: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, samples, 16000, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def _pieces(clip: np.ndarray) -> list:
    """The pieces the server cuts, each short enough to be one piece when sent alone."""
    pieces = split_clip(clip.astype(np.float32) / 32768, 16000, PIECE_SECONDS)
    assert len(pieces) >= 2
    assert all(8000 <= p.length <= PIECE_SECONDS * 16000 for p in pieces)  # none padded
    return pieces


def test_a_long_clip_is_its_pieces_transcribed_and_joined_in_order(server, long_clip) -> None:
    pieces = _pieces(long_clip)
    alone = [
        _transcribe(server, _pcm16_wav(long_clip[p.start : p.start + p.length])) for p in pieces
    ]
    whole = _transcribe(server, _pcm16_wav(long_clip))
    assert all(a.text for a in alone) and len({a.text for a in alone}) > 1
    assert whole.text == "".join(a.text for a in alone)
    assert whole.usage.input_tokens == sum(a.usage.input_tokens for a in alone)
    assert whole.usage.output_tokens == sum(a.usage.output_tokens for a in alone)
    deltas, done = [], []
    for event in _transcribe(server, _pcm16_wav(long_clip), stream=True):
        if event.type == "transcript.text.delta":
            deltas.append(event.delta)
        elif event.type == "transcript.text.done":
            done.append(event)
    # piece 0 streams live, later pieces follow it, in order
    assert "".join(deltas) == whole.text == done[0].text
    assert done[0].usage.output_tokens == whole.usage.output_tokens


def test_a_long_clips_words_are_each_pieces_words_shifted_by_its_offset(server, long_clip) -> None:
    timed = {"response_format": "verbose_json", "timestamp_granularities": ["word"]}
    pieces = _pieces(long_clip)
    alone = [
        _transcribe(server, _pcm16_wav(long_clip[p.start : p.start + p.length]), **timed)
        for p in pieces
    ]
    whole = _transcribe(server, _pcm16_wav(long_clip), **timed)
    expected = [
        (w.word, round(w.start + p.offset, 3), round(w.end + p.offset, 3))
        for p, a in zip(pieces, alone, strict=True)
        for w in a.words
    ]
    assert sum(1 for a in alone if a.words) > 1  # words in more than one piece
    assert [(w.word, w.start, w.end) for w in whole.words] == expected
    assert whole.text == "".join(a.text for a in alone)
