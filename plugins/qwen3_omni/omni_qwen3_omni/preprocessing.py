"""The preprocessing stage: chat messages in; token ids, positions, mel and image patches out.

Video parts (``video_url`` / ``video``) are read with PyAV under
:class:`~omni_core.media.VideoLimits` (priced from the header, frames decoded
one at a time and only the sampled ones kept, :mod:`.vision.video` for the
release's sampling and resizing); their patches join the images' (in prompt
order) for the vision tower. With ``use_audio_in_video`` (a top-level
request field; by default on when the video has a sound track, as the
release's cookbook runs it) the track is decoded at 16 kHz under the audio
limits and its tokens interleaved with the frames' in time.

It is the only stage that reads what the client sent, so everything a
client can get wrong is refused here with a 400 naming the field: unknown
content, media that does not decode, too much media, bad sampling values.
Media are read under the core's bounds (:mod:`omni_core.media`); decoding,
resampling, the mel front end and patching run in a worker thread so the
event loop keeps serving other requests.

The prompt holds one placeholder token per encoder output row, in the order
the media appear in the messages; :mod:`.assemble` relies on that order.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import torch

from omni_core import RequestError
from omni_core.engine.interface import SamplingParams, check_sampling
from omni_core.media import AudioLimits, VideoLimits, decode_audio

from .audio.mel import SAMPLE_RATE as MEL_RATE
from .audio.mel import audio_token_count, log_mel
from .chat import ChatPrompter, interleave_video_audio
from .config import ThinkerConfig
from .loading import read_config
from .source import resolve_model_path
from .thinker.positions import MediaTokens, prompt_positions
from .vision.processor import ImageProcessorConfig, image_to_patches, smart_resize
from .vision.video import VideoPlan, VideoRefused, first_resize, plan_video, video_to_patches

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
IMAGE_PARTS = {"image_url", "image"}
AUDIO_PARTS = {"input_audio", "audio_url", "audio"}
VIDEO_PARTS = {"video_url", "video"}


@dataclass(frozen=True)
class Limits:
    """What one request may ask of this stage; every bound is checked before decoding.

    The prompt budget is estimated from the text and the media's headers
    (image sizes give exact placeholder counts, audio durations an upper
    bound), so a request whose media would overflow it is refused in
    milliseconds instead of after minutes of decoding and encoding.
    """

    max_images: int
    max_audios: int
    max_audio_seconds: float
    max_media_bytes: int
    max_image_pixels: int = 8192 * 8192
    max_request_pixels: int = 2 * 8192 * 8192
    max_request_audio_seconds: float = 600.0
    max_prompt_tokens: int = 8192
    max_videos: int = 2
    max_video_seconds: float = 600.0
    max_video_frames: int = 36_000
    max_video_pixels: int = 4096 * 2160

    def video(self) -> VideoLimits:
        return VideoLimits(
            max_bytes=self.max_media_bytes,
            max_seconds=self.max_video_seconds,
            max_frames=self.max_video_frames,
            max_pixels=self.max_video_pixels,
        )

    def audio(self) -> AudioLimits:
        return AudioLimits(max_seconds=self.max_audio_seconds, max_bytes=self.max_media_bytes)


@dataclass
class _Video:
    """One video part, as its header priced it."""

    plan: VideoPlan
    track_seconds: float | None  # the sound track's declared length, when it is interleaved


class Preprocessing:
    def __init__(self, root: Path, limits: Limits, max_tokens: int):
        self.config: ThinkerConfig = read_config(root)
        self.media_tokens = MediaTokens.from_config(self.config)
        self.prompter = ChatPrompter.from_dir(root)
        self.special = sorted(set(self.prompter.tokenizer.special_tokens().values()), key=len)
        self.images = ImageProcessorConfig.from_dict(_json(root / "preprocessor_config.json"))
        self.images.check_against(self.config.vision)
        # The processor's video half reads its own file when the checkpoint has one.
        video_file = root / "video_preprocessor_config.json"
        self.videos = (
            ImageProcessorConfig.from_dict(_json(video_file))
            if video_file.is_file()
            else self.images
        )
        self.videos.check_against(self.config.vision)
        self.generation = _json(root / "generation_config.json")
        raw = _json(root / "config.json")
        speakers = (raw.get("talker_config") or {}).get("speaker_id") or {}
        self.speakers = sorted(str(name).lower() for name in speakers)
        self.limits, self.max_tokens = limits, max_tokens

    async def run(self, request: Any) -> dict[str, Any]:
        data = dict(request.data or {})
        if "messages" not in data and "input" in data:
            data = _speech_request(data)
        messages = data.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError("'messages' must be a non-empty list")
        fetch = _media_fetch(request.params, self.limits.max_media_bytes)
        internal, media = _normalise(messages)
        self._check_counts(media)
        raw = [await _read(kind, value, where, fetch) for kind, value, where in media]
        # Off the event loop from here on: a long text's scan and tokenization, header
        # reads and decoding must never hold the loop (its heartbeat proves it alive).
        return await anyio.to_thread.run_sync(self._prepare, data, internal, media, raw)

    def _refuse_markers(self, internal: list[dict[str, Any]]) -> None:
        """Refuse text holding the template's own markers (``<|im_start|>``, ``<|image_pad|>``...).

        The tokenizer reads them as the special tokens they spell, so a client
        could forge turns or placeholders that no encoder output fills.
        """
        for m_index, message in enumerate(internal):
            for part in message["content"]:
                text = part.get("text") or ""
                found = next((t for t in self.special if t in text), None) if "<" in text else None
                if found:
                    raise RequestError(
                        f"messages.{m_index}: the text contains {found!r}, a control token of "
                        "the chat template; remove it (media go in image_url / input_audio parts)"
                    )

    def _check_counts(self, media: list[tuple[str, Any, str]]) -> None:
        for kind, plural, limit, name in (
            ("image", "images", self.limits.max_images, "max_images"),
            ("audio", "audio clips", self.limits.max_audios, "max_audios"),
            ("video", "videos", self.limits.max_videos, "max_videos"),
        ):
            count = sum(1 for k, _, _ in media if k == kind)
            if count > limit:
                raise RequestError(
                    f"the messages hold {count} {plural}; this server takes at most "
                    f"{limit} per request (factory.{name} of the preprocessing stage)"
                )

    def _check_budget(
        self,
        internal: list[dict[str, Any]],
        media: list[tuple[str, Any, str]],
        raw: list[Any],
        audio_in_video: bool | None,
    ) -> list[_Video | None]:
        """Refuse, from headers and text alone, a request over its pixel, audio or token budget.

        Returns each video's plan (None for the other media), for decoding.
        """
        from omni_core.media import ImageLimits, probe_audio, probe_image, probe_video

        image_limits = ImageLimits(
            max_bytes=self.limits.max_media_bytes, max_pixels=self.limits.max_image_pixels
        )
        audio_limits, video_limits = self.limits.audio(), self.limits.video()
        pixels, seconds, image_counts, audio_counts = 0, 0.0, [], []
        video_counts: list[int] = []
        layouts: list[list[bool] | None] = []
        videos: list[_Video | None] = []
        merge, factor = self.images.merge_size, self.images.patch_size * self.images.merge_size
        for (kind, _, where), (payload, _mime) in zip(media, raw, strict=True):
            videos.append(None)
            if kind == "image":
                width, height = probe_image(payload, where, image_limits)
                pixels += width * height
                try:
                    h, w = smart_resize(
                        height, width, factor, self.images.min_pixels, self.images.max_pixels
                    )
                except ValueError as exc:
                    raise RequestError(f"{where}: {exc}") from None
                image_counts.append(
                    (h // self.images.patch_size) * (w // self.images.patch_size) // (merge * merge)
                )
            elif kind == "video":
                info = probe_video(payload, where, video_limits)
                try:
                    plan = plan_video(info.height, info.width, info.frames, info.fps, self.videos)
                except VideoRefused as exc:
                    raise RequestError(f"{where}: {exc}") from None
                t, gh, gw = plan.grid
                video_counts.append(t * gh * gw // (merge * merge))
                interleave = bool(info.audio) if audio_in_video is None else audio_in_video
                if interleave and info.audio is None:
                    raise RequestError(
                        f"{where}: use_audio_in_video is true but this video has no sound "
                        "track; send it with use_audio_in_video: false"
                    )
                track = None
                if interleave:
                    track = min(info.audio.seconds, self.limits.max_audio_seconds)
                    if info.audio.seconds > self.limits.max_audio_seconds:
                        raise RequestError(
                            f"{where}: its sound track is {info.audio.seconds:.1f} s long; the "
                            f"limit is {self.limits.max_audio_seconds:g} s "
                            "(factory.max_audio_seconds of the preprocessing stage)"
                        )
                    seconds += track
                    estimate = audio_token_count(math.ceil(track * 100) + 1)
                    layouts.append(self._layout(plan, estimate))
                else:
                    layouts.append(None)
                videos[-1] = _Video(plan, track)
            else:
                clip = probe_audio(payload, where, audio_limits)
                seconds += clip
                # One mel frame per 10 ms, rounded up: an upper bound of the exact count.
                audio_counts.append(audio_token_count(math.ceil(clip * 100) + 1))
        if pixels > self.limits.max_request_pixels:
            raise RequestError(
                f"the images hold {pixels} pixels together; this server takes at most "
                f"{self.limits.max_request_pixels} per request "
                "(factory.max_request_pixels of the preprocessing stage)"
            )
        if seconds > self.limits.max_request_audio_seconds:
            raise RequestError(
                f"the audio clips last {seconds:.1f} s together; this server takes at most "
                f"{self.limits.max_request_audio_seconds:g} s per request "
                "(factory.max_request_audio_seconds of the preprocessing stage)"
            )
        tokens = len(
            self.prompter.encode(
                internal, image_counts, audio_counts, video_counts, video_layouts=layouts
            )
        )
        if tokens > self.limits.max_prompt_tokens:
            raise RequestError(
                f"the prompt would take about {tokens} tokens (text and media placeholders); "
                f"this server takes at most {self.limits.max_prompt_tokens} "
                "(factory.max_prompt_tokens of the preprocessing stage)",
                hint="send fewer or smaller images, shorter audio or video, or less text",
            )
        return videos

    def _layout(self, plan: VideoPlan, audio_tokens: int) -> list[bool]:
        return interleave_video_audio(
            plan.grid,
            plan.seconds_per_grid,
            self.media_tokens.position_id_per_seconds,
            self.images.merge_size,
            audio_tokens,
        )

    def _prepare(
        self,
        data: dict[str, Any],
        internal: list[dict[str, Any]],
        media: list[tuple[str, Any, str]],
        raw: list[Any],
    ) -> dict[str, Any]:
        self._refuse_markers(internal)
        audio_in_video = data.get("use_audio_in_video")
        if audio_in_video is not None and not isinstance(audio_in_video, bool):
            raise RequestError("use_audio_in_video: must be true or false")
        videos = self._check_budget(internal, media, raw, audio_in_video)
        images, audios, image_grids, audio_counts = [], [], [], []
        video_grids, video_seconds, video_counts, layouts = [], [], [], []
        merge = self.images.merge_size
        for (kind, _, where), payload, video in zip(media, raw, videos, strict=True):
            if kind == "image":
                pixels, grid = self._image(payload, where)
                images.append({"pixel_values": pixels, "grid_thw": list(grid)})
                image_grids.append(tuple(grid))
            elif kind == "video":
                assert video is not None
                pixels, grid = self._video(payload, where, video.plan)
                images.append({"pixel_values": pixels, "grid_thw": list(grid)})
                video_grids.append(tuple(grid))
                video_seconds.append(video.plan.seconds_per_grid)
                video_counts.append(grid[0] * grid[1] * grid[2] // (merge * merge))
                if video.track_seconds is None:
                    layouts.append(None)
                    continue
                mel = self._video_track(payload, where)
                audios.append(mel)
                count = audio_token_count(int(mel.shape[-1]))
                audio_counts.append(count)
                layouts.append(self._layout(video.plan, count))
            else:
                mel = self._audio(payload, where)
                audios.append(mel)
                audio_counts.append(audio_token_count(int(mel.shape[-1])))
        sources = self._audio_sources(media, videos)
        part_audio = [n for n, k in zip(audio_counts, sources, strict=True) if k]
        token_ids = self.prompter.encode(
            internal,
            [t * h * w // (merge * merge) for t, h, w in image_grids],
            part_audio,
            video_counts,
            video_layouts=layouts,
        )
        placed = prompt_positions(
            token_ids,
            self.media_tokens,
            image_grids=image_grids,
            video_grids=video_grids,
            video_seconds_per_grid=video_seconds,
            audio_lengths=audio_counts,
        )
        positions, next_position = placed.positions, placed.next_position
        sampling = self._sampling(data.get("sampling") or _legacy_sampling(data))
        return {
            "prompt": {
                "token_ids": token_ids,
                "positions": positions,
                "next_position": int(next_position),
            },
            "images": images,
            "audios": audios,
            "sampling": sampling,
            "stop": list((data.get("sampling") or {}).get("stop") or []),
            "modalities": list(data.get("modalities") or ["text"]),
            "voice": self._voice(data),
        }

    @staticmethod
    def _audio_sources(
        media: list[tuple[str, Any, str]], videos: list[_Video | None]
    ) -> list[bool]:
        """For each decoded clip in prompt order: True for an audio part, False for a track."""
        out = []
        for (kind, _, _), video in zip(media, videos, strict=True):
            if kind == "audio":
                out.append(True)
            elif video is not None and video.track_seconds is not None:
                out.append(False)
        return out

    def _voice(self, data: dict[str, Any]) -> str | None:
        """The requested speaker, checked against the checkpoint's (a 400 lists them)."""
        audio = data.get("audio") or {}
        voice = audio.get("voice") if isinstance(audio, dict) else None
        voice = voice or data.get("voice")
        if voice is None or "audio" not in (data.get("modalities") or []):
            return None
        known = self.speakers
        if str(voice).lower() not in known:
            listed = ", ".join(known) or "none"
            raise RequestError(
                f"unknown voice {voice!r}; this model's speakers are: {listed}; map other "
                "names to these with server.voice_aliases, or set server.openai_compat = true "
                "for OpenAI's voice names"
            )
        return str(voice).lower()

    def _image(self, payload: Any, where: str) -> tuple[torch.Tensor, tuple[int, int, int]]:
        from omni_core.media import ImageLimits, decode_image

        raw, _mime = payload
        limits = ImageLimits(
            max_bytes=self.limits.max_media_bytes, max_pixels=self.limits.max_image_pixels
        )
        array = decode_image(raw, where, limits)
        try:
            pixels, grid = image_to_patches(array, self.images)
        except ValueError as exc:
            raise RequestError(f"{where}: {exc}") from None
        return pixels, tuple(int(v) for v in grid)

    def _audio(self, payload: Any, where: str) -> torch.Tensor:
        raw, _mime = payload
        return _mel(decode_audio(raw, where, self.limits.audio()), where)

    def _video(
        self, payload: Any, where: str, plan: VideoPlan
    ) -> tuple[torch.Tensor, tuple[int, int, int]]:
        from omni_core.media import decode_video_frames

        raw, _mime = payload
        frames = decode_video_frames(
            raw, where, self.limits.video(), plan.indices, lambda px: first_resize(px, plan)
        )
        return video_to_patches(frames, plan, self.videos)

    def _video_track(self, payload: Any, where: str) -> torch.Tensor:
        from omni_core.media import decode_video_audio

        raw, _mime = payload
        clip = decode_video_audio(raw, where, self.limits.audio(), self.limits.video())
        if clip is None:
            raise RequestError(f"{where}: the video's sound track holds no samples")
        return _mel(clip, where)

    def _sampling(self, given: dict[str, Any]) -> dict[str, Any]:
        g = self.generation
        greedy_default = not g.get("do_sample", False)

        def pick(key: str, default: Any) -> Any:
            value = given.get(key)
            return default if value is None else value

        max_tokens = pick("max_tokens", self.max_tokens)
        if max_tokens > self.max_tokens:
            raise RequestError(
                f"max_tokens is {max_tokens}; this server allows at most {self.max_tokens} "
                "(factory.max_tokens of the preprocessing stage)"
            )
        top_k = pick("top_k", g.get("top_k", 0))
        params = SamplingParams(
            temperature=float(
                pick("temperature", 0.0 if greedy_default else g.get("temperature", 1.0))
            ),
            top_k=0 if top_k in (-1, None) else int(top_k),
            top_p=float(pick("top_p", g.get("top_p", 1.0))),
            repetition_penalty=float(pick("repetition_penalty", g.get("repetition_penalty", 1.0))),
            seed=given.get("seed"),
            max_new_tokens=int(max_tokens),
        )
        check_sampling(params)
        return {
            "temperature": params.temperature,
            "top_k": params.top_k,
            "top_p": params.top_p,
            "repetition_penalty": params.repetition_penalty,
            "seed": params.seed,
            "max_new_tokens": params.max_new_tokens,
        }


def _mel(clip: Any, where: str) -> torch.Tensor:
    """A decoded clip as the release hears it: mono (channel mean), 16 kHz (soxr HQ), log-mel."""
    mono = clip.samples.mean(axis=1).astype(np.float32)
    if clip.rate != MEL_RATE:
        import soxr

        mono = soxr.resample(mono, clip.rate, MEL_RATE).astype(np.float32)
    if mono.shape[0] < MEL_RATE // 100:
        raise RequestError(f"{where}: the clip is shorter than 10 ms")
    return log_mel(mono)


def _speech_request(data: dict[str, Any]) -> dict[str, Any]:
    """``/v1/audio/speech``: the input is the user's turn and the spoken answer the reply.

    Qwen3-Omni answers what it hears or reads; it has no read-aloud mode in
    the release, so ``input`` is a prompt, and ``instructions`` its system turn.
    """
    messages = []
    if data.get("instructions"):
        messages.append({"role": "system", "content": str(data["instructions"])})
    messages.append({"role": "user", "content": str(data["input"])})
    return {**data, "messages": messages, "modalities": ["audio"]}


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def _legacy_sampling(data: dict[str, Any]) -> dict[str, Any]:
    """Sampling fields read from the top level of the body (callers other than the server)."""
    keys = ("temperature", "top_p", "top_k", "seed", "repetition_penalty", "stop")
    out = {k: data.get(k) for k in keys}
    out["max_tokens"] = data.get("max_completion_tokens") or data.get("max_tokens")
    if isinstance(out["stop"], str):
        out["stop"] = [out["stop"]]
    return out


def _normalise(messages: list[Any]) -> tuple[list[dict[str, Any]], list[tuple[str, Any, str]]]:
    """OpenAI messages -> the chat template's form, and the media in order of appearance."""
    internal: list[dict[str, Any]] = []
    media: list[tuple[str, Any, str]] = []
    for m_index, message in enumerate(messages):
        where = f"messages.{m_index}"
        role = ROLES.get(message.get("role")) if isinstance(message, dict) else None
        if role is None:
            raise RequestError(
                f"{where}.role: must be one of {', '.join(ROLES)} for qwen3-omni "
                "(tool messages are not supported)"
            )
        content = message.get("content")
        if content is None:
            content = ""
        if isinstance(content, str):
            internal.append({"role": role, "content": [{"type": "text", "text": content}]})
            continue
        parts = []
        for p_index, part in enumerate(content):
            kind, at = part.get("type"), f"{where}.content.{p_index}"
            if kind in ("text", "refusal"):
                parts.append({"type": "text", "text": part[kind]})
            elif kind in IMAGE_PARTS:
                if role != "user":
                    raise RequestError(f"{at}: only user messages may hold images")
                value = part[kind]["url"] if kind == "image_url" else part[kind]
                media.append(("image", value, f"{at}.{kind}"))
                parts.append({"type": "image"})
            elif kind in AUDIO_PARTS:
                if role != "user":
                    raise RequestError(f"{at}: only user messages may hold audio")
                value = part[kind] if kind != "audio_url" else part[kind]["url"]
                media.append(("audio", value, f"{at}.{kind}"))
                parts.append({"type": "audio"})
            elif kind in VIDEO_PARTS:
                if role != "user":
                    raise RequestError(f"{at}: only user messages may hold video")
                value = part[kind]["url"] if kind == "video_url" else part[kind]
                media.append(("video", value, f"{at}.{kind}"))
                parts.append({"type": "video"})
            else:
                raise RequestError(f"{at}.type: qwen3-omni does not take {kind!r} parts")
        internal.append({"role": role, "content": parts})
    return internal, media


def _media_fetch(params: Any, max_bytes: int) -> Any:
    from omni_core.media import MediaFetch

    given = dict((params or {}).get("media") or {})
    return MediaFetch(
        allow_remote=bool(given.get("allow_remote", False)),
        max_bytes=int(given.get("max_bytes", max_bytes)),
        timeout=float(given.get("timeout", 30.0)),
    )


async def _read(kind: str, value: Any, where: str, fetch: Any) -> tuple[bytes, str | None]:
    from omni_core.media import read_base64, read_media

    if isinstance(value, dict):  # input_audio: {"data": base64, "format": ...}
        return read_base64(value["data"], f"{where}.data", fetch.max_bytes), value.get("format")
    return await read_media(value, where, fetch)


def create_preprocessing(
    model_path: str,
    max_audio_seconds: float = 300.0,
    max_images: int = 16,
    max_audios: int = 8,
    max_media_bytes: int = 32 * 1024 * 1024,
    max_tokens: int = 2048,
    max_image_pixels: int = 8192 * 8192,
    max_request_pixels: int = 2 * 8192 * 8192,
    max_request_audio_seconds: float = 600.0,
    max_prompt_tokens: int = 8192,
    max_videos: int = 2,
    max_video_seconds: float = 600.0,
    max_video_frames: int = 36_000,
    max_video_pixels: int = 4096 * 2160,
) -> Preprocessing:
    limits = Limits(
        max_images,
        max_audios,
        max_audio_seconds,
        max_media_bytes,
        max_image_pixels,
        max_request_pixels,
        max_request_audio_seconds,
        max_prompt_tokens,
        max_videos,
        max_video_seconds,
        max_video_frames,
        max_video_pixels,
    )
    return Preprocessing(resolve_model_path(model_path).path, limits, max_tokens)
