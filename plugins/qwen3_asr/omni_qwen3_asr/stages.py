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

from omni_core import RequestError
from omni_core.engine.backends import create_engine
from omni_core.engine.interface import SamplingParams
from omni_core.engine.prompt import EmbeddedPrompt
from omni_core.kit.stages import EngineContext, engine_factory, torch_device
from omni_qwen3_omni.detokenize import Detokenizer
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
        align = data["mel"] if data.get("words") else None  # the clip, for the aligner
        header = {"language": data.get("language"), "prompt_tokens": len(ids), "align": align}
        await request.emit(header)
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


@engine_factory("asr")
def create_asr(engine: EngineContext, pack_weights: bool = True) -> ASR:
    from omni_qwen3_omni.chat import ChatPrompter

    device = engine.device
    model = load_model(*engine.load_args)
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
    return ASR(create_engine(step, engine.settings, device=device), model.encoder, device)


class Decode:
    """Token ids in, transcript deltas out; the answer's language header read off."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.special = tokenizer.special_ids()

    async def run(self, request: Any) -> dict[str, Any]:
        detok = Detokenizer(self.tokenizer.decode, skip=self.special)
        parser = AnswerParser()
        reason, usage, align = None, None, None
        async for item in request.stream:
            if isinstance(item, dict):  # the asr stage's header or trailer
                if "prompt_tokens" in item:
                    parser = AnswerParser(forced=item.get("language"))
                    align = item.get("align")
                reason = item.get("finish_reason", reason)
                usage = item.get("usage", usage)
                continue
            text = parser.feed(detok.feed(int(item)))
            if text:
                await request.emit(text)
        rest = parser.feed(detok.flush()) + parser.flush()
        if rest:
            await request.emit(rest)
        ending = {"finish_reason": reason, "usage": usage, "language": parser.language}
        await request.emit({**ending, "align": align})  # the align stage's trailer
        return ending


def create_decode(model_path: str) -> Decode:
    from omni_qwen3_tts.tokenizer import TextTokenizer

    return Decode(TextTokenizer.from_dir(resolve_model_path(model_path).path))


class Align:
    """The text stage: passes the transcript on as it streams; times its words when asked.

    Word timings come from the release's forced aligner (:mod:`.aligner`),
    loaded when ``factory.aligner_path`` names one; without it a request for
    them is refused, saying which setting to add.
    """

    def __init__(self, aligner: Any | None):
        self.aligner = aligner
        self.limiter = anyio.CapacityLimiter(1)

    async def run(self, request: Any) -> dict[str, Any]:
        text: list[str] = []
        trailer: dict[str, Any] = {}
        async for item in request.stream:
            if isinstance(item, str):
                text.append(item)
                await request.emit(item)
            else:
                trailer = item
        out = {k: trailer.get(k) for k in ("finish_reason", "usage", "language")}
        out["text"] = "".join(text)  # the whole transcript, for callers of the runtime
        mel = trailer.get("align")
        if mel is None:
            return out
        if self.aligner is None:
            raise RequestError(
                "word timings need the forced aligner, which this deployment does not load",
                hint="set stages.align.factory.aligner_path to a Qwen3-ForcedAligner checkpoint "
                "(e.g. Qwen/Qwen3-ForcedAligner-0.6B)",
            )
        language = out["language"] or "English"
        try:
            words = await anyio.to_thread.run_sync(
                self.aligner.align, mel, "".join(text), language, limiter=self.limiter
            )
        except NotImplementedError as exc:
            raise RequestError(str(exc)) from None
        out["words"] = [{"word": w.word, "start": w.start, "end": w.end} for w in words]
        return out


def create_align(
    model_path: str,
    gpu_id: int | None = None,
    aligner_path: str | None = None,
    aligner_load_format: str = "auto",
    dtype: str | None = None,
    seed: int = 0,
) -> Align:
    if aligner_path is None:
        return Align(None)
    from .aligner import ForcedAligner
    from .loading import load_aligner

    device = torch_device(gpu_id, "align")
    encoder, lm, config, root = load_aligner(aligner_path, aligner_load_format, dtype, device, seed)
    from omni_qwen3_omni.chat import ChatPrompter

    # The release's aligner ships the ASR model's tokenizer; a directory without one
    # (the tiny preset) reads the ASR model's.
    tokenizer_dir = root if (root / "vocab.json").is_file() else resolve_model_path(model_path).path
    return Align(ForcedAligner(encoder, lm, ChatPrompter.from_dir(tokenizer_dir), config))
