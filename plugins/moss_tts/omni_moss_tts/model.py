"""``MossTTSModel``: the network, its prompts and the engine's step functions.

One engine step is one position of the delay pattern: the backbone runs once
for every sequence of the batch, the text head picks (or the drain forces)
the text token, and the audio heads sample the codebooks the delay pattern
has due at this position. Frames come out whole: a step's output carries the
frames whose last codebook it produced (one per step inside audio, none
before the first 32 positions of a segment), already un-delayed, so the
vocoder never sees the delay pattern.

A sequence finishes at ``audio_end`` (its one audio segment is complete:
the release's examples keep the first segment only) or ``<|im_end|>``.
Sampling follows the release's loop (see :class:`~.delay.DelayTracker` for
the masks); the differences are deliberate and listed in ``sample_step``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from omni_core.engine.interface import CacheLayout, SamplingParams, Sequence, StepResult
from omni_core.engine.sampling import make_generator, sample, to_device
from omni_qwen3_tts.talker import forward_rows
from omni_qwen3_tts.tokenizer import TextTokenizer

from .codec import AudioTokenizer
from .config import GenerationDefaults, MossTTSConfig
from .delay import DelayTracker
from .loading import (
    check_load_format,
    load_codec,
    load_network,
    model_root,
    parse_dtype,
    read_config,
    read_json,
)
from .network import MossNetwork
from .prompt import MossPrompt, PromptBuilder

# Steps a sequence may spend before its first frame. The release's prompt ends
# where the answer starts, and the model enters audio at once (its first token
# is audio_start); text before that is a failing model, not speech coming.
MAX_TEXT_STEPS = 64


@dataclass
class StepOutput:
    """One step of one sequence, as the engine streams it to the request.

    ``frames``: new frames completed at this step ``[n, Q]`` (long, CPU);
    ``context``: frames of a continuation prompt's reference completed now
    (decoded by the vocoder as context, never played); ``text``: the step's
    text token; ``finish_reason``: set on the last step (``stop`` at the
    segment's end or ``<|im_end|>``, ``length`` when the frame cap ended it).
    """

    text: int
    frames: torch.Tensor
    context: torch.Tensor
    finish_reason: str | None = None


@dataclass
class TextSampling:
    """The text head's sampling parameters (audio's are the engine's ``SamplingParams``)."""

    temperature: float = 1.5
    top_k: int = 50
    top_p: float = 1.0


@dataclass
class RequestPrompt:
    """What a request submits to the engine: the prompt and its text-channel sampling."""

    prompt: MossPrompt
    text: TextSampling = field(default_factory=TextSampling)


class MossTTSModel:
    """Network + codec + tokenizer + prompt builder, and the engine's ``StepModel``."""

    #: Ranks the backbone is split over (rank 0's cache holds its share of the KV heads)
    tp_size: int = 1

    def __init__(
        self,
        config: MossTTSConfig,
        generation: GenerationDefaults,
        network: MossNetwork,
        codec: AudioTokenizer | None,
        tokenizer: TextTokenizer | None,
        path: Path | None = None,
    ):
        self.config, self.generation, self.network = config, generation, network
        self.codec, self.tokenizer, self.path = codec, tokenizer, path
        self.prompts = PromptBuilder(config, tokenizer) if tokenizer is not None else None
        param = next(network.parameters())
        self.device, self.dtype = param.device, param.dtype

    @classmethod
    def from_pretrained(
        cls,
        model_path: str = "tiny",
        load_format: str = "auto",
        dtype: str | torch.dtype | None = None,
        device: str | torch.device = "cpu",
        seed: int = 0,
        codec_path: str | None = None,
        codec: AudioTokenizer | None = None,
        with_codec: bool = True,
    ) -> MossTTSModel:
        """Load from a preset, a checkpoint directory or a hub id (strictly, or ``dummy``).

        ``codec``: an already loaded codec to use (stages share one per
        process); otherwise it is loaded as ``source.resolve_codec`` locates
        it, unless ``with_codec`` is false.
        """
        check_load_format(load_format)
        root = model_root(model_path, load_format)
        dev = torch.device(device)
        config, generation = read_config(root)
        # auto: the checkpoint's dtype (its config.json) where this device is fast
        weights_dtype = parse_dtype(dtype, dev, config=read_json(root / "config.json"))
        network = load_network(root, config, load_format, weights_dtype, dev, seed)
        if codec is None and with_codec:
            codec = load_codec(model_path, codec_path, load_format, dev, seed)
        return cls(config, generation, network, codec, TextTokenizer.from_dir(root), root)

    # -- engine step API ------------------------------------------------------

    def cache_layout(self) -> CacheLayout:
        return CacheLayout.of(self.config.backbone, self.dtype, self.device, self.tp_size)

    def prompt_length(self, prompt: Any) -> int:
        return len(_request(prompt).prompt)

    def prefix_rows(self, seq: Sequence) -> torch.Tensor:
        """A position's keys follow from its 33 ids and those before it: the engine may
        copy a shared prompt head (the instruction template) from another request."""
        return _request(seq.prompt).prompt.ids

    def prepare_static(self, context: Any) -> None:
        """The static decode step the engine compiles: the backbone's one-position step."""
        self._static = context.decoder(
            "backbone",
            self.network.language_model,
            hidden=self.config.backbone.hidden_size,
            dtype=self.dtype,
        )

    def chunked_prefill(self, seq: Sequence) -> bool:
        """A long prompt (a long reference clip to continue) may be prefilled over several
        steps: every position's keys follow from its ids, like a shared head's."""
        return True

    @torch.no_grad()
    def prefill(self, sequences: list[Sequence], cache: Any) -> list[StepResult]:
        """Each prompt from ``seq.cached`` on (a shared head, or the chunks before, are in
        the slot already) to ``seq.prefill_end``: a chunk samples nothing."""
        embeds, contexts, done = [], [], []
        for row, seq in enumerate(sequences):
            request = _request(seq.prompt)
            ids = request.prompt.ids
            end = len(ids) if seq.prefill_end is None else min(int(seq.prefill_end), len(ids))
            embeds.append(self.network.embed(ids[seq.cached : end].to(self.device)))
            if end < len(ids):
                continue
            tracker = DelayTracker.after_prompt(self.config, ids, request.prompt.max_frames)
            seq.state.update(tracker=tracker, text=request.text, prompt_ids=ids, rows=[])
            contexts.append(tracker.complete_prefix(ids[_audio_rows(self.config, ids) :, 1:]))
            done.append(row)
        hidden = self._forward(sequences, embeds, cache)
        results = [StepResult(output=None)] * len(sequences)
        if not done:
            return results
        finished = [sequences[row] for row in done]
        if len(done) < len(sequences):
            hidden = hidden[torch.tensor(done, device=hidden.device)]
        emitted = self._emit(finished, hidden)
        for row, result, context in zip(done, emitted, contexts, strict=True):
            if result.output is not None and context.shape[0]:
                result.output.context = torch.cat([context, result.output.context])
            results[row] = result
        return results

    @torch.no_grad()
    def decode(self, sequences: list[Sequence], cache: Any) -> list[StepResult]:
        last = torch.stack([seq.state["rows"][-1] for seq in sequences]).to(self.device)
        embeds = list(self.network.embed(last)[:, None])
        return self._emit(sequences, self._forward(sequences, embeds, cache))

    def _forward(
        self, sequences: list[Sequence], embeds: list[torch.Tensor], cache: Any
    ) -> torch.Tensor:
        """Run the backbone on each sequence's new positions; return the last hidden states."""
        static = getattr(self, "_static", None)
        stack = self.network.language_model
        return forward_rows(stack, static, sequences, embeds, cache, self.dtype, self.device)

    def _emit(self, sequences: list[Sequence], hidden: torch.Tensor) -> list[StepResult]:
        for seq in sequences:
            if seq.generator is None:
                seq.generator = make_generator(seq.sampling.seed, self.device)
        texts = self._sample_text(sequences, hidden)
        codes = self._sample_audio(sequences, hidden)
        results = []
        for seq, text, row in zip(sequences, texts, codes, strict=True):
            tracker: DelayTracker = seq.state["tracker"]
            capped = (
                tracker.in_audio
                and tracker.drain is None
                and tracker.new_frames + 1 >= tracker.frame_cap
            )
            completed = tracker.advance(text, row)
            new = [codes_ for index, codes_ in completed if index >= tracker.prefix_frames]
            context = [codes_ for index, codes_ in completed if index < tracker.prefix_frames]
            if capped:
                seq.state["capped"] = True
            seq.state["rows"].append(torch.tensor([text, *row], dtype=torch.long))
            if tracker.drain == self.config.n_vq:
                # The segment's last frame is complete and the next position is fixed
                # (audio_end, no codebook due): take it without running the backbone.
                text, row = self.config.audio_end_token_id, [self.config.audio_pad_code] * len(row)
                tracker.advance(text, row)
                seq.state["rows"].append(torch.tensor([text, *row], dtype=torch.long))
            done = text in (self.config.audio_end_token_id, self.config.im_end_token_id)
            reason = ("length" if seq.state.get("capped") else "stop") if done else None
            if not done and tracker.frames == 0 and tracker.step >= MAX_TEXT_STEPS:
                # Our watchdog (the release has none but max_new_tokens): a model that
                # writes text instead of entering audio is stopped, not run to the cap.
                done, reason = True, "length"
            output = StepOutput(
                text, _frames(new, self.config.n_vq), _frames(context, self.config.n_vq), reason
            )
            results.append(StepResult(output=output, finished=done))
        return results

    # -- sampling ---------------------------------------------------------------

    def _sample_text(self, sequences: list[Sequence], hidden: torch.Tensor) -> list[int]:
        """The text token of each row: forced in the drain, else sampled under the release's masks.

        Inside audio only the gen slot and the delay slot are allowed, so
        only those two rows of the text head are scored (the same choice as
        masking the full vocabulary, at a fraction of the cost).
        """
        cfg = self.config
        texts: list[int | None] = []
        narrow, wide = [], []
        for i, seq in enumerate(sequences):
            rule = seq.state["tracker"].text_rule()
            texts.append(rule.forced)
            if rule.forced is None:
                (narrow if rule.allowed is not None else wide).append((i, rule))
        pair = (cfg.audio_assistant_gen_slot_token_id, cfg.audio_assistant_delay_slot_token_id)
        for group, ids in ((narrow, pair), (wide, None)):
            if not group:
                continue
            rows = [i for i, _ in group]
            at = to_device(torch.tensor(rows), self.device)
            if ids is not None:
                columns = self._pair_columns(pair)
                logits = self.network.text_logits(hidden[at], columns).float()
                # the two columns each row may not take, as one mask (one copy, one kernel)
                shut = [[token not in rule.allowed for token in ids] for _, rule in group]
                logits = logits.masked_fill(to_device(torch.tensor(shut), self.device), -math.inf)
            else:
                logits = self.network.text_logits(hidden[at], None).float()
                pairs = [(j, t) for j, (_, rule) in enumerate(group) for t in rule.banned]
                if pairs:
                    where = to_device(torch.tensor(pairs).T.contiguous(), self.device)
                    logits[where[0], where[1]] = -math.inf
            params = [_text_params(sequences[i].state["text"]) for i in rows]
            picked = sample(logits, params, [sequences[i].generator for i in rows]).tolist()
            for (i, _), choice in zip(group, picked, strict=True):
                texts[i] = pair[choice] if ids is not None else choice
        return [int(t) for t in texts]  # type: ignore[arg-type]

    def _pair_columns(self, pair: tuple[int, int]) -> torch.Tensor:
        """The gen and delay slots' rows of the text head, as an index on the device (once)."""
        cached = getattr(self, "_pair_index", None)
        if cached is None or cached.device != self.device:
            cached = self._pair_index = torch.tensor(pair, device=self.device)
        return cached

    def _sample_audio(self, sequences: list[Sequence], hidden: torch.Tensor) -> list[list[int]]:
        """The codebook row of each sequence: due codebooks sampled, the rest the pad code.

        Differences from the release, deliberate: the repetition penalty (off
        by default, 1.0) uses each codebook's own history; the release, for
        codebooks 1..31, penalises the union of all codebooks' and all batch
        rows' histories, which would make a request's output depend on its
        batch neighbours.
        """
        cfg = self.config
        rows = [[cfg.audio_pad_code] * cfg.n_vq for _ in sequences]
        picks = [
            (i, k) for i, seq in enumerate(sequences) for k in seq.state["tracker"].sampled_books()
        ]
        if not picks:
            return rows
        needed = sorted({i for i, _ in picks})
        books = range(min(k for _, k in picks), max(k for _, k in picks) + 1)
        at = to_device(torch.tensor(needed), self.device)
        logits = self.network.audio_logits(hidden[at], books).float()  # [R, len, 1025]
        where = {i: r for r, i in enumerate(needed)}
        index = [[where[i] for i, _ in picks], [k - books.start for _, k in picks]]
        index_t = to_device(torch.tensor(index), self.device)
        flat = logits[index_t[0], index_t[1]]
        params = [sequences[i].sampling for i, _ in picks]
        previous = None
        if any(p.repetition_penalty != 1.0 for p in params):
            previous = [self._history(sequences[i], k) for i, k in picks]
        codes = sample(flat, params, [sequences[i].generator for i, _ in picks], previous).tolist()
        for (i, k), code in zip(picks, codes, strict=True):
            rows[i][k] = int(code)
        return rows

    def _history(self, seq: Sequence, book: int) -> torch.Tensor:
        past = seq.state["prompt_ids"][:, book + 1]
        if seq.state["rows"]:
            past = torch.cat([past, torch.stack(seq.state["rows"])[:, book + 1]])
        return past[past != self.config.audio_pad_code]

    # -- conveniences: one request without the engine, tests and reference runs ---

    def request(
        self,
        prompt: MossPrompt,
        *,
        text_temperature: float | None = None,
        text_top_k: int | None = None,
        text_top_p: float | None = None,
    ) -> RequestPrompt:
        g = self.generation
        return RequestPrompt(
            prompt,
            TextSampling(
                g.text_temperature if text_temperature is None else text_temperature,
                g.text_top_k if text_top_k is None else text_top_k,
                g.text_top_p if text_top_p is None else text_top_p,
            ),
        )

    def audio_sampling(self, **overrides: Any) -> SamplingParams:
        g = self.generation
        values = dict(
            temperature=g.audio_temperature,
            top_k=g.audio_top_k,
            top_p=g.audio_top_p,
            repetition_penalty=g.audio_repetition_penalty,
        )
        values.update({k: v for k, v in overrides.items() if v is not None})
        return SamplingParams(**values)

    @torch.no_grad()
    def generate(
        self,
        prompt: MossPrompt,
        *,
        max_steps: int = 256,
        greedy: bool = True,
        seed: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One request without the engine: (generated rows ``[N, 33]``, new frames ``[T, Q]``)."""
        from omni_core.engine.kv_cache import SlotKVCache

        request = self.request(prompt, text_temperature=0.0 if greedy else None)
        sampling = self.audio_sampling(temperature=0.0 if greedy else None, seed=seed)
        seq = Sequence("generate", request, sampling)
        cache = SlotKVCache(self.cache_layout(), 1, len(prompt) + max_steps + 1)
        seq.slot = cache.allocate()
        frames = []
        result = self.prefill([seq], cache)[0]
        for _ in range(max_steps):
            frames.append(result.output.frames)
            if result.finished or len(seq.state["rows"]) >= max_steps:
                break
            result = self.decode([seq], cache)[0]
        return torch.stack(seq.state["rows"]), torch.cat(frames)

    @torch.no_grad()
    def encode_reference(self, wav: torch.Tensor) -> torch.Tensor:
        """A prepared 24 kHz reference clip -> its codes ``[T, Q]`` (the codec's encoder)."""
        if self.codec is None:
            raise RuntimeError("this model was loaded without its codec")
        return self.codec.encode(wav.to(self.device)).cpu()


def _request(prompt: Any) -> RequestPrompt:
    if isinstance(prompt, RequestPrompt):
        return prompt
    if isinstance(prompt, MossPrompt):
        return RequestPrompt(prompt)
    raise TypeError(f"a MOSS-TTS prompt must be a RequestPrompt, got {type(prompt).__name__}")


def _text_params(text: TextSampling) -> SamplingParams:
    return SamplingParams(temperature=text.temperature, top_k=text.top_k, top_p=text.top_p)


def _frames(rows: list[list[int]], books: int) -> torch.Tensor:
    if not rows:
        return torch.zeros(0, books, dtype=torch.long)
    return torch.tensor(rows, dtype=torch.long)


def _audio_rows(cfg: MossTTSConfig, ids: torch.Tensor) -> int:
    """Index of the first row after a continuation prompt's last ``audio_start`` (else the end)."""
    text = ids[:, 0]
    starts = (text == cfg.audio_start_token_id).nonzero()
    last = int(text[-1]) if len(text) else -1
    if len(starts) and last in (cfg.audio_start_token_id, cfg.audio_assistant_gen_slot_token_id):
        return int(starts[-1]) + 1
    return len(text)
