"""What a listening pipeline receives for a transcription or translation.

Decision: the request reaches the pipeline as a chat request, the shape every
pipeline declaring ``"transcription"`` already reads, so no plugin needs a
transcription hook of its own:

- a system turn saying the job (verbatim transcript, or English translation,
  nothing else), and a user turn holding the audio as an ``input_audio``
  part followed by the instruction, as the Qwen3-Omni release's ASR and
  speech-translation examples phrase it ("Transcribe the audio into text.");
- ``language`` (ISO-639-1 or a name) goes into the instruction as a hint
  ("The speech is in de."); ``prompt`` goes in as context the transcript
  should be consistent with (names, spelling, style), never as a question;
- ``modalities: ["text"]``: no talker runs, whatever the pipeline could say;
- greedy decoding (temperature 0) unless the client sends a temperature.

The raw fields also travel as ``data["transcription"]`` (task, language,
prompt, ``timestamps``: ``["word"]`` when word timings are asked for) and
``params["api"] == "transcription"``, so a dedicated ASR model's entry stage
(qwen3-asr's) reads them directly and ignores the chat turns.
"""

from __future__ import annotations

from typing import Any

from .audio import Clip
from .form import TranscriptionForm

SYSTEM = {
    "transcribe": (
        "You are a speech recognition model. Write down exactly what is said in the audio, "
        "in the language it is spoken, and nothing else."
    ),
    "translate": (
        "You are a speech translation model. Translate what is said in the audio into "
        "English text, and write nothing else."
    ),
}
INSTRUCTION = {
    "transcribe": "Transcribe the audio into text.",
    "translate": "Listen to the provided speech and produce a translation in English text.",
}
AUDIO_PART = "messages.1.content.0.input_audio"  # where the stage finds the clip (see routes)


def chat_data(form: TranscriptionForm, clip: Clip) -> dict[str, Any]:
    """The request's ``data``: a chat request the pipeline's entry stage reads as any other."""
    instruction = INSTRUCTION[form.task]
    if form.language:
        instruction += f" The speech is in {form.language}."
    if form.prompt:
        instruction += (
            f" Keep the text consistent with this context (names, spelling, style): {form.prompt}"
        )
    audio = {"type": "input_audio", "input_audio": {"data": clip.data, "format": clip.format}}
    return {
        "model": form.model,
        "messages": [
            {"role": "system", "content": SYSTEM[form.task]},
            {"role": "user", "content": [audio, {"type": "text", "text": instruction}]},
        ],
        "modalities": ["text"],
        "stream": form.stream,
        "sampling": {
            "max_tokens": None,
            "temperature": 0.0 if form.temperature is None else form.temperature,
            "top_p": None,
            "top_k": None,
            "seed": None,
            "stop": [],
            "repetition_penalty": None,
        },
        "transcription": {
            "task": form.task,
            "language": form.language,
            "prompt": form.prompt,
            "timestamps": ["word"] if form.words else [],
        },
    }
