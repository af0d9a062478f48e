"""Stage factories of the Qwen3-Omni pipelines.

Built in the child process that runs each stage (the parent never imports
this module): preprocessing (:mod:`.preprocessing`), the two encoders, the
aggregation, the thinker and the talker on the engine backend, incremental
detokenisation, and code2wav (the Qwen3-TTS vocoder stage over the shared
codec decoder).

Each encoder runs one request at a time (all of that request's images or
clips in one batched call) in a worker thread; the thinker and the talker are
where requests batch, continuously, on their engines. A request's sampling
defaults come from the checkpoint's ``generation_config.json`` (transformers'
``generate`` ignores that file for the thinker and decodes greedily).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio
import torch

from omni_core import RequestError
from omni_core.engine.backends import create_engine
from omni_core.engine.cpu_row_copy import apply_row_copies
from omni_core.engine.interface import SamplingParams
from omni_core.engine.quantize import apply_quantization
from omni_core.kit.batching import Coalescer
from omni_core.kit.stages import EngineContext, engine_factory, torch_device, tp_group
from omni_qwen3_tts.stages import vocoder_factory

from .assemble import assemble, to_prompt
from .detokenize import Detokenizer, StopMatcher
from .loading import load_part
from .preprocessing import create_preprocessing  # noqa: F401 - a factory_path target

# -- encoders ---------------------------------------------------------------------


class ImageEncoder:
    """Images (and videos' frames) to thinker rows; concurrent requests share one tower call."""

    def __init__(self, encoder: Any, device: str, max_batch_size: int = 8):
        self.encoder, self.device = encoder, torch.device(device)
        self.dtype = next(encoder.parameters()).dtype
        self.coalescer = Coalescer(self._encode_batch, max_batch_size)

    async def run(self, request: Any) -> dict[str, Any]:
        return await self.coalescer.submit(request.data["images"])

    def _encode(self, images: list[dict[str, Any]]) -> dict[str, Any]:
        """One request's images alone, in this thread (tests compare stages this way)."""
        return self._encode_batch([images])[0]

    def _encode_batch(self, requests: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
        images = [im for request in requests for im in request]
        pixels = torch.cat([im["pixel_values"] for im in images]).to(self.device, self.dtype)
        grids = torch.tensor([im["grid_thw"] for im in images], dtype=torch.long)
        with torch.inference_mode():
            embeds, deepstack = self.encoder(pixels, grids.to(self.device))
        per_image = (grids.prod(dim=1) // self.encoder.merge**2).tolist()
        rows = [sum(per_image[i] for i in span) for span in _spans(requests)]
        parts = zip(
            embeds.cpu().split(rows), *(d.cpu().split(rows) for d in deepstack), strict=True
        )
        return [{"embeds": own[0], "deepstack": list(own[1:])} for own in parts]


class AudioEncoder:
    """Clips to thinker rows; concurrent requests share one tower call."""

    def __init__(self, encoder: Any, device: str, max_batch_size: int = 8):
        self.encoder, self.device = encoder, torch.device(device)
        self.dtype = next(encoder.parameters()).dtype
        self.coalescer = Coalescer(self._encode_batch, max_batch_size)

    async def run(self, request: Any) -> dict[str, Any]:
        return await self.coalescer.submit(request.data["audios"])

    def _encode(self, clips: list[torch.Tensor]) -> dict[str, Any]:
        """One request's clips alone, in this thread (tests compare stages this way)."""
        return self._encode_batch([clips])[0]

    def _encode_batch(self, requests: list[list[torch.Tensor]]) -> list[dict[str, Any]]:
        clips = [c.to(self.device, self.dtype) for request in requests for c in request]
        with torch.inference_mode():
            out = [rows.cpu() for rows in self.encoder(clips)]
        return [{"embeds": torch.cat([out[i] for i in span])} for span in _spans(requests)]


def _spans(requests: list[list[Any]]) -> list[range]:
    """Which items of the flattened batch each request owns."""
    spans, start = [], 0
    for request in requests:
        spans.append(range(start, start + len(request)))
        start += len(request)
    return spans


def create_image_encoder(
    model_path: str,
    gpu_id: int | None = None,
    gpu_memory_fraction: float | None = None,
    dtype: str | None = None,
    load_format: str = "auto",
    seed: int = 0,
    max_batch_size: int = 8,
) -> ImageEncoder:
    device = torch_device(gpu_id, "image_encoder")
    module, _, _ = load_part(model_path, "image_encoder", load_format, dtype, device, seed)
    return ImageEncoder(module, device, max_batch_size)


def create_audio_encoder(
    model_path: str,
    gpu_id: int | None = None,
    gpu_memory_fraction: float | None = None,
    dtype: str | None = None,
    load_format: str = "auto",
    seed: int = 0,
    max_batch_size: int = 8,
) -> AudioEncoder:
    device = torch_device(gpu_id, "audio_encoder")
    module, _, _ = load_part(model_path, "audio_encoder", load_format, dtype, device, seed)
    return AudioEncoder(module, device, max_batch_size)


# -- aggregation and thinker ------------------------------------------------------


class Aggregate:
    """The text-only variant's fan-in: encoder rows placed at the prompt's placeholders."""

    def __init__(self, config: Any):
        self.config = config

    async def run(self, request: Any) -> dict[str, Any]:
        data = request.data
        return {
            "thinker_prompt": assemble(data, data.get("encoder_outputs") or {}, self.config),
            "sampling": data["sampling"],
            "stop": data.get("stop") or [],
        }


def create_mm_aggregate(model_path: str) -> Aggregate:
    from .loading import read_config
    from .source import resolve_model_path

    return Aggregate(read_config(resolve_model_path(model_path).path))


class Thinker:
    """Runs a prompt on the engine and streams each token id; then why it ended and usage.

    In the speech pipelines it also feeds the talker: for a request that
    asked for audio, the chunks carry what the talker reads of every
    position (its layer-0 row and the ``accept_hidden_layer`` row); a request
    for text only skips the talker and code2wav at once.
    """

    def __init__(self, engine: Any, model: Any, config: Any, speech: Speech | None = None):
        self.engine, self.model, self.config, self.speech = engine, model, config, speech

    async def run(self, request: Any) -> dict[str, Any]:
        data = request.data
        if "thinker_prompt" in data:
            wire = data["thinker_prompt"]
        else:  # the speech variant fans in here directly
            wire = assemble(data, data.get("encoder_outputs") or {}, self.config)
        prompt = to_prompt(wire)
        sampling = SamplingParams(**data["sampling"])
        speaks = self.speech is not None and "audio" in (data.get("modalities") or ["text"])
        header: dict[str, Any] = {
            "stop": list(data.get("stop") or []),
            "prompt_tokens": len(prompt),
        }
        if self.speech is not None and not speaks:
            await request.skip(self.speech.stage)
        if speaks:
            assert self.speech is not None
            header["talker"] = {
                "voice": data.get("voice"),
                "tts_rows": self.speech.tts_rows,
                "greedy": sampling.temperature == 0,
                "seed": sampling.seed,
            }
            self.model.capture(request.request_id, self.speech.accept_layer)
        # The decode stage's header: its stop strings, and the prompt's size for usage.
        await request.emit(header)
        tokens = 0
        try:
            async with self.engine.enqueue(request.request_id, prompt, sampling) as stream:
                async for out in stream:
                    if isinstance(out, dict):  # a spoken request: the talker's rows too
                        layer0, accept = out["rows"]
                        if tokens == 0:
                            rows = {"token_ids": prompt.token_ids, "positions": prompt.positions}
                            await request.emit({"prompt_rows": (layer0, accept), **rows})
                        else:  # the rows of the token before this one
                            await request.emit({"rows": (layer0, accept)})
                        out = out["token"]
                    await request.emit(out)
                    tokens += 1
        finally:
            self.model.release(request.request_id)
        usage = {"prompt_tokens": len(prompt), "completion_tokens": tokens}
        await request.emit({"finish_reason": stream.finish_reason, "usage": usage})
        return {"finish_reason": stream.finish_reason, "usage": usage}

    async def start(self) -> None:
        """Start the engine before the process says it is ready (SGLang takes 10-70 s)."""
        await self.engine.start()

    async def aclose(self) -> None:
        await self.engine.aclose()
        close = getattr(self.model, "close", None)
        if close is not None:  # the torch step model of a tensor-parallel rank 0
            close()


@dataclass(frozen=True)
class Speech:
    """What the thinker needs to feed a talker: its stage, accept layer, and tts rows."""

    stage: str
    accept_layer: int
    tts_rows: torch.Tensor  # [3, H]: layer-0 rows of tts_bos, tts_eos, tts_pad


@engine_factory("thinker")
def create_thinker(
    engine: EngineContext,
    gpu_ids: list[int] | None = None,
    tp_rank: int = 0,
    tp_size: int = 1,
    pack_weights: bool = True,
    talker_stage: str | None = None,
    quantization: str = "none",
    fp16_row_weights: bool = False,
) -> Thinker:
    from .chat import end_of_turn_ids
    from .loading import read_raw_config
    from .thinker.step import ThinkerStepModel

    settings, device = engine.settings, engine.device
    if quantization != "none" and (settings.backend == "sglang" or tp_size > 1):
        raise ValueError(
            f"stage 'thinker': factory.quantization = {quantization!r} runs on omni's own "
            "engine with tp_size 1 only: not implemented yet with SGLang or tensor parallelism"
        )
    if fp16_row_weights and (settings.backend == "sglang" or tp_size > 1):
        raise ValueError(
            "stage 'thinker': factory.fp16_row_weights = true runs on omni's own engine with "
            "tp_size 1 only: not implemented yet with SGLang or tensor parallelism"
        )
    if settings.backend == "sglang":  # tp_size: SGLang's own ranks, started by its engine
        return _sglang_thinker(engine, talker_stage, tp_size)
    lm, config, root = load_part(
        engine.model_path, "thinker", engine.load_format, engine.dtype, device, engine.seed
    )
    model_dtype = lm.model.embed_tokens.weight.dtype
    group = tp_group("thinker", tp_rank, tp_size)
    if group is not None:
        from .thinker.tensor_parallel import shard_thinker

        shard_thinker(lm, config.text, group)
        if not group.leader:
            return _thinker_follower(lm, config.text, group, device, model_dtype, pack_weights)
    speech = None
    if talker_stage is not None:
        from .talker.config import TalkerConfig

        talker = TalkerConfig.from_dict(read_raw_config(root))
        with torch.no_grad():
            ids = torch.tensor(talker.tts_special_ids, device=device)
            tts_rows = lm.embed(ids).float().cpu()
        speech = Speech(talker_stage, talker.accept_hidden_layer, tts_rows)
    if pack_weights and device == "cpu":
        from .thinker.cpu_weights import pack_decoder_weights

        pack_decoder_weights(lm)
    # int8 weight-only layers, experts included (bf16 models only; lm_head stays)
    apply_quantization(lm, quantization, stage="thinker")
    apply_row_copies(lm, fp16_row_weights, stage="thinker")
    eos = end_of_turn_ids(root)
    mirror = None
    if group is not None:
        from omni_core.engine.tp import Mirror

        mirror = Mirror(group)
    model = ThinkerStepModel(
        lm,
        config.text,
        eos_ids=set(eos),
        device=torch.device(device),
        dtype=model_dtype,
        mirror=mirror,
        tp_size=tp_size,
    )
    if speech is not None:  # spoken requests capture these rows: compile that step too
        model.expected_captures = (speech.accept_layer,)
    backend = create_engine(model, settings, device=device)
    if mirror is not None:
        mirror.setup(backend.plan.num_slots, backend.plan.slot_len)
    return Thinker(backend, model, config, speech)


def _thinker_follower(
    lm: Any, text: Any, group: Any, device: str, dtype: torch.dtype, pack_weights: bool
) -> Any:
    """Ranks 1..N-1: the decoder shard, run on what rank 0 mirrors (no engine, no head)."""
    from omni_core.engine.interface import CacheLayout
    from omni_core.engine.tp import FollowerStage

    from .thinker.tensor_parallel import follower_forward

    if pack_weights and device == "cpu":
        from .thinker.cpu_weights import pack_decoder_weights

        pack_decoder_weights(lm)
    layout = CacheLayout.of(text, dtype, torch.device(device), group.size)
    return FollowerStage(group, layout, follower_forward(lm), stage="thinker")


def _sglang_thinker(engine: EngineContext, talker_stage: str | None, tp_size: int = 1) -> Thinker:
    """The thinker on SGLang's engine (``engine.backend = "sglang"``; see sglang_adapter).

    With ``tp_size > 1`` this one process starts SGLang's engine with that
    ``tp_size``: SGLang spawns the scheduler ranks (on GPUs ``base_gpu_id``
    onwards), which is how the plan shows it (``engine_ranks``).

    For dummy weights omni's seeded decoder is built once, written out for SGLang
    and dropped; a real checkpoint is handed to SGLang as it is (only the talker's
    three embedding rows are read here).
    """
    from .chat import end_of_turn_ids
    from .loading import read_config, read_raw_config
    from .source import resolve_model_path
    from .thinker.sglang_adapter import ThinkerSGLangModel, embedding_rows, write_checkpoint

    root = resolve_model_path(engine.model_path).path
    config = read_config(root)
    ids: list[int] = []
    if talker_stage is not None:
        from .talker.config import TalkerConfig

        talker = TalkerConfig.from_dict(read_raw_config(root))
        ids = list(talker.tts_special_ids)
    if engine.load_format == "dummy":
        lm, _, _ = load_part(
            engine.model_path, "thinker", "dummy", engine.dtype, "cpu", engine.seed
        )
        checkpoint, owned = write_checkpoint(lm, root), True
        with torch.no_grad():
            rows = lm.embed(torch.tensor(ids)).float() if ids else None
        load_part.cache_clear()  # SGLang holds the weights now; omni's copy goes
    else:
        checkpoint, owned = root, False
        rows = embedding_rows(root, ids) if ids else None
    speech = None
    if talker_stage is not None:
        speech = Speech(talker_stage, talker.accept_hidden_layer, rows)
    eos = end_of_turn_ids(root)
    model = ThinkerSGLangModel(
        checkpoint,
        eos_ids=set(eos),
        hidden_size=config.text.hidden_size,
        seed=engine.seed,
        owned_directory=owned,
        dtype=engine.dtype,
        feeds_talker=talker_stage is not None,
        tp_size=tp_size,
    )
    backend = create_engine(model, engine.settings, device=engine.device)
    return Thinker(backend, model, config, speech)


# -- talker -----------------------------------------------------------------------


class TalkerStage:
    """Speaks what the thinker writes, as it writes it: frames of codes out, streamed.

    The thinker's chunks arrive in order: a header (voice, sampling, the tts
    rows), the prompt's rows with its first token, then each next token
    after the rows of the one before it. The request joins the engine as
    soon as the talker's prefill has what it needs (the first answer token);
    every later token's rows wake the engine, which decodes the sequences
    whose next text row has arrived, so the talker keeps pace with the
    thinker but never runs ahead of it.
    """

    def __init__(self, engine: Any, config: Any, max_frames: int):
        self.engine, self.config, self.max_frames = engine, config, max_frames

    async def run(self, request: Any) -> dict[str, Any]:
        from .talker.prompt import TalkerPrompt
        from .talker.step import TALKER_SAMPLING

        prompt: TalkerPrompt | None = None
        sampling: SamplingParams | None = None
        last_token: int | None = None
        frames, reason = 0, None
        send, receive = anyio.create_memory_object_stream[Any](0)

        async def speak() -> None:
            nonlocal frames
            async with self.engine.enqueue(request.request_id, prompt, sampling) as stream:
                async for frame in stream:
                    if frame is not None:
                        await request.emit(frame)
                        frames += 1
            await send.send(stream.finish_reason)

        async with anyio.create_task_group() as tg:
            started = False
            async for item in request.stream:
                if isinstance(item, int):
                    last_token = item
                elif "talker" in item:
                    spec = item["talker"]
                    prompt = TalkerPrompt(self.config, speaker=_voice(spec["voice"], self.config))
                    greedy = {"temperature": 0.0} if spec["greedy"] else {}
                    params = {**TALKER_SAMPLING, **greedy, "seed": spec["seed"]}
                    sampling = SamplingParams(**params, max_new_tokens=self.max_frames)
                    tts_rows = spec["tts_rows"]
                elif "prompt_rows" in item and prompt is not None:
                    layer0, accept = item["prompt_rows"]
                    prompt.add_prompt(
                        item["token_ids"],
                        layer0,
                        accept,
                        tts_embeddings=tts_rows,
                        positions=item.get("positions"),
                    )
                elif "rows" in item and prompt is not None and last_token is not None:
                    layer0, accept = item["rows"]
                    prompt.add_token(last_token, layer0[0], accept[0])
                elif "finish_reason" in item and prompt is not None:
                    prompt.finish()
                if prompt is None:
                    continue
                if not started and (prompt.prefill_ready or prompt.finished):
                    started = True
                    tg.start_soon(speak)
                self.engine.wake()
            if prompt is not None and not prompt.finished:
                prompt.finish()  # the thinker's stream ended without its trailer
                self.engine.wake()
            if started:
                reason = await receive.receive()
        await request.emit({"finish_reason": reason})
        return {"frames": frames, "finish_reason": reason}

    async def aclose(self) -> None:
        await self.engine.aclose()


def _voice(voice: Any, config: Any) -> Any:
    """The request's voice, or the checkpoint's first speaker (the release names them)."""
    if voice:
        return voice
    if not config.speaker_id:
        raise RequestError("this checkpoint names no speakers (talker_config.speaker_id)")
    return sorted(config.speaker_id)[0]


# -- decode -----------------------------------------------------------------------


class Decode:
    """Token ids in, text deltas out: incremental detokenisation and stop strings.

    A stop string ends the request's text (the stop string itself is not
    sent, as OpenAI does); returning early ends the request, and the
    runtime then aborts the thinker's generation.
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.special = tokenizer.special_ids()

    async def run(self, request: Any) -> dict[str, Any]:
        detok = Detokenizer(self.tokenizer.decode, skip=self.special)
        stop = StopMatcher([])
        prompt_tokens, tokens = 0, 0
        reason, usage = None, None
        async for item in request.stream:
            if isinstance(item, dict):  # the thinker's header (stop strings) or trailer
                if "stop" in item:
                    stop = StopMatcher(item["stop"])
                    prompt_tokens = int(item.get("prompt_tokens", 0))
                reason = item.get("finish_reason", reason)
                usage = item.get("usage", usage)
                continue
            tokens += 1
            text, hit = stop.feed(detok.feed(int(item)))
            if text:
                await request.emit(text)
            if hit:
                reason = "stop"
                usage = {"prompt_tokens": prompt_tokens, "completion_tokens": tokens}
                break
        else:
            rest = stop.flush(detok.flush())
            if rest:
                await request.emit(rest)
        return {"finish_reason": reason, "usage": usage}


def create_decode(model_path: str) -> Decode:
    from omni_qwen3_tts.tokenizer import TextTokenizer

    from .source import resolve_model_path

    return Decode(TextTokenizer.from_dir(resolve_model_path(model_path).path))


# -- talker and code2wav factories ---------------------------------------------------


@engine_factory("talker_ar")
def create_talker(
    engine: EngineContext,
    max_frames: int = 2048,
    quantization: str = "none",
    pack_weights: bool = True,
    fp16_row_weights: bool = False,
) -> TalkerStage:
    from .talker.step import TalkerStepModel

    device = engine.device
    talker, _, root = load_part(
        engine.model_path, "talker_ar", engine.load_format, engine.dtype, device, engine.seed
    )
    from .loading import read_raw_config
    from .talker.config import TalkerConfig

    config = TalkerConfig.from_dict(read_raw_config(root))
    dtype_of = next(talker.parameters()).dtype
    if pack_weights and device == "cpu":
        from .thinker.cpu_weights import pack_decoder_weights

        # as the thinker's: its decoder, experts (blocked where that pays) and code
        # predictor, whose 15 steps a frame read more weight bytes than the decoder
        pack_decoder_weights(talker)
    apply_quantization(talker, quantization, stage="talker_ar")  # bf16 only; heads stay
    apply_row_copies(talker, fp16_row_weights, stage="talker_ar")
    model = TalkerStepModel(talker, config, device=torch.device(device), dtype=dtype_of)
    return TalkerStage(create_engine(model, engine.settings, device=device), config, max_frames)


def _code2wav_decoder(
    model_path: str, load_format: str, dtype: str | None, device: str, seed: int
) -> Any:
    decoder, _, _ = load_part(model_path, "code2wav", load_format, dtype, device, seed)
    return decoder


# The release's codec decoder, streamed by the same stage as Qwen3-TTS's vocoder
# (its dtype, float32 by default, comes from Code2WavArgs).
create_code2wav = vocoder_factory(_code2wav_decoder, "code2wav")
