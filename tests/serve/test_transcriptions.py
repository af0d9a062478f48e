"""The transcription api in the core: who may declare it, and who refuses it.

The routes themselves run on a listening pipeline in
``plugins/qwen3_omni/tests/test_transcriptions.py``.
"""

from __future__ import annotations

import io

import openai
import pytest

from omni_core.errors import ConfigError
from omni_core.serve.service import Serving


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the SDK marks translations so
def test_a_pipeline_without_the_api_refuses_both_routes_naming_what_it_serves(speech_server):
    client = speech_server.client()
    with pytest.raises(openai.NotFoundError) as caught:
        client.audio.transcriptions.create(model="t-speech", file=("a.wav", io.BytesIO(b"RIFF")))
    body = caught.value.body
    assert body["code"] == "unsupported_api"
    assert "does not serve /v1/audio/transcriptions; it serves: speech, chat" in body["message"]
    with pytest.raises(openai.NotFoundError) as caught:
        client.audio.translations.create(model="t-speech", file=("a.wav", io.BytesIO(b"RIFF")))
    assert "/v1/audio/translations" in caught.value.body["message"]


def _pipeline(api: tuple[str, ...], text_stage: str | None) -> type:
    return type(
        "Listening",
        (),
        {
            "pipeline_name": "listening",
            "api": api,
            "audio_stage": None,
            "text_stage": text_stage,
            "sample_rate": None,
        },
    )


def test_transcription_is_a_known_api_that_needs_a_text_stage():
    assert Serving.of(_pipeline(("transcription",), "decode")).api == ("transcription",)
    with pytest.raises(ConfigError, match="serves transcription but declares no text_stage"):
        Serving.of(_pipeline(("transcription",), None))
    with pytest.raises(ConfigError, match="known: speech, chat, transcription"):
        Serving.of(_pipeline(("asr",), "decode"))


def test_the_openai_preset_names_transcription_models_only_where_it_is_served():
    from omni_core.serve.common import openai_compat

    assert "whisper-1" in openai_compat.model_names(("chat", "transcription"))
    assert "whisper-1" not in openai_compat.model_names(("chat", "speech"))


def test_a_text_stages_final_transcript_is_the_done_text_while_deltas_stay_raw():
    """qwen3-asr cleans its finished text (runaway repetitions); the stream's deltas went
    out as written, and the done event (like a non-streamed body) carries the clean text."""
    import json
    from types import SimpleNamespace

    import anyio

    from omni_core.serve.service import Piece, Service
    from omni_core.serve.transcribe.form import TranscriptionForm
    from omni_core.serve.transcribe.routes import _events

    service = Service(None, Serving.of(_pipeline(("transcription",), "align")), ("m",), 1.0)
    raw, clean = "so " + "ha" * 25, "so ha"
    final = {"finish_reason": "stop", "usage": None, "language": "English", "transcript": clean}
    finish, details = service._ending(SimpleNamespace(stage="align", final=True, data=final))
    assert finish == Piece("finish", "stop")
    assert details == Piece("details", {"language": "English", "transcript": clean})
    assert service._ending(SimpleNamespace(stage="decode", final=True, data=final)) == []

    async def stream() -> list[dict]:
        async def rest():
            yield Piece("text", raw[3:])
            yield details

        ended = {"usage": None, "details": {}}
        form = TranscriptionForm.__new__(TranscriptionForm)
        events = _events(Piece("text", raw[:3]), rest(), ended, form)
        return [json.loads(chunk.decode()[len("data: ") :]) async for chunk in events]

    *deltas, done = anyio.run(stream)
    assert "".join(d["delta"] for d in deltas) == raw
    assert done == {"type": "transcript.text.done", "text": clean}
