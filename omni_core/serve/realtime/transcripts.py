"""Input audio transcription: what the user said, as text, next to the audio item.

With ``audio.input.transcription`` set (beta: ``input_audio_transcription``),
each committed user audio item is transcribed by the same pipeline, as its
own text-only chat request (the audio and an instruction to write down what
is said), in the background: the answer does not wait for it. A pipeline
that only listens (api ``transcription``, e.g. qwen3-asr) gets the clip as
``/v1/audio/transcriptions`` sends it, and its sessions only transcribe.
The setting's ``language`` and ``prompt`` go where that API puts them: into
the instruction of a chat pipeline, into ``data["transcription"]`` of a
transcription pipeline. The result
arrives as ``conversation.item.input_audio_transcription.completed`` (or
``…failed``) and is kept on the item.
"""

from __future__ import annotations

from typing import Any

from ..common.errors import APIError
from .conversation import Conversation, Item
from .events import event

INSTRUCTION = "Transcribe the audio into text. Reply with the transcript only."
MAX_TRANSCRIPT_TOKENS = 256


async def transcribe(session: Any, item: Item) -> None:
    from .response import ResponsePlan, chat_data

    language, prompt = session.config.transcription_hints
    instruction = INSTRUCTION + (f" The speech is in {language}." if language else "")
    if prompt:
        instruction += f" Keep the text consistent with this context: {prompt}"
    scratch = Conversation()
    scratch.add(item)
    messages = scratch.messages(instruction)
    plan = ResponsePlan(instruction, ("text",), None, MAX_TRANSCRIPT_TOKENS)
    service, handle, text, final = session.service, None, [], None
    try:
        if "chat" in service.serving.api:
            data, api = chat_data(service, messages, plan), "chat"
            data["sampling"]["temperature"] = 0
        else:  # a listening-only pipeline reads the clip as /v1/audio/transcriptions sends it
            data, api = transcription_data(messages, language, prompt), "transcription"
        handle = await service.admit(data, {"api": api})
        async for piece in service.pieces(handle, path="/v1/realtime"):
            if piece.kind == "text":
                text.append(piece.data)
            elif piece.kind == "details":  # the pipeline's final text, when it gives one
                final = piece.data.get("transcript", final)
    except APIError as exc:
        await session._send(
            event(
                "conversation.item.input_audio_transcription.failed",
                item_id=item.id,
                content_index=0,
                error={"type": "transcription_error", "code": exc.code, "message": exc.message},
            ),
            quietly=True,
        )
        return
    finally:
        if handle is not None:
            await service.finish(handle, "transcription ended")
    transcript = (final if final is not None else "".join(text)).strip()
    item.parts[0]["transcript"] = transcript
    await session._send(
        event(
            "conversation.item.input_audio_transcription.completed",
            item_id=item.id,
            content_index=0,
            transcript=transcript,
        ),
        quietly=True,
    )


def transcription_data(
    messages: list[dict[str, Any]], language: str | None, prompt: str | None
) -> dict[str, Any]:
    """The request a transcription pipeline gets: the clip, the session's language and prompt.

    No token cap: a transcript is as long as its speech, within the pipeline's own cap.
    """
    return {
        "messages": messages,
        "modalities": ["text"],
        "stream": True,
        "sampling": {"max_tokens": None, "temperature": 0.0},
        "transcription": {"task": "transcribe", "language": language, "prompt": prompt},
    }
