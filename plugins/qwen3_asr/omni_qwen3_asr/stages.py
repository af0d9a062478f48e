"""Stage factories of ``qwen3-asr``: ``asr`` (tower + decoder on the engine) and ``decode``.

Built in the child process that runs them (the parent never imports this
module). ``asr`` encodes a request's mel in a worker thread (one clip at a
time; the tower is a small share of the work), splices the rows into the
prompt at the audio placeholders and enqueues it on the torch engine, where
requests decode together, continuously batched. It streams each token id to
``decode``, then why generation ended and the token counts.
"""

from __future__ import annotations

from typing import Any

import anyio
import torch

from omni_core.engine.backends import create_engine
from omni_core.engine.interface import EngineSettings, SamplingParams
from omni_core.engine.prompt import EmbeddedPrompt
from omni_qwen3_omni.detokenize import Detokenizer
from omni_qwen3_omni.stages import torch_device
from omni_qwen3_omni.thinker.step import ThinkerStepModel

from .config import EOS_TOKENS
from .loading import load_model
from .preprocessing import create_preprocessing  # noqa: F401 - a factory_path target
from .prompt import AnswerParser
from .source import resolve_model_path


class ASR:
    """Encodes the clip, then runs the prompt on the engine and streams the token ids."""

    def __init__(self, engine: Any, encoder: Any, device: str):
        self.engine, self.encoder = engine, encoder
        self.device = torch.device(device)
        self.dtype = next(encoder.parameters()).dtype
        self.limiter = anyio.CapacityLimiter(1)

    def _encode(self, mel: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            (rows,) = self.encoder([mel.to(self.device, self.dtype)])
        return rows

    async def run(self, request: Any) -> dict[str, Any]:
        data = request.data
        rows = await anyio.to_thread.run_sync(self._encode, data["mel"], limiter=self.limiter)
        ids = list(data["token_ids"])
        index = torch.tensor([i for i, t in enumerate(ids) if t == data["audio_token_id"]])
        if index.numel() != rows.shape[0]:
            raise RuntimeError(
                f"the prompt holds {index.numel()} audio placeholders for {rows.shape[0]} rows"
            )
        prompt = EmbeddedPrompt(ids, embeddings=rows, embedding_index=index)
        await request.emit({"language": data.get("language"), "prompt_tokens": len(ids)})
        tokens = 0
        sampling = SamplingParams(**data["sampling"])
        async with self.engine.enqueue(request.request_id, prompt, sampling) as stream:
            async for token in stream:
                await request.emit(token)
                tokens += 1
        usage = {"prompt_tokens": len(ids), "completion_tokens": tokens}
        await request.emit({"finish_reason": stream.finish_reason, "usage": usage})
        return {"finish_reason": stream.finish_reason, "usage": usage}

    async def aclose(self) -> None:
        await self.engine.aclose()


def create_asr(
    model_path: str,
    gpu_id: int | None = None,
    gpu_memory_fraction: float | None = None,
    engine_settings: EngineSettings | None = None,
    dtype: str | None = None,
    load_format: str = "auto",
    seed: int = 0,
    pack_weights: bool = True,
) -> ASR:
    from omni_qwen3_omni.chat import ChatPrompter

    settings = engine_settings or EngineSettings()
    if settings.mem_fraction_static is None and gpu_memory_fraction is not None:
        settings = settings.model_copy(update={"mem_fraction_static": gpu_memory_fraction})
    device = torch_device(gpu_id, "asr")
    model = load_model(model_path, load_format, dtype, device, seed)
    if pack_weights and device == "cpu":
        from omni_core.engine.cpu_linear import pack_linear_weights

        pack_linear_weights(model.lm)
    tokenizer = ChatPrompter.from_dir(model.root).tokenizer
    eos = {tokenizer.encode(token)[0] for token in EOS_TOKENS}
    step = ThinkerStepModel(
        model.lm,
        model.config.text,
        eos_ids=eos,
        device=torch.device(device),
        dtype=model.lm.model.embed_tokens.weight.dtype,
    )
    return ASR(create_engine(step, settings, device=device), model.encoder, device)


class Decode:
    """Token ids in, transcript deltas out; the answer's language header read off."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.special = tokenizer.special_ids()

    async def run(self, request: Any) -> dict[str, Any]:
        detok = Detokenizer(self.tokenizer.decode, skip=self.special)
        parser = AnswerParser()
        reason, usage = None, None
        async for item in request.stream:
            if isinstance(item, dict):  # the asr stage's header or trailer
                if "prompt_tokens" in item:
                    parser = AnswerParser(forced=item.get("language"))
                reason = item.get("finish_reason", reason)
                usage = item.get("usage", usage)
                continue
            text = parser.feed(detok.feed(int(item)))
            if text:
                await request.emit(text)
        rest = parser.feed(detok.flush()) + parser.flush()
        if rest:
            await request.emit(rest)
        return {"finish_reason": reason, "usage": usage, "language": parser.language}


def create_decode(model_path: str) -> Decode:
    from omni_qwen3_tts.tokenizer import TextTokenizer

    return Decode(TextTokenizer.from_dir(resolve_model_path(model_path).path))
