"""Chat prompts for the Qwen3-Omni thinker: template rendering, tokenisation, media expansion.

Messages come in already normalised to one internal form (the serving layer
maps OpenAI content parts such as ``image_url`` / ``input_audio`` onto it)::

    {"role": "system" | "user" | "assistant" | "tool",
     "content": str | [part, ...] | None}
    part = {"type": "text", "text": str}
         | {"type": "image"} | {"type": "audio"} | {"type": "video"}

Media parts carry no payload here (extra keys are allowed and ignored): the
template only decides *where* each medium goes. Assistant messages may also
carry ``reasoning_content`` and ``tool_calls``; they are passed to the
template untouched.

The template is the checkpoint's own Jinja text, looked up in the order the
reference processor (transformers 4.57.3 ``ProcessorMixin.from_pretrained``)
uses: ``chat_template.json`` (the release's file), then ``chat_template.jinja``
(what ``save_pretrained`` writes today), then the tokenizer's
``tokenizer_config.json["chat_template"]``. It is rendered in a sandboxed,
immutable Jinja environment with ``trim_blocks`` / ``lstrip_blocks``, the
loop-controls extension, a JSON ``tojson`` that keeps non-ASCII text, and the
``raise_exception`` / ``strftime_now`` helpers, as transformers does.

The rendered prompt holds one ``<|image_pad|>`` / ``<|audio_pad|>`` /
``<|video_pad|>`` per medium; :meth:`ChatPrompter.expand_placeholders` repeats
each one as many times as its encoder emits embeddings, in order of
appearance, which is what the reference processor's
``replace_multimodal_special_tokens`` does before tokenising (expanding the ids
after tokenising gives the same ids, since the pads are special tokens that
never merge with their neighbours). Per-medium counts follow the encoders:
:func:`.vision.processor.image_token_count` (patch grid / merge window) and
:func:`.audio.mel.audio_token_count` (mel frames through the audio tower's convolutions).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from omni_qwen3_tts.tokenizer import TextTokenizer

TEMPLATE_FILES = ("chat_template.json", "chat_template.jinja")
PART_TYPES = frozenset({"text", "image", "audio", "video"})
ROLES = frozenset({"system", "user", "assistant", "tool"})

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
IMAGE_PAD = "<|image_pad|>"
AUDIO_PAD = "<|audio_pad|>"
VIDEO_PAD = "<|video_pad|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
AUDIO_START = "<|audio_start|>"
AUDIO_END = "<|audio_end|>"


class ChatTemplateError(ValueError):
    """A checkpoint without a usable chat template, or messages it cannot render."""


def expand_placeholder_ids(ids: Iterable[int], counts: Mapping[int, Sequence[int]]) -> list[int]:
    """Repeat each placeholder id ``p`` in ``ids`` ``counts[p][k]`` times for its k-th occurrence.

    Every listed count must be used, and every occurrence must have a count.
    """
    queues = {pad: list(n) for pad, n in counts.items()}
    used = dict.fromkeys(queues, 0)
    out: list[int] = []
    for token in ids:
        queue = queues.get(token)
        if queue is None:
            out.append(token)
            continue
        k = used[token]
        if k >= len(queue):
            raise ValueError(
                f"the prompt has more placeholders (id {token}) than the {len(queue)} "
                "media counts given"
            )
        n = int(queue[k])
        if n < 0:
            raise ValueError(f"media token count must be >= 0, got {n}")
        used[token] = k + 1
        out.extend([token] * n)
    for pad, queue in queues.items():
        if used[pad] != len(queue):
            raise ValueError(
                f"{len(queue)} media counts given for placeholder id {pad}, but the prompt "
                f"has {used[pad]} such placeholders"
            )
    return out


def interleave_video_audio(
    grid: Sequence[int],
    seconds_per_grid: float,
    position_id_per_seconds: float,
    merge_size: int,
    audio_tokens: int,
) -> list[bool]:
    """The order of one video's tokens and its sound track's: True for video, False for audio.

    Each video token stands at ``t * seconds_per_grid * position_id_per_seconds``
    (its temporal grid step ``t``; all the tokens of one step together), the
    i-th audio token at ``i``; merged in time order, the video token first on
    a tie, what is left of either appended: the reference processor's order.
    """
    frames, height, width = (int(v) for v in grid)
    per_step = (height // merge_size) * (width // merge_size)
    times = [t * float(seconds_per_grid) * float(position_id_per_seconds) for t in range(frames)]
    video = [time for time in times for _ in range(per_step)]
    order: list[bool] = []
    v = a = 0
    while v < len(video) and a < audio_tokens:
        if video[v] <= a:
            order.append(True)
            v += 1
        else:
            order.append(False)
            a += 1
    order.extend([True] * (len(video) - v))
    order.extend([False] * (audio_tokens - a))
    return order


@dataclass(frozen=True)
class SpecialIds:
    """Token ids of the chat and media markers, read from the tokenizer."""

    im_start: int
    im_end: int
    end_of_text: int
    image_pad: int
    audio_pad: int
    video_pad: int
    vision_start: int
    vision_end: int
    audio_start: int
    audio_end: int


def load_chat_template(path: str | Path) -> str:
    """The checkpoint's chat template, in the reference processor's order of preference."""
    root = Path(path)
    legacy = root / "chat_template.json"
    if legacy.is_file():
        template = json.loads(legacy.read_text(encoding="utf-8")).get("chat_template")
        if isinstance(template, str) and template:
            return template
        raise ChatTemplateError(f"{legacy}: no 'chat_template' string inside")
    raw = root / "chat_template.jinja"
    if raw.is_file():
        return raw.read_text(encoding="utf-8")
    config = root / "tokenizer_config.json"
    if config.is_file():
        template = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
        if isinstance(template, str) and template:
            return template
    raise ChatTemplateError(
        f"{root}: no chat template (looked for chat_template.json, chat_template.jinja and "
        "'chat_template' in tokenizer_config.json); copy it from the checkpoint"
    )


@functools.lru_cache(maxsize=8)
def _compile(template: str):
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _GenerationBlock(Extension):
        # ``{% generation %}...{% endgeneration %}`` marks assistant text for
        # training masks; for prompting it renders its body unchanged.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_passthrough"), [], [], body).set_lineno(
                lineno
            )

        def _passthrough(self, caller):
            return caller()

    def raise_exception(message: str):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            value,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def _check_messages(messages: Sequence[Mapping[str, Any]]) -> None:
    if not messages:
        raise ChatTemplateError("messages must not be empty")
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in ROLES:
            raise ChatTemplateError(f"messages[{i}].role {role!r} is not one of {sorted(ROLES)}")
        content = message.get("content")
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, Sequence):
            raise ChatTemplateError(f"messages[{i}].content must be a string or a list of parts")
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind not in PART_TYPES:
                raise ChatTemplateError(
                    f"messages[{i}].content[{j}].type {kind!r} is not one of {sorted(PART_TYPES)} "
                    "(normalise OpenAI parts before rendering)"
                )
            if kind == "text" and not isinstance(part.get("text"), str):
                raise ChatTemplateError(f"messages[{i}].content[{j}] is a text part without text")


def end_of_turn_ids(root: Path) -> tuple[int, ...]:
    """:attr:`ChatPrompter.eos_token_ids`, read from ``tokenizer_config.json``'s added
    tokens without the vocabulary, whose 151k tokens took 0.15-0.3 s of every thinker
    start. A config that does not list both tokens is read whole, through the tokenizer.
    Nothing is checked against the vocabulary here: the preprocessing stage loads the
    whole tokenizer, which refuses a config whose ids disagree with it."""
    config_path = root / "tokenizer_config.json"
    if config_path.is_file():
        added = json.loads(config_path.read_text(encoding="utf-8")).get("added_tokens_decoder")
        ids = {
            spec.get("content"): int(index)
            for index, spec in (added or {}).items()
            if isinstance(spec, Mapping)
        }
        if IM_END in ids and END_OF_TEXT in ids:
            return (ids[IM_END], ids[END_OF_TEXT])
    return ChatPrompter.from_dir(root).eos_token_ids


class ChatPrompter:
    """Render chat messages with the checkpoint's template and turn them into thinker ids."""

    def __init__(
        self,
        tokenizer: TextTokenizer,
        template: str,
        special_tokens: Mapping[str, Any] | None = None,
    ):
        self.tokenizer = tokenizer
        self.template = template
        self._template_tokens = dict(special_tokens or {})
        self.ids = SpecialIds(
            im_start=self._single_id(IM_START),
            im_end=self._single_id(IM_END),
            end_of_text=self._single_id(END_OF_TEXT),
            image_pad=self._single_id(IMAGE_PAD),
            audio_pad=self._single_id(AUDIO_PAD),
            video_pad=self._single_id(VIDEO_PAD),
            vision_start=self._single_id(VISION_START),
            vision_end=self._single_id(VISION_END),
            audio_start=self._single_id(AUDIO_START),
            audio_end=self._single_id(AUDIO_END),
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> ChatPrompter:
        """Tokenizer files and chat template from a checkpoint (or preset) directory."""
        root = Path(path)
        tokenizer = TextTokenizer.from_dir(root)
        special: dict[str, Any] = {}
        config_path = root / "tokenizer_config.json"
        if config_path.is_file():
            config = json.loads(config_path.read_text(encoding="utf-8"))
            for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
                value = config.get(key)
                if isinstance(value, Mapping):
                    value = value.get("content")
                if isinstance(value, str):
                    special[key] = value
            extra = config.get("additional_special_tokens")
            if extra:
                special["additional_special_tokens"] = list(extra)
        return cls(tokenizer, load_chat_template(root), special)

    def _single_id(self, token: str) -> int:
        ids = self.tokenizer.encode(token)
        if len(ids) != 1:
            raise ChatTemplateError(f"the tokenizer has no single token for {token!r} (got {ids})")
        return ids[0]

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Ids that end an assistant turn: ``<|im_end|>`` then ``<|endoftext|>``."""
        return (self.ids.im_end, self.ids.end_of_text)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> str:
        """The prompt text with one placeholder per medium; extra keywords reach the template."""
        _check_messages(messages)
        return _compile(self.template).render(
            messages=list(messages),
            tools=list(tools) if tools else None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **{**self._template_tokens, **template_kwargs},
        )

    def expand_placeholders(
        self,
        prompt: str | Sequence[int],
        image_token_counts: Sequence[int] = (),
        audio_token_counts: Sequence[int] = (),
        video_token_counts: Sequence[int] = (),
        *,
        video_layouts: Sequence[Sequence[bool] | None] = (),
    ) -> list[int]:
        """Token ids of ``prompt`` (text or ids) with the k-th image / audio / video pad repeated.

        ``image_token_counts[k]`` is the number of embeddings the vision tower
        gives for the k-th image in prompt order (likewise for audio and
        video); the numbers of counts and placeholders must agree.
        ``video_layouts[k]``, when given and not None, says that the k-th
        video's sound track is interleaved with its frames
        (``use_audio_in_video``): its ``<|video_pad|>`` becomes
        ``<|audio_start|>``, one video (True) or audio (False) pad per entry
        (see :func:`interleave_video_audio`), then ``<|audio_end|>``, inside
        its vision markers, as the reference processor writes it. The audio
        counts cover the audio parts only.
        """
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        ids = expand_placeholder_ids(
            ids, {self.ids.image_pad: image_token_counts, self.ids.audio_pad: audio_token_counts}
        )
        out: list[int] = []
        counts, layouts = list(video_token_counts), list(video_layouts)
        k = 0
        for at, token in enumerate(ids):
            if token != self.ids.video_pad:
                out.append(token)
                continue
            if k >= len(counts):
                raise ValueError(
                    f"the prompt has more video placeholders than the {len(counts)} counts given"
                )
            layout = layouts[k] if k < len(layouts) else None
            if layout is None:
                out.extend([token] * int(counts[k]))
            else:
                framed = out[-1:] == [self.ids.vision_start] and ids[at + 1 : at + 2] == [
                    self.ids.vision_end
                ]
                if not framed or sum(1 for v in layout if v) != int(counts[k]):
                    raise ValueError(
                        f"video {k}: an interleaved sound track needs the pad between vision "
                        "markers and a layout holding its video count"
                    )
                out.append(self.ids.audio_start)
                out.extend(self.ids.video_pad if v else self.ids.audio_pad for v in layout)
                out.append(self.ids.audio_end)
            k += 1
        if k != len(counts):
            raise ValueError(
                f"{len(counts)} video counts given, but the prompt has {k} video placeholders"
            )
        return out

    def encode(
        self,
        messages: Sequence[Mapping[str, Any]],
        image_token_counts: Sequence[int] = (),
        audio_token_counts: Sequence[int] = (),
        video_token_counts: Sequence[int] = (),
        *,
        video_layouts: Sequence[Sequence[bool] | None] = (),
        **template_kwargs: Any,
    ) -> list[int]:
        """Render ``messages`` (with the generation prompt) and expand every medium to its ids."""
        text = self.render(messages, **template_kwargs)
        return self.expand_placeholders(
            text,
            image_token_counts,
            audio_token_counts,
            video_token_counts,
            video_layouts=video_layouts,
        )
