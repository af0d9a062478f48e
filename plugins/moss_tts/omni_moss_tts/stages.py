"""Stage factories of the MOSS-TTS pipeline: preprocessing, tts_engine, vocoder.

Built in the child process that runs them (the parent never imports this
module), so torch is imported freely.

* preprocessing: checks the speech request (400 on bad input, naming the
  field), decodes a reference clip under the media limits, fixes sampling;
* tts_engine: encodes a reference clip with the codec, builds the prompt and
  generates through the engine backend (continuous batching), streaming each
  frame as soon as its 32nd codebook exists (already un-delayed);
* vocoder: decodes frames statefully with the codec (every frame once, the
  stream equal to a full decode) and streams 24 kHz audio.

Stages in one process share one network and one codec (loaders memoised per
process and arguments).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from omni_core import RequestError
from omni_core.engine.backends import create_engine
from omni_core.engine.compute import run_compute
from omni_core.engine.cpu_row_copy import apply_row_copies
from omni_core.engine.interface import SamplingParams, check_sampling
from omni_core.engine.quantize import apply_quantization
from omni_core.kit.stages import (
    SPEECH_REQUEST_KEYS,
    EngineContext,
    TTSPreprocessing,
    engine_factory,
    torch_device,
    tp_group,
)
from omni_core.kit.stages import number as _number
from omni_core.kit.stages import text as _text
from omni_core.media import AudioLimits, decode_base64_audio
from omni_qwen3_tts.stages import Vocoder
from omni_qwen3_tts.tokenizer import TextTokenizer

from .codec import AudioTokenizer, prepare_reference
from .codec_footprint import CAPTURED_ROWS
from .loading import codec_dtype, load_codec, model_root, read_config
from .model import MAX_TEXT_STEPS, MossTTSModel, RequestPrompt, TextSampling
from .pipeline import DEFAULT_VOICE
from .prompt import PromptBuilder, PromptError

SAMPLE_RATE = 24000
MIN_REF_AUDIO_SECONDS = 0.5  # under ~6 frames the codec has too little of the voice
SILENCE_DBFS = -60.0  # a reference quieter than this has no voice to clone
# the kit's speech fields (OpenAI's, the server's voices, audio sampling) and MOSS-TTS's:
# its message fields, voice cloning and the text channel's sampling
REQUEST_KEYS = SPEECH_REQUEST_KEYS | {
    *("language", "tokens", "ref_audio", "ref_text"),
    *("text_temperature", "text_top_k", "text_top_p"),
}


@functools.lru_cache(maxsize=4)
def shared_codec(
    model_path: str,
    codec_path: str | None,
    load_format: str,
    device: str,
    seed: int,
    dtype: torch.dtype = torch.float32,
) -> AudioTokenizer:
    """One codec per process and settings: the engine encodes references, the vocoder decodes.

    The engine's is always float32 (reference codes must be the release's); the
    vocoder's is the same object unless its ``factory.dtype`` asks for bfloat16.
    """
    return load_codec(model_path, codec_path, load_format, torch.device(device), seed, dtype)


@functools.lru_cache(maxsize=4)
def load_model(
    model_path: str,
    load_format: str,
    dtype: str | None,
    device: str,
    seed: int,
    codec_path: str | None,
) -> MossTTSModel:
    # float32 given explicitly: lru_cache keys on the arguments as passed
    codec = shared_codec(model_path, codec_path, load_format, device, seed, torch.float32)
    return MossTTSModel.from_pretrained(
        model_path, load_format=load_format, dtype=dtype, device=device, seed=seed, codec=codec
    )


# -- preprocessing ---------------------------------------------------------------


class Preprocessing(TTSPreprocessing):
    pipeline = "moss-tts"
    request_keys = REQUEST_KEYS

    def load(self, model_path: str) -> tuple[Any, int]:
        root = model_root(model_path, "dummy")
        self.config, self.defaults = read_config(root)
        self.prompts = PromptBuilder(self.config, TextTokenizer.from_dir(root))
        return self.prompts.tokenizer.encode, self.defaults.max_new_tokens

    def prepare(self, data: dict[str, Any]) -> dict[str, Any]:
        try:
            if data.get("voice_enroll"):
                if not data.get("ref_audio"):
                    raise PromptError("a voice upload needs its audio")
                return {"enroll": self._reference_audio(data["ref_audio"])}
            return self._checked(data)
        except PromptError as exc:
            raise RequestError(str(exc)) from None

    def _checked(self, data: dict[str, Any]) -> dict[str, Any]:
        if data.get("speed", 1.0) not in (1, 1.0, None):
            raise PromptError(
                "moss-tts does not change speed; omit 'speed' (or send 1.0) and use 'tokens' "
                "(the expected length in frames, 12.5 per second) to control duration"
            )
        voice = data.get("voice")
        if voice not in (None, "", DEFAULT_VOICE):
            raise PromptError(
                f"unknown voice {voice!r}: MOSS-TTS ships no named voices; voices: "
                f"{DEFAULT_VOICE!r} (the model's own), or clone one with 'ref_audio'; "
                "map other names to it with server.voice_aliases, or set "
                "server.openai_compat = true for OpenAI's voice names"
            )
        text = _text(data, "input") or ""
        if not text.strip():
            raise PromptError("'input' is empty: there is nothing to speak")
        message = {
            "text": text,
            "language": _text(data, "language"),
            "instruction": _text(data, "instructions"),
            "reference_text": _text(data, "ref_text"),
            "tokens": None,
        }
        if data.get("tokens") is not None:
            tokens = _number(data, "tokens", None, int)
            if not 1 <= tokens <= self.max_frames:
                raise PromptError(f"'tokens' must be in 1..{self.max_frames} frames, got {tokens}")
            message["tokens"] = tokens
        for key, field in (
            ("input", "text"),
            ("language", "language"),
            ("instructions", "instruction"),
        ):
            if message[field] is not None:
                self.prompts.check_text(key, message[field])  # type: ignore[arg-type]
        clip = stored = None
        if data.get("voice_prompt") is not None:
            stored = data["voice_prompt"]  # a stored voice: its codes were computed at upload
            if not isinstance(stored, dict) or "codes" not in stored:
                raise PromptError("'voice_prompt' is not a MOSS-TTS voice (no codes)")
        elif data.get("ref_audio"):
            clip = self._reference_audio(data["ref_audio"])
        elif message["reference_text"]:
            raise PromptError("'ref_text' is the transcript of 'ref_audio', which is missing")
        if message["reference_text"] is not None:
            self.prompts.check_text("ref_text", message["reference_text"])  # type: ignore[arg-type]
        return {
            "message": message,
            "ref_audio": clip,
            "voice_prompt": stored,
            **self._sampling(data),
        }

    def _reference_audio(self, encoded: Any) -> np.ndarray:
        """The clip as mono float32 24 kHz, loudness-normalised as the release's processor does."""
        clip = decode_base64_audio(
            encoded,
            "ref_audio",
            AudioLimits(max_seconds=self.max_ref_audio_seconds, min_seconds=MIN_REF_AUDIO_SECONDS),
        )
        samples = clip.samples.mean(axis=1)
        rms = float(np.sqrt(np.mean(np.square(samples, dtype=np.float64)) + 1e-20))
        if 20 * np.log10(rms) < SILENCE_DBFS:
            raise PromptError(
                f"'ref_audio' is silent ({20 * np.log10(rms):.0f} dBFS): record the voice to clone"
            )
        return prepare_reference(samples, clip.rate).numpy()

    def _sampling(self, data: dict[str, Any]) -> dict[str, Any]:
        d = self.defaults
        max_frames = _number(data, "max_frames", self.max_frames, int)
        if not 1 <= max_frames <= self.max_frames:
            raise PromptError(f"'max_frames' must be in 1..{self.max_frames}, got {max_frames}")
        audio = SamplingParams(
            temperature=_number(data, "temperature", d.audio_temperature, float),
            top_k=_number(data, "top_k", d.audio_top_k, int),
            top_p=_number(data, "top_p", d.audio_top_p, float),
            repetition_penalty=_number(
                data, "repetition_penalty", d.audio_repetition_penalty, float
            ),
            seed=_number(data, "seed", None, int),
            max_new_tokens=max_frames + self.config.n_vq + MAX_TEXT_STEPS + 1,
        )
        text = TextSampling(
            temperature=_number(data, "text_temperature", d.text_temperature, float),
            top_k=_number(data, "text_top_k", d.text_top_k, int),
            top_p=_number(data, "text_top_p", d.text_top_p, float),
        )
        for params in (audio, SamplingParams(text.temperature, text.top_k, text.top_p)):
            check_sampling(params)
        return {"sampling": audio, "text_sampling": text, "max_frames": max_frames}


create_preprocessing = Preprocessing  # the kit's TTSPreprocessing is its own factory


# -- tts_engine -------------------------------------------------------------------


class TTSEngine:
    def __init__(self, model: MossTTSModel, engine: Any, mirror: Any = None):
        # mirror: rank 0 of a tensor-parallel backbone (omni_core.engine.tp.Mirror)
        self.model, self.engine, self.mirror = model, engine, mirror

    async def run(self, request: Any) -> dict[str, Any]:
        data = request.data
        if data.get("enroll") is not None:  # a voice upload: its codes, computed once
            codes = await run_compute(self.model.encode_reference, torch.from_numpy(data["enroll"]))
            await request.emit({"voice_prompt": {"codes": codes.numpy()}})
            return {"frames": 0}
        prompt = await run_compute(self._prompt, data)
        submitted = RequestPrompt(prompt, data["text_sampling"])
        frames, finish = 0, None
        async with self.engine.enqueue(request.request_id, submitted, data["sampling"]) as stream:
            async for step in stream:
                if step.context.shape[0]:
                    # A continuation's reference frames: the codec's context, never played.
                    await request.emit({"reference": step.context})
                for frame in step.frames:
                    await request.emit(frame)
                    frames += 1
                finish = step.finish_reason or finish
        reason = finish or stream.finish_reason
        # The vocoder's final output carries both to the API (see omni_qwen3_tts's).
        usage = {"prompt_tokens": self.model.prompt_length(submitted), "completion_tokens": frames}
        await request.emit({"finish_reason": reason, "usage": usage})
        return {"frames": frames, "finish_reason": reason, "usage": usage}

    def _prompt(self, data: dict[str, Any]) -> Any:
        message = dict(data["message"])
        reference = continuation = codes = None
        if data.get("voice_prompt") is not None:
            codes = torch.as_tensor(data["voice_prompt"]["codes"]).long()
        elif data.get("ref_audio") is not None:
            codes = self.model.encode_reference(torch.from_numpy(data["ref_audio"]))
        if codes is not None:
            reference = codes
            if message.get("reference_text"):
                continuation = codes  # the release's continuation cloning (prefix audio)
        assert self.model.prompts is not None
        try:
            return self.model.prompts.build(
                message.pop("text"),
                max_frames=data["max_frames"],
                reference=reference,
                continuation=continuation,
                **message,
            )
        except PromptError as exc:
            raise RequestError(str(exc)) from None

    async def aclose(self) -> None:
        await self.engine.aclose()
        if self.mirror is not None:  # after the engine's last step: release the other ranks
            self.mirror.close()


@engine_factory("tts_engine")
def create_tts_engine(
    engine: EngineContext,
    codec_path: str | None = None,
    pack_weights: bool = True,
    tp_rank: int = 0,
    tp_size: int = 1,
    quantization: str = "none",
    fp16_row_weights: bool = False,
) -> Any:
    if quantization != "none" and tp_size > 1:
        raise ValueError(
            f"stage 'tts_engine': factory.quantization = {quantization!r} with tp_size {tp_size}: "
            "not implemented yet (int8 layers are not sharded); use one of them"
        )
    if fp16_row_weights and tp_size > 1:
        raise ValueError(
            f"stage 'tts_engine': factory.fp16_row_weights = true with tp_size {tp_size}: "
            "not implemented yet (the ranks' shards hold no copies); use one of them"
        )
    group = tp_group("tts_engine", tp_rank, tp_size)
    if group is not None and not group.leader:
        return _backbone_follower(engine, group, pack_weights)
    model = load_model(*engine.load_args, codec_path)
    mirror = None
    if group is not None:
        from omni_core.engine.tp import Mirror

        from .tensor_parallel import mirror_backbone, shard_backbone

        shard_backbone(model.network, model.config, group)
        mirror = Mirror(group)
        mirror_backbone(model.network.language_model, mirror)
        model.tp_size = group.size
    if pack_weights and engine.device == "cpu":
        from omni_core.engine.cpu_linear import pack_linear_weights

        # the backbone's layers only: the heads are read as raw weights (model.network),
        # blocked for oneDNN where this machine's routes say so
        pack_linear_weights(model.network.language_model)
        model.network.block_audio_heads()
    # int8 weight-only backbone layers (bf16 models only; the heads stay as they are)
    apply_quantization(model.network.language_model, quantization, stage="tts_engine")
    apply_row_copies(model.network.language_model, fp16_row_weights, stage="tts_engine")
    backend = create_engine(model, engine.settings, device=engine.device)
    if mirror is not None:
        mirror.setup(backend.plan.num_slots, backend.plan.slot_len)
    return TTSEngine(model, backend, mirror)


def _backbone_follower(engine: EngineContext, group: Any, pack_weights: bool) -> Any:
    """Ranks 1..N-1: the backbone's shard, run on what rank 0 mirrors (no codec, no heads)."""
    from omni_core.engine.tp import FollowerStage

    from .tensor_parallel import follower_forward, shard_backbone

    model = MossTTSModel.from_pretrained(
        engine.model_path,
        load_format=engine.load_format,
        dtype=engine.dtype,
        device=engine.device,
        seed=engine.seed,
        with_codec=False,
    )
    shard_backbone(model.network, model.config, group)
    model.tp_size = group.size
    backbone = model.network.language_model
    if pack_weights and engine.device == "cpu":
        from omni_core.engine.cpu_linear import pack_linear_weights

        pack_linear_weights(backbone)
    return FollowerStage(
        group, model.cache_layout(), follower_forward(backbone), stage="tts_engine"
    )


# -- vocoder ----------------------------------------------------------------------


def create_vocoder(
    model_path: str,
    gpu_id: int | None = None,
    load_format: str = "auto",
    seed: int = 0,
    codec_path: str | None = None,
    chunk_frames: int = 2,
    max_chunk_frames: int | None = 48,
    max_batch_size: int | None = None,
    dtype: str | None = None,
    pack_weights: bool = True,
    disable_cuda_graph: bool = False,
    cuda_graph_max_bs: int = CAPTURED_ROWS,
) -> Vocoder:
    """Stateful streaming decode with the MOSS codec, through Qwen3-TTS's streaming vocoder.

    ``dtype``: auto keeps the codec float32, as the release does (``loading.codec_dtype``).
    ``pack_weights`` (CPU only): the decoder's large linear layers routed by row
    count, as the engines' are (``omni_core.engine.cpu_linear``). On a GPU the
    streamed chunks are captured as CUDA graphs (``codec/graphs.py``) unless
    ``disable_cuda_graph``, in row buckets up to ``cuda_graph_max_bs`` (their shared
    windows are that many rows tall); the stage's log says what was captured, or why not.
    """
    device = torch_device(gpu_id, "vocoder")
    resolved = codec_dtype(dtype, torch.device(device))
    codec = shared_codec(model_path, codec_path, load_format, device, seed, resolved)
    if pack_weights and device == "cpu":
        from omni_core.engine.cpu_linear import pack_linear_weights

        # Chunks after the first are 8 to 48 frames, i.e. 8 to 48 rows at the decoder's
        # first transformer and up to 8x more at its last: MKL's float32 kernel runs such
        # row counts at half its one-row speed and oneDNN's does not (measured here on the
        # release's decoder, 2 threads, chunks 2/8/32/8: 36.2 -> 29.8 ms per streamed
        # frame; one pass 19.0 -> 17.2). Every layer, the small ones too (min_elements 0):
        # the size floor is for a decode step's one row, where a small weight sits in cache
        # and MKL is as fast; at a chunk's rows oneDNN ran the 768x768, 640->768 and
        # 768->240 layers 1.8-2.2x faster from 64 rows on (2-core AMD EPYC, float32), and a
        # batch of 8 streams x 32 frames went from 9.98 to 9.53 ms per frame (alternated,
        # 4 runs each; the audio 1e-6 apart, float rounding). In place and idempotent: the
        # engine shares this codec but only encodes, which packing leaves as it was.
        pack_linear_weights(codec.decoder, min_elements=0)
    # The codec is transformers all the way: a chunk's decode is bound by reading
    # its ~3.5 GB of decoder weights, so concurrent requests' chunks are stacked
    # on the CPU too (Qwen3-TTS's convolutional codec is the opposite case).
    max_batch_size = max_batch_size or 16
    # For the same reason every call costs a read of those weights, however few frames it
    # decodes: chunks after the first grow fourfold (2, 8, 32, 48 frames), not twofold,
    # so a request makes fewer calls (bench_moss_tts.py prints the codec's ms per frame).
    # A batch is one call however large (chunk_memory None): more calls would each read
    # the weights again, and what a batch allocates is mostly its streams' next states,
    # which the planner counts (codec_footprint.py).
    vocoder = Vocoder(
        codec,
        chunk_frames,
        None,
        max_batch_size,
        max_chunk_frames,
        SAMPLE_RATE,
        chunk_growth=4,
        cuda_graph=not disable_cuda_graph,
        chunk_memory=None,
        graph_max_rows=cuda_graph_max_bs,
    )
    if vocoder.graph_note:  # the stage log's start-up lines, as the engine prints its own
        print(f"vocoder: {vocoder.graph_note}", flush=True)
    return vocoder
