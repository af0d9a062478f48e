"""The OpenAI preset (``server.openai_compat = true``): OpenAI's names, omni's models.

A client written for OpenAI sends OpenAI's model names (``tts-1``,
``gpt-4o-mini-tts``...) and voice names (``alloy``...), and expects
``/v1/audio/speech`` to answer mp3 when it names no ``response_format``.
The preset makes all three work without the operator listing them:

- :func:`model_names`: OpenAI's names of the APIs the pipeline serves (speech
  names for a speech pipeline, chat names for chat) become aliases of the
  served model (``whisper-1``, ``gpt-4o-transcribe`` … for a pipeline that
  serves transcription; ``gpt-realtime`` … for ``/v1/realtime`` on a chat
  pipeline). Names of APIs the pipeline does not serve are left out:
  accepting them would only move the client's error somewhere less clear.
- :func:`voice_aliases`: OpenAI's eleven voices map onto the model's own
  voices in order (``alloy`` the first, ``ash`` the second..., wrapping
  around), or onto :data:`.voices.CLONE_VOICE` for a cloning model that has
  none (then the request's ``ref_audio`` is the voice). The operator's
  ``server.voice_aliases`` entries win; a model voice of the same name is
  left alone; a model whose voices are not known before its download (a hub
  id) gets no mapping.
- :data:`SPEECH_FORMAT`: the speech API's ``response_format`` default, mp3
  as OpenAI documents (omni's own default is wav).
"""

from __future__ import annotations

SPEECH_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
CHAT_MODELS = ("gpt-4o-audio-preview", "gpt-4o-mini-audio-preview")
# /v1/realtime runs on a chat pipeline: the SDK's realtime client names one of these.
REALTIME_MODELS = (
    "gpt-realtime",
    "gpt-realtime-mini",
    "gpt-4o-realtime-preview",
    "gpt-4o-mini-realtime-preview",
)
TRANSCRIPTION_MODELS = ("whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe")
VOICES = (
    "alloy",
    "ash",
    "ballad",
    "coral",
    "echo",
    "fable",
    "onyx",
    "nova",
    "sage",
    "shimmer",
    "verse",
)
SPEECH_FORMAT = "mp3"
DEFAULT_SPEECH_FORMAT = "wav"  # without the preset


def model_names(api: tuple[str, ...] | list[str]) -> list[str]:
    """OpenAI's model names for the APIs a pipeline serves."""
    names: list[str] = []
    if "speech" in api:
        names += SPEECH_MODELS
    if "chat" in api:
        names += CHAT_MODELS + REALTIME_MODELS
    if "transcription" in api:
        names += TRANSCRIPTION_MODELS
    return names


def voice_aliases(builtin: list[str] | None, clone_voice: str | None) -> dict[str, str]:
    """OpenAI's voice names mapped onto ``builtin`` in order (see the module docstring).

    ``clone_voice``: the name a cloning model takes for "the request's
    ref_audio", used when the model has no voices of its own; None when it
    cannot clone.
    """
    if builtin is None:
        return {}
    own = {name.lower() for name in builtin}
    if builtin:
        targets = list(builtin)
    elif clone_voice:
        targets = [clone_voice]
    else:
        return {}
    return {
        name: targets[index % len(targets)] for index, name in enumerate(VOICES) if name not in own
    }
