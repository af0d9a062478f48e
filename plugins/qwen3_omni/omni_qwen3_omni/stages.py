"""Stage factories of the Qwen3-Omni pipelines.

Built in the child process that runs each stage (the parent never imports
this module). The understanding half is real: preprocessing
(:mod:`.preprocessing`), the two encoders, the aggregation, the thinker on
the engine backend, and incremental detokenisation. The speech half (talker,
code2wav) is the next piece of work; its factories say so at construction.

Each encoder runs one request at a time (all of that request's images or
clips in one batched call) in a worker thread; the thinker is where requests
batch, continuously, on the engine.
"""

from __future__ import annotations

from typing import Any

import anyio
import torch

from omni_core import NotImplementedYet
from omni_core.engine.backends import create_engine
from omni_core.engine.interface import EngineSettings, SamplingParams

from .assemble import assemble, to_prompt
from .detokenize import Detokenizer, StopMatcher
from .loading import load_part
from .preprocessing import create_preprocessing  # noqa: F401 - a factory_path target


def torch_device(gpu_id: int | None, stage: str) -> str:
    if gpu_id is None:
        return "cpu"
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"stage {stage!r} was placed on GPU {gpu_id}, but torch sees no CUDA device here; "
            "plan for this machine with --placement.policy cpu"
        )
    return f"cuda:{gpu_id}"


# -- encoders ---------------------------------------------------------------------


class ImageEncoder:
    def __init__(self, encoder: Any, device: str):
        self.encoder, self.device = encoder, torch.device(device)
        self.dtype = next(encoder.parameters()).dtype
        self.limiter = anyio.CapacityLimiter(1)

    async def run(self, request: Any) -> dict[str, Any]:
        images = request.data["images"]
        return await anyio.to_thread.run_sync(self._encode, images, limiter=self.limiter)

    def _encode(self, images: list[dict[str, Any]]) -> dict[str, Any]:
        pixels = torch.cat([im["pixel_values"] for im in images]).to(self.device, self.dtype)
        grids = torch.tensor([im["grid_thw"] for im in images], dtype=torch.long)
        with torch.inference_mode():
            embeds, deepstack = self.encoder(pixels, grids.to(self.device))
        return {"embeds": embeds.cpu(), "deepstack": [d.cpu() for d in deepstack]}


class AudioEncoder:
    def __init__(self, encoder: Any, device: str):
        self.encoder, self.device = encoder, torch.device(device)
        self.dtype = next(encoder.parameters()).dtype
        self.limiter = anyio.CapacityLimiter(1)

    async def run(self, request: Any) -> dict[str, Any]:
        clips = request.data["audios"]
        return await anyio.to_thread.run_sync(self._encode, clips, limiter=self.limiter)

    def _encode(self, clips: list[torch.Tensor]) -> dict[str, Any]:
        with torch.inference_mode():
            out = self.encoder([c.to(self.device, self.dtype) for c in clips])
        return {"embeds": torch.cat(list(out)).cpu()}


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
    return ImageEncoder(module, device)


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
    return AudioEncoder(module, device)


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
    """Runs a prompt on the engine and streams each token id; then why it ended and usage."""

    def __init__(self, engine: Any, config: Any):
        self.engine, self.config = engine, config

    async def run(self, request: Any) -> dict[str, Any]:
        data = request.data
        if "thinker_prompt" in data:
            wire = data["thinker_prompt"]
        else:  # the speech variant fans in here directly
            wire = assemble(data, data.get("encoder_outputs") or {}, self.config)
        prompt = to_prompt(wire)
        sampling = SamplingParams(**data["sampling"])
        tokens = 0
        # The decode stage's header: its stop strings, and the prompt's size for usage.
        await request.emit({"stop": list(data.get("stop") or []), "prompt_tokens": len(prompt)})
        async with self.engine.submit(request.request_id, prompt, sampling) as stream:
            async for token in stream:
                await request.emit(token)
                tokens += 1
        usage = {"prompt_tokens": len(prompt), "completion_tokens": tokens}
        await request.emit({"finish_reason": stream.finish_reason, "usage": usage})
        return {"finish_reason": stream.finish_reason, "usage": usage}

    async def aclose(self) -> None:
        await self.engine.aclose()


def create_thinker(
    model_path: str,
    gpu_id: int | None = None,
    gpu_ids: list[int] | None = None,
    gpu_memory_fraction: float | None = None,
    tp_rank: int = 0,
    tp_size: int = 1,
    engine_settings: EngineSettings | None = None,
    dtype: str | None = None,
    load_format: str = "auto",
    seed: int = 0,
    pack_weights: bool = True,
) -> Thinker:
    from .chat import ChatPrompter
    from .thinker.step import ThinkerStepModel

    if tp_size != 1:
        raise NotImplementedYet(
            "omni-qwen3-omni: the thinker runs on one device (tensor parallelism is not "
            "implemented)",
            hint="set tp_size = 1 for the thinker",
        )
    settings = engine_settings or EngineSettings()
    if settings.mem_fraction_static is None and gpu_memory_fraction is not None:
        settings = settings.model_copy(update={"mem_fraction_static": gpu_memory_fraction})
    device = torch_device(gpu_id, "thinker")
    lm, config, root = load_part(model_path, "thinker", load_format, dtype, device, seed)
    model_dtype = lm.model.embed_tokens.weight.dtype
    if pack_weights and device == "cpu":
        from omni_core.engine.cpu_linear import pack_linear_weights

        # Not the experts: each sees a row or two per step, where MKL beats oneDNN.
        pack_linear_weights(lm, skip=lambda name: ".experts." in name)
    eos = ChatPrompter.from_dir(root).eos_token_ids
    model = ThinkerStepModel(
        lm,
        config.text,
        eos_ids=set(eos),
        device=torch.device(device),
        dtype=model_dtype,
    )
    return Thinker(create_engine(model, settings, device=device), config)


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


# -- part 2 -----------------------------------------------------------------------


def _not_yet(stage: str) -> NotImplementedYet:
    return NotImplementedYet(
        f"omni-qwen3-omni: stage {stage!r} cannot be built yet: the talker and code2wav "
        "(speech output) are not implemented in this release",
        hint="serve text answers with the qwen3-omni-text pipeline",
    )


def create_talker(
    model_path: str,
    gpu_id: int | None = None,
    gpu_memory_fraction: float | None = None,
    dtype: str = "bfloat16",
    load_format: str = "auto",
    seed: int = 0,
    vocoder_in_process: bool = False,
):
    raise _not_yet("talker_ar")


def create_code2wav(
    model_path: str,
    gpu_id: int | None = None,
    gpu_memory_fraction: float | None = None,
    dtype: str = "float32",
    chunk_frames: int = 12,
    left_context_frames: int = 25,
):
    raise _not_yet("code2wav")
