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
