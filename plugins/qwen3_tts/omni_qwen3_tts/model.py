"""``Qwen3TTSModel``: loading, prompt embedding, and the engine's step functions.

One engine step is one frame. A step runs the talker for a batch of
sequences (the prompt for newly joined ones, one position for running ones)
over the engine's slot KV cache, picks codebook 0 with the release's rules
(control ids suppressed except EOS, EOS banned for the first two frames,
repetition penalty), then runs the code predictor for codebooks 1..15 with
its own per-frame cache, batched across the sequences. The step's output for
a sequence is its frame: an int64 tensor ``[16]`` (``None`` for the EOS
step, which carries no audio).

Per-sequence state (``Sequence.state``): ``trailing`` (text embeddings still
to feed, one per frame), ``last_hidden``, ``last_codes``, ``history``
(codebook-0 ids for the repetition penalty) and ``frames``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import nn

from omni_core.engine.sampling import from_host, make_generator, to_device
from omni_core.kit.weights import fill_shared

from .config import GenerationDefaults, Qwen3TTSConfig, SpeechTokenizerConfig
from .prompt import PromptBuilder, TTSPrompt
from .sampling import RowSampling, select_tokens
from .speaker_encoder import SpeakerEncoder
from .speech_tokenizer import SpeechTokenizer
from .talker import Talker, complete_frames, forward_rows
from .tokenizer import TextTokenizer
from .weights import (
    LOAD_FORMATS,
    build_empty,
    dummy_fill,
    parse_dtype,
    read_json,
    resolve_model_path,
)


class Qwen3TTSNetwork(nn.Module):
    """The root checkpoint's module tree: ``talker.*`` and (Base only) ``speaker_encoder.*``."""

    def __init__(self, cfg: Qwen3TTSConfig):
        super().__init__()
        self.talker = Talker(cfg.talker)
        self.speaker_encoder = (
            SpeakerEncoder(cfg.speaker_encoder) if cfg.has_speaker_encoder else None
        )


def _as_prompt(prompt: Any) -> TTSPrompt:
    if isinstance(prompt, TTSPrompt):
        return prompt
    if isinstance(prompt, dict):
        return TTSPrompt(**prompt)
    raise TypeError(
        f"a Qwen3-TTS prompt must be a TTSPrompt or a dict, got {type(prompt).__name__}"
    )


def build_speech_tokenizer(
    root: Path,
    load_format: str,
    dtype: str | torch.dtype | None,
    device: torch.device,
    seed: int,
) -> SpeechTokenizer:
    """The 12 Hz speech tokenizer under ``root/speech_tokenizer``.

    Its weights are released in float32 and ``auto`` keeps them so (bf16 audio
    is audibly worse; the codec is small next to the talker).
    """
    st_dir = root / "speech_tokenizer"
    raw = read_json(st_dir / "config.json")
    st_cfg = SpeechTokenizerConfig.from_dict(raw)
    st_dtype = parse_dtype(dtype, device, config=raw, release="float32")
    speech = build_empty(lambda: SpeechTokenizer(st_cfg), device, st_dtype)
    key = f"qwen3-tts:{root}:{load_format}:{st_dtype}:{seed}:speech_tokenizer"
    return fill_shared(key, speech, load_format, st_dir, lambda m: dummy_fill(m, seed + 1))


class Qwen3TTSModel:
    """The whole model: network, speech tokenizer, text tokenizer, prompt builder, step API."""

    def __init__(
        self,
        config: Qwen3TTSConfig,
        generation: GenerationDefaults,
        network: Qwen3TTSNetwork,
        speech_tokenizer: SpeechTokenizer | None,
        tokenizer: TextTokenizer | None,
        path: Path | None = None,
    ):
        self.config = config
        self.generation = generation
        self.network = network
        self.talker = network.talker
        self.speech_tokenizer = speech_tokenizer
        self.tokenizer = tokenizer
        self.prompts = PromptBuilder(config, tokenizer) if tokenizer is not None else None
        self.path = path
        param = next(network.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.num_code_groups = config.talker.num_code_groups

    # -- loading ------------------------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls,
        path_or_preset: str | Path = "tiny",
        load_format: str = "auto",
        dtype: str | torch.dtype | None = None,
        device: str | torch.device = "cpu",
        seed: int = 0,
        load_speech_tokenizer: bool = True,
        allow_download: bool = True,
        speech_dtype: str | torch.dtype | None = None,
    ) -> Qwen3TTSModel:
        """Load from a preset name, a local checkpoint directory or a hub id.

        ``load_format``: ``auto``/``safetensors`` read the checkpoint's weights
        (strictly: every tensor must match); ``dummy`` builds seeded random
        weights from the configs alone (presets ship configs only). ``dtype``
        and ``speech_dtype`` (the speech tokenizer's): ``auto``/None picks the
        checkpoint's where this device is fast (``omni_core.engine.precision``).
        """
        if load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format {load_format!r} is not one of {', '.join(LOAD_FORMATS)}")
        resolved = resolve_model_path(str(path_or_preset), allow_download=allow_download)
        root = resolved.path
        if resolved.preset is not None and load_format != "dummy":
            raise ValueError(
                f"preset {resolved.preset!r} ships configs and tokenizer files only, no weights; "
                "load it with load_format='dummy'"
            )
        dev = torch.device(device)
        raw_config = read_json(root / "config.json")
        torch_dtype = parse_dtype(dtype, dev, config=raw_config)
        config = Qwen3TTSConfig.from_dict(raw_config)
        generation = GenerationDefaults.from_dict(
            read_json(root / "generation_config.json", required=False)
        )
        network = build_empty(lambda: Qwen3TTSNetwork(config), dev, torch_dtype)
        # Filled here, or mapped from a weight-sharing leader (omni_core's seam).
        key = f"qwen3-tts:{root}:{load_format}:{torch_dtype}:{seed}"
        fill_shared(f"{key}:network", network, load_format, root, lambda m: dummy_fill(m, seed))
        speech = None
        if load_speech_tokenizer:
            speech = build_speech_tokenizer(root, load_format, speech_dtype, dev, seed)
        tokenizer = None
        if (root / "vocab.json").is_file() or (root / "tokenizer.json").is_file():
            tokenizer = TextTokenizer.from_dir(root)
        return cls(config, generation, network, speech, tokenizer, root)

    # -- prompt -> embeddings -----------------------------------------------------------

    def _ids(self, values: list[int]) -> torch.Tensor:
        # from_host: a plain torch.tensor(list, device="cuda") waits for the whole queue
        return from_host(values, self.device)

    @torch.no_grad()
    def embed_prompt(self, prompt: TTSPrompt | dict) -> tuple[torch.Tensor, torch.Tensor]:
        """The talker's prefill embeddings ``[L, H]`` and the trailing text ``[N, H]``.

        Follows the release: optional instruction, the role tokens, the codec
        prefix (think / language / speaker / pad / bos) summed with tts_pad /
        tts_bos text embeddings, then either the in-context voice-clone block
        (reference transcript + text over the reference codes) or the first
        text token (streaming text) / the whole text (non-streaming).
        """
        p = _as_prompt(prompt)
        cfg, tc, talker = self.config, self.config.talker, self.talker
        bos, eos, pad = talker.embed_text(
            self._ids([cfg.tts_bos_token_id, cfg.tts_eos_token_id, cfg.tts_pad_token_id])
        )
        text = list(p.text_ids)
        parts: list[torch.Tensor] = []
        if p.instruct_ids:
            parts.append(talker.embed_text(self._ids(list(p.instruct_ids))))
        if p.language_id is None:
            prefix = [tc.codec_nothink_id, tc.codec_think_bos_id, tc.codec_think_eos_id]
        else:
            prefix = [
                tc.codec_think_id,
                tc.codec_think_bos_id,
                p.language_id,
                tc.codec_think_eos_id,
            ]
        codec = [talker.embed_codec(self._ids(prefix))]
        if p.speaker_id is not None:
            codec.append(talker.embed_codec(self._ids([p.speaker_id])))
        elif p.speaker_embedding is not None:
            spk = torch.as_tensor(p.speaker_embedding).to(self.device, self.dtype).reshape(1, -1)
            codec.append(spk)
        codec.append(talker.embed_codec(self._ids([tc.codec_pad_id, tc.codec_bos_id])))
        codec_seq = torch.cat(codec)
        parts.append(talker.embed_text(self._ids(text[:3])))
        text_side = torch.cat([pad.expand(codec_seq.shape[0] - 2, -1), bos[None]])
        parts.append(text_side + codec_seq[:-1])
        if p.icl:
            ref_codes = torch.as_tensor(p.ref_codes, device=self.device).long()
            text_embed = torch.cat(
                [talker.embed_text(self._ids(list(p.ref_text_ids)[3:-2] + text[3:-5])), eos[None]]
            )
            codec_embed = torch.cat(
                [talker.embed_codec(self._ids([tc.codec_bos_id])), talker.embed_frame(ref_codes)]
            )
            n_text, n_codec = text_embed.shape[0], codec_embed.shape[0]
            if p.non_streaming:
                pads = talker.embed_codec(self._ids([tc.codec_pad_id] * n_text))
                parts += [text_embed + pads, codec_embed + pad]
                trailing = pad[None]
            elif n_text > n_codec:
                parts.append(text_embed[:n_codec] + codec_embed)
                trailing = text_embed[n_codec:]
            else:
                filler = pad.expand(n_codec - n_text, -1)
                parts.append(torch.cat([text_embed, filler]) + codec_embed)
                trailing = pad[None]
        elif p.non_streaming:
            body = text[3:-5]
            pads = talker.embed_codec(self._ids([tc.codec_pad_id] * (len(body) + 1)))
            parts.append(torch.cat([talker.embed_text(self._ids(body)), eos[None]]) + pads)
            parts.append(pad[None] + talker.embed_codec(self._ids([tc.codec_bos_id])))
            trailing = pad[None]
        else:
            parts.append(talker.embed_text(self._ids(text[3:4])) + codec_seq[-1:])
            trailing = torch.cat([talker.embed_text(self._ids(text[4:-5])), eos[None]])
        return torch.cat(parts), trailing

    def prompt_length(self, prompt: Any) -> int:
        """Cache positions of the prefill, computed from ids alone (no embedding)."""
        p = _as_prompt(prompt)
        speaker = 1 if (p.speaker_id is not None or p.speaker_embedding is not None) else 0
        codec = (3 if p.language_id is None else 4) + speaker + 2
        length = len(p.instruct_ids or []) + 3 + codec - 1
        body = max(len(p.text_ids) - 8, 0)
        if p.icl:
            n_text = len(p.ref_text_ids or []) - 5 + body + 1
            n_codec = len(p.ref_codes) + 1
            length += n_text + n_codec if p.non_streaming else n_codec
        elif p.non_streaming:
            length += body + 2
        else:
            length += 1
        return length

    # -- engine step API ----------------------------------------------------------------

    def cache_layout(self):
        from omni_core.engine.interface import CacheLayout

        return CacheLayout.of(self.config.talker.transformer, self.dtype, self.device)

    def prepare_static(self, context: Any) -> None:
        """The static decode steps the engine compiles: the talker's, the code predictor's."""
        t = self.config.talker.transformer
        self._static_talker = context.decoder(
            "talker", self.talker.model, hidden=t.hidden_size, dtype=self.dtype
        )
        self.talker.code_predictor.prepare_static(
            context, self.dtype, self.device, self._predictor_sampling()
        )

    def _rows(self, sequences: list[Any]) -> tuple[list[RowSampling], list[RowSampling]]:
        usual = self._predictor_sampling()
        main, sub = [], []
        for seq in sequences:
            row = RowSampling.of(seq.sampling)
            main.append(row)
            override = seq.state.get("subtalker")
            if override is not None:
                sub.append(override)
            else:
                sub.append(dataclasses.replace(usual, greedy=True) if row.greedy else usual)
        return main, sub

    def _predictor_sampling(self) -> RowSampling:
        """How the code predictor picks for a sampled request: the release's subtalker settings."""
        gen = self.generation
        return RowSampling(
            greedy=not gen.subtalker_dosample,
            temperature=gen.subtalker_temperature,
            top_k=gen.subtalker_top_k,
            top_p=gen.subtalker_top_p,
        )

    def _generator(self, seq: Any) -> torch.Generator | None:
        """A seeded request's generator, on the model's device (no host copy to draw)."""
        if seq.generator is None and seq.sampling.seed is not None:
            seq.generator = make_generator(int(seq.sampling.seed), self.device)
        return seq.generator

    @torch.no_grad()
    def _talker_step(
        self, sequences: list[Any], embeds: list[torch.Tensor], cache: Any
    ) -> torch.Tensor:
        """Run the talker on each sequence's new embeddings; return each one's last hidden state."""
        static = getattr(self, "_static_talker", None)
        return forward_rows(
            self.talker.model, static, sequences, embeds, cache, self.dtype, self.device
        )

    @torch.no_grad()
    def _emit(self, sequences: list[Any], last_hidden: torch.Tensor) -> list[Any]:
        """Pick codebook 0 for every row, then codebooks 1..G-1 for the rows that continue."""
        from omni_core.engine.interface import StepResult

        tc = self.config.talker
        main_rows, sub_rows = self._rows(sequences)
        generators = [self._generator(seq) for seq in sequences]
        logits = self.talker.codec_head(last_hidden)
        suppressed, suppressed_and_eos = self._banned_ids()
        banned, histories = [], []
        for seq in sequences:
            frames = seq.state.setdefault("frames", 0)
            early = frames < self.generation.min_new_tokens
            banned.append(suppressed_and_eos if early else suppressed)
            history = seq.state.setdefault("history", [])
            histories.append(torch.tensor(history, dtype=torch.long) if history else None)
        code0 = select_tokens(logits, main_rows, generators, histories, banned)
        code0_ids, go, frames = complete_frames(
            self.talker, last_hidden, code0, tc.codec_eos_token_id, sub_rows, generators
        )
        # one copy to the CPU for the whole batch
        frames_cpu = None if frames is None else frames.to("cpu", torch.long)
        results = []
        position = {row: k for k, row in enumerate(go)}
        for i, seq in enumerate(sequences):
            if i not in position:
                seq.state["done"] = True
                results.append(StepResult(output=None, finished=True))
                continue
            assert frames_cpu is not None
            frame = frames_cpu[position[i]]
            seq.state["last_codes"] = frame
            seq.state["last_hidden"] = last_hidden[i]
            seq.state["history"].append(code0_ids[i])
            seq.state["frames"] += 1
            limit = seq.sampling.max_new_tokens
            finished = limit is not None and seq.state["frames"] >= limit
            results.append(StepResult(output=frame, finished=finished))
        return results

    def _banned_ids(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Codebook-0 ids banned always, and before ``min_new_tokens`` (those plus EOS).

        Constant for the model, so built once per device instead of every step
        (building the suppressed ids filters on the device, which syncs).
        """
        cached = getattr(self, "_banned", None)
        if cached is None or cached[0] != self.device:
            suppressed = self.talker.suppressed_ids(self.device)
            eos = torch.tensor([self.config.talker.codec_eos_token_id], device=self.device)
            cached = (self.device, suppressed, torch.cat([suppressed, eos]))
            self._banned = cached
        return cached[1], cached[2]

    @torch.no_grad()
    def prefill(self, sequences: list[Any], cache: Any) -> list[Any]:
        embeds = []
        for seq in sequences:
            prefill, trailing = self.embed_prompt(seq.prompt)
            seq.state["trailing"] = trailing
            seq.state["step"] = 0
            embeds.append(prefill)
        return self._emit(sequences, self._talker_step(sequences, embeds, cache))

    @torch.no_grad()
    def decode(self, sequences: list[Any], cache: Any) -> list[Any]:
        codes = to_device(torch.stack([seq.state["last_codes"] for seq in sequences]), self.device)
        frame_embeds = self.talker.embed_frame(codes)
        embeds = []
        for row, seq in enumerate(sequences):
            trailing = seq.state["trailing"]
            step = seq.state["step"]
            text = trailing[step] if step < trailing.shape[0] else self._tts_pad()
            seq.state["step"] = step + 1
            embeds.append((frame_embeds[row] + text)[None])
        return self._emit(sequences, self._talker_step(sequences, embeds, cache))

    def _tts_pad(self) -> torch.Tensor:
        cached = getattr(self, "_pad_embed", None)
        if cached is None:
            with torch.no_grad():
                cached = self.talker.embed_text(self._ids([self.config.tts_pad_token_id]))[0]
            self._pad_embed = cached
        return cached

    # -- conveniences for tests and reference comparison --------------------------------

    @torch.no_grad()
    def generate(
        self,
        prompt: TTSPrompt | dict,
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_k: int = 50,
        top_p: float = 1.0,
        repetition_penalty: float | None = None,
        seed: int | None = None,
    ) -> torch.Tensor:
        """One request, no engine: frames ``[T, 16]`` until EOS or ``max_new_tokens``.

        ``temperature=0`` is greedy for both talker and code predictor (the
        reference's ``do_sample=False, subtalker_dosample=False``).
        """
        from omni_core.engine.interface import SamplingParams, Sequence
        from omni_core.engine.kv_cache import SlotKVCache

        penalty = (
            self.generation.repetition_penalty if repetition_penalty is None else repetition_penalty
        )
        params = SamplingParams(
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            repetition_penalty=penalty,
            seed=seed,
            max_new_tokens=max_new_tokens,
        )
        seq = Sequence(request_id="generate", prompt=_as_prompt(prompt), sampling=params)
        cache = SlotKVCache(self.cache_layout(), 1, self.prompt_length(seq.prompt) + max_new_tokens)
        seq.slot = cache.allocate()
        frames = []
        result = self.prefill([seq], cache)[0]
        while True:
            if result.output is not None:
                frames.append(result.output)
            if result.finished:
                break
            result = self.decode([seq], cache)[0]
        if not frames:
            return torch.zeros(0, self.num_code_groups, dtype=torch.long)
        return torch.stack(frames)

    def decode_audio(
        self, codes: torch.Tensor, reference: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Frames ``[T, 16]`` -> float32 24 kHz waveform ``[T * 1920]``."""
        if self.speech_tokenizer is None:
            raise RuntimeError("this model was loaded without its speech tokenizer")
        return self.speech_tokenizer.decode(codes, reference)

    @torch.no_grad()
    def voice_clone_reference(self, wav: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A 24 kHz mono reference waveform -> (its codes ``[T, 16]``, its x-vector ``[H]``)."""
        if self.network.speaker_encoder is None:
            raise RuntimeError(
                f"voice cloning needs a Base checkpoint; this one is {self.config.tts_model_type!r}"
            )
        if self.speech_tokenizer is None:
            raise RuntimeError("voice cloning needs the speech tokenizer")
        codes = self.speech_tokenizer.encode(wav)
        xvector = self.network.speaker_encoder.embed(wav)
        return codes, xvector.to(self.dtype)
