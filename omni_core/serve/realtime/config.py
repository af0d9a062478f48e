"""A realtime session's settings, as ``session.update`` writes them (GA and beta spellings).

The GA Realtime API nests audio settings (``session.audio.input.format``,
``…input.turn_detection``, ``…input.transcription``, ``…output.voice``,
``…output.format``) and names output ``output_modalities``; the beta API
(older SDKs) wrote them flat (``modalities``, ``input_audio_format``,
``output_audio_format``, ``voice``, ``turn_detection``,
``input_audio_transcription``). Both are read; what is sent back
(``session.created`` / ``session.updated``) is the GA shape. A field this
server cannot honour is refused by name (an ``error`` event; the session
keeps its previous settings), never silently ignored; fields that only tune
the hosted service (tracing, prompt caching, noise reduction) are accepted
and have no effect here.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any

from .formats import PCM24, AudioFormat, parse_format

IGNORED = {
    "tracing",
    "include",
    "prompt",
    "truncation",
    "tool_choice",
    "tools",
    "reasoning",
    "parallel_tool_calls",
    "client_secret",
    "expires_at",
    "object",
    "id",
    "model",
    "noise_reduction",
    "input_audio_noise_reduction",
    "type",
    "speed",
}


class ConfigError(ValueError):
    """A setting this session cannot take; ``param`` is its dotted name."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class TurnDetection:
    """``server_vad``: the server finds where the user's speech starts and stops."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True

    def describe(self) -> dict[str, Any]:
        return {"type": "server_vad", **self.__dict__}


@dataclass(frozen=True)
class SessionConfig:
    instructions: str = ""
    output_modalities: tuple[str, ...] = ("audio",)
    voice: str | None = None
    input_format: AudioFormat = PCM24
    output_format: AudioFormat = PCM24
    turn_detection: TurnDetection | None = field(default_factory=TurnDetection)
    transcription: bool = False
    # audio.input.transcription's language (ISO-639-1) and prompt (context), if given
    transcription_hints: tuple[str | None, str | None] = (None, None)
    max_output_tokens: int | None = None  # None: "inf" (the pipeline's own cap)
    # the beta API's sampling temperature, here 0..2 as in chat (0: greedy); None: the
    # pipeline's own sampling (GA clients never send it)
    temperature: float | None = None

    def _transcription(self, model: str) -> dict[str, Any] | None:
        if not self.transcription:
            return None
        language, prompt = self.transcription_hints
        hints = {"language": language, "prompt": prompt}
        return {"model": model, **{k: v for k, v in hints.items() if v is not None}}

    @classmethod
    def initial(cls, *, audio_out: bool, answers: bool) -> SessionConfig:
        """A new session's settings: it speaks if the pipeline can; a pipeline that cannot
        answer (no chat api: qwen3-asr) only listens, input transcription on, no responses."""
        from .vad import missing

        can_detect = missing() is None  # else turns end by commit (vad.missing says why)
        if answers:
            return cls(
                output_modalities=("audio",) if audio_out else ("text",),
                turn_detection=TurnDetection() if can_detect else None,
            )
        quiet = TurnDetection(create_response=False, interrupt_response=False)
        return cls(
            output_modalities=("text",),
            transcription=True,
            turn_detection=quiet if can_detect else None,
        )

    def describe(self, model: str, session_id: str) -> dict[str, Any]:
        """The GA ``session`` object of ``session.created`` / ``session.updated``."""
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": session_id,
            "model": model,
            "instructions": self.instructions,
            "output_modalities": list(self.output_modalities),
            "max_output_tokens": "inf"
            if self.max_output_tokens is None
            else self.max_output_tokens,
            **({} if self.temperature is None else {"temperature": self.temperature}),
            "audio": {
                "input": {
                    "format": self.input_format.describe(),
                    "turn_detection": self.turn_detection.describe()
                    if self.turn_detection
                    else None,
                    "transcription": self._transcription(model),
                },
                "output": {"format": self.output_format.describe(), "voice": self.voice},
            },
        }


def apply_update(config: SessionConfig, session: Any, *, audio_out: bool) -> SessionConfig:
    """``config`` with ``session`` (a ``session.update``'s object) applied; ConfigError if bad.

    ``audio_out``: whether the pipeline can speak (else ``audio`` output is refused).
    """
    if not isinstance(session, dict):
        raise ConfigError("session must be an object", "session")
    data = copy.deepcopy(session)
    changes: dict[str, Any] = {}
    audio = data.pop("audio", None)
    if audio is not None and not isinstance(audio, dict):
        raise ConfigError("session.audio must be an object", "session.audio")
    audio = audio or {}
    inp, out = audio.get("input") or {}, audio.get("output") or {}
    if not isinstance(inp, dict) or not isinstance(out, dict):
        raise ConfigError("session.audio.input/output must be objects", "session.audio")
    if "instructions" in data:
        text = data.pop("instructions")
        if not isinstance(text, str):
            raise ConfigError("instructions must be a string", "session.instructions")
        changes["instructions"] = text
    for name in ("output_modalities", "modalities"):
        if name in data:
            changes["output_modalities"] = _modalities(data.pop(name), name, audio_out)
    if "voice" in data or "voice" in out:
        voice = out.pop("voice") if "voice" in out else data.pop("voice")
        if voice is not None and not isinstance(voice, str):
            raise ConfigError("voice must be a string", "session.audio.output.voice")
        changes["voice"] = voice
    for where, key, target in (
        (inp, "format", "input_format"),
        (data, "input_audio_format", "input_format"),
        (out, "format", "output_format"),
        (data, "output_audio_format", "output_format"),
    ):
        if key in where:
            try:
                changes[target] = parse_format(where.pop(key))
            except ValueError as exc:
                param = f"session.{key}" if where is data else f"session.audio.{target[:-7]}.{key}"
                raise ConfigError(str(exc), param) from None
    for where, key in ((inp, "turn_detection"), (data, "turn_detection")):
        if key in where:
            changes["turn_detection"] = _turn_detection(where.pop(key))
    for where, key in ((inp, "transcription"), (data, "input_audio_transcription")):
        if key in where:
            value = where.pop(key)
            changes["transcription"] = value is not None
            changes["transcription_hints"] = _hints(value, key)
    for name in ("max_output_tokens", "max_response_output_tokens"):
        if name in data:
            changes["max_output_tokens"] = _max_tokens(data.pop(name), f"session.{name}")
    if "temperature" in data:
        changes["temperature"] = _temperature(data.pop("temperature"), "session.temperature")
    for where, prefix in ((inp, "session.audio.input."), (out, "session.audio.output.")):
        for key in where:
            if key not in IGNORED:
                raise ConfigError(f"{prefix}{key} is not a setting of this server", prefix + key)
    for key in data:
        if key not in IGNORED:
            raise ConfigError(f"session.{key} is not a setting of this server", f"session.{key}")
    return replace(config, **changes)


def _hints(value: Any, key: str) -> tuple[str | None, str | None]:
    """A transcription setting's ``language`` and ``prompt`` (strings, bounded), if any."""
    if not isinstance(value, dict):
        return None, None
    hints = []
    for name, limit in (("language", 64), ("prompt", 4096)):
        given = value.get(name)
        if given is not None and (not isinstance(given, str) or len(given) > limit):
            where = f"session.audio.input.{key}.{name}" if key == "transcription" else key
            raise ConfigError(f"{name} must be a string of at most {limit} characters", where)
        hints.append(given or None)
    return hints[0], hints[1]


def _modalities(value: Any, name: str, audio_out: bool) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or any(v not in ("text", "audio") for v in value):
        raise ConfigError(f'{name} must be ["text"] or ["audio"]', f"session.{name}")
    wanted = tuple(dict.fromkeys(value))
    if "audio" in wanted and not audio_out:
        raise ConfigError(
            f'this pipeline produces no audio; set {name} to ["text"]', f"session.{name}"
        )
    return ("audio",) if "audio" in wanted else ("text",)


def _turn_detection(value: Any) -> TurnDetection | None:
    if value is None:
        return None
    param = "session.audio.input.turn_detection"
    if not isinstance(value, dict) or value.get("type", "server_vad") != "server_vad":
        kind = value.get("type") if isinstance(value, dict) else value
        raise ConfigError(
            f"turn_detection {kind!r} is not supported; use server_vad or null", param
        )
    from .vad import missing

    if missing() is not None:
        raise ConfigError(str(missing()), param)
    known = {f for f in TurnDetection.__dataclass_fields__}
    fields = {k: v for k, v in value.items() if k in known}
    try:
        detection = TurnDetection(**fields)
        if not 0.0 <= float(detection.threshold) <= 1.0:
            raise ValueError("threshold must be within 0..1")
        for name in ("prefix_padding_ms", "silence_duration_ms"):
            if not 0 <= int(getattr(detection, name)) <= 10_000:
                raise ValueError(f"{name} must be within 0..10000")
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"turn_detection: {exc}", param) from None
    return detection


def _max_tokens(value: Any, param: str) -> int | None:
    if value == "inf" or value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096:
        raise ConfigError('max_output_tokens must be 1..4096 or "inf"', param)
    return value


def _temperature(value: Any, param: str) -> float | None:
    """The beta API's ``temperature``: OpenAI bounded it to 0.6..1.2 for its models; here
    it is what chat takes (0..2, 0 greedy), since a deterministic turn is worth having."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 2:
        raise ConfigError("temperature must be a number within 0..2 (0: greedy)", param)
    return float(value)
