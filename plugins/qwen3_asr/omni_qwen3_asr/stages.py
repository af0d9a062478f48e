"""Stage factories of ``qwen3-asr``: ``asr`` (tower + decoder on the engine) and ``decode``.

Built in the child process that runs them (the parent never imports this
module). ``asr`` encodes a request's mel in a worker thread (concurrent
requests' clips in one tower call, :class:`ASR`), splices the rows into the
prompt at the audio placeholders and enqueues it on the torch engine, where
requests decode together, continuously batched. It streams each token id to
``decode``, then why generation ended and the token counts.

A long clip comes as pieces (:mod:`.split`): each is its own engine sequence,
all enqueued at once so they decode in one batch, but their tokens reach
``decode`` in piece order, each piece behind a header of its own (its offset
and, for word timings, its mel): piece 0 streams as it is decoded, later
pieces' tokens wait in their queues until every earlier piece has ended.
``decode`` reads each piece's language header off separately, and ``align``
cleans each piece's text (:mod:`.repetitions`), joins them, merges their
languages and times each piece's words on its own audio, shifted by its offset.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import anyio
import torch

from omni_core import RequestError
from omni_core.engine.backends import create_engine
from omni_core.engine.compute import run_compute
from omni_core.engine.interface import SamplingParams
from omni_core.engine.prompt import EmbeddedPrompt
from omni_core.kit.batching import Coalescer
from omni_core.kit.stages import EngineContext, engine_factory, torch_device
from omni_qwen3_omni.detokenize import Detokenizer
from omni_qwen3_omni.thinker.step import ThinkerStepModel

from .config import EOS_TOKENS
from .loading import load_model
from .merge import merge_languages, shifted
from .preprocessing import create_preprocessing  # noqa: F401 - a factory_path target
from .prompt import AnswerParser
from .repetitions import collapse_repetitions
from .source import resolve_model_path

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup


class ASR:
    """Encodes the clip, then runs the prompt on the engine and streams the token ids.

    The tower encodes the clips of concurrent requests in one call
    (``factory.encoder_max_batch_size`` requests at most; those that arrive
    while a call runs join the next, :mod:`omni_core.kit.batching`), as the
    release's backends encode a batch; a long clip's pieces go in one call.
    """

    def __init__(self, engine: Any, encoder: Any, device: str, encoder_max_batch_size: int = 8):
        self.engine, self.encoder = engine, encoder
        self.device = torch.device(device)
        self.dtype = next(encoder.parameters()).dtype
        self.coalescer = Coalescer(self._encode_batch, encoder_max_batch_size)

    def _encode_batch(self, requests: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
        """Each request's mels (a clip, or a long clip's pieces) to rows, in one tower call."""
        mels = [mel.to(self.device, self.dtype) for mels in requests for mel in mels]
        with torch.inference_mode():
            rows = list(self.encoder(mels))
        out, at = [], 0
        for mels in requests:
            out.append(rows[at : at + len(mels)])
            at += len(mels)
        return out

    def _encode(self, mel: torch.Tensor) -> torch.Tensor:
        """One clip alone, in this thread (tests compare the tower's rows this way)."""
        return self._encode_batch([[mel]])[0][0]

    async def _prompts(
        self, ids: list[list[int]], mels: list[torch.Tensor], audio_id: int
    ) -> list[EmbeddedPrompt]:
        """The prompts with each clip's rows spliced in at its audio placeholders."""
        prompts = []
        for tokens, rows in zip(ids, await self.coalescer.submit(mels), strict=True):
            index = torch.tensor([i for i, t in enumerate(tokens) if t == audio_id])
            if index.numel() != rows.shape[0]:
                raise RuntimeError(
                    f"the prompt holds {index.numel()} audio placeholders for {rows.shape[0]} rows"
                )
            prompts.append(EmbeddedPrompt(tokens, embeddings=rows, embedding_index=index))
        return prompts

    async def run(self, request: Any) -> dict[str, Any]:
        data = request.data
        if "pieces" in data:
            return await self._run_pieces(request, data)
        ids = list(data["token_ids"])
        (prompt,) = await self._prompts([ids], [data["mel"]], data["audio_token_id"])
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

    async def _run_pieces(self, request: Any, data: dict[str, Any]) -> dict[str, Any]:
        """Every piece its own sequence, enqueued together; tokens emitted in piece order."""
        pieces = data["pieces"]
        prompts = await self._prompts(
            [list(p["token_ids"]) for p in pieces],
            [p["mel"] for p in pieces],
            data["audio_token_id"],
        )
        sampling = SamplingParams(**data["sampling"])
        queues = [anyio.create_memory_object_stream[int](math.inf) for _ in pieces]
        reasons: list[str] = ["stop"] * len(pieces)

        async def pump(i: int) -> None:
            """Drain piece ``i``'s engine stream into its queue (a lazy backend starts here)."""
            send = queues[i][0]
            name = f"{request.request_id}/piece{i}"
            async with send, self.engine.enqueue(name, prompts[i], sampling) as stream:
                async for token in stream:
                    send.send_nowait(int(token))
            reasons[i] = stream.finish_reason or "stop"

        tokens = 0
        try:
            async with anyio.create_task_group() as group:
                for i in range(len(pieces)):
                    group.start_soon(pump, i)
                for i, piece in enumerate(pieces):
                    header = {
                        "language": data.get("language"),
                        "prompt_tokens": len(piece["token_ids"]),
                        "align": piece["mel"] if data.get("words") else None,
                        "piece": i,
                        "offset": piece["offset"],
                    }
                    await request.emit(header)
                    async with queues[i][1] as receive:
                        async for token in receive:
                            await request.emit(token)
                            tokens += 1
        except BaseExceptionGroup as group:  # a refusal of one piece is the request's
            refusal = _first_request_error(group)
            if refusal is None:
                raise
            raise refusal from None
        reason = "length" if "length" in reasons else reasons[-1]
        prompt_tokens = sum(len(p["token_ids"]) for p in pieces)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": tokens}
        await request.emit({"finish_reason": reason, "usage": usage})
        return {"finish_reason": reason, "usage": usage}

    async def aclose(self) -> None:
        await self.engine.aclose()


def _first_request_error(group: BaseExceptionGroup) -> RequestError | None:
    """The first RequestError among ``group``'s leaves: what the client is told."""
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            found = _first_request_error(exc)
            if found is not None:
                return found
        elif isinstance(exc, RequestError):
            return exc
    return None


@engine_factory("asr")
def create_asr(
    engine: EngineContext, pack_weights: bool = True, encoder_max_batch_size: int = 8
) -> ASR:
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
    decoder = create_engine(step, engine.settings, device=device)
    return ASR(decoder, model.encoder, device, encoder_max_batch_size)


class Decode:
    """Token ids in, transcript deltas out; the answer's language header read off.

    Each piece of a long clip starts with a header of its own and is an answer
    of its own (its own language header, its own detokenizer state); the
    trailer lists the pieces (text, language, mel for the aligner, offset)
    for the align stage, which forms the final text from them.
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.special = tokenizer.special_ids()

    async def run(self, request: Any) -> dict[str, Any]:
        detok = Detokenizer(self.tokenizer.decode, skip=self.special)
        parser = AnswerParser()
        reason, usage = None, None
        pieces: list[dict[str, Any]] = []
        text: list[str] = []

        async def say(part: str) -> None:
            if part:
                text.append(part)
                await request.emit(part)

        async def end_piece() -> None:
            await say(parser.feed(detok.flush()) + parser.flush())
            if pieces:
                pieces[-1].update(text="".join(text), language=parser.language)
            text.clear()

        async for item in request.stream:
            if isinstance(item, dict):  # the asr stage's header (one per piece) or trailer
                if "prompt_tokens" in item:
                    await end_piece()
                    detok = Detokenizer(self.tokenizer.decode, skip=self.special)
                    parser = AnswerParser(forced=item.get("language"))
                    pieces.append({"align": item.get("align"), "offset": item.get("offset", 0.0)})
                reason = item.get("finish_reason", reason)
                usage = item.get("usage", usage)
                continue
            await say(parser.feed(detok.feed(int(item))))
        await end_piece()
        languages = merge_languages([p["language"] for p in pieces]) if pieces else None
        ending = {"finish_reason": reason, "usage": usage, "language": languages}
        align = pieces[0]["align"] if len(pieces) == 1 else None
        # the align stage's trailer
        await request.emit({**ending, "align": align, "pieces": pieces})
        return ending


def create_decode(model_path: str) -> Decode:
    from omni_qwen3_tts.tokenizer import TextTokenizer

    return Decode(TextTokenizer.from_dir(resolve_model_path(model_path).path))


class Align:
    """The text stage: passes the transcript on as it streams; times its words when asked.

    Word timings come from the release's forced aligner (:mod:`.aligner`),
    loaded when ``factory.aligner_path`` names one; without it a request for
    them is refused, saying which setting to add. The final text is each
    piece's text with its runaway repetitions collapsed (:mod:`.repetitions`,
    which says why the streamed deltas stay raw), joined; the words are timed
    on that text.
    """

    def __init__(self, aligner: Any | None):
        self.aligner = aligner

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
        pieces = trailer.get("pieces") or [
            {"text": "".join(text), "language": out["language"], "align": trailer.get("align")}
        ]
        for piece in pieces:
            piece["text"] = collapse_repetitions(piece["text"])
        # the whole transcript: for callers of the runtime, and ("transcript") the final
        # text the server answers with, where the streamed deltas stayed raw
        out["text"] = out["transcript"] = "".join(p["text"] for p in pieces)
        if all(p.get("align") is None for p in pieces):
            return out
        if self.aligner is None:
            raise RequestError(
                "word timings need the forced aligner, which this deployment does not load",
                hint="set stages.align.factory.aligner_path to a Qwen3-ForcedAligner checkpoint "
                "(e.g. Qwen/Qwen3-ForcedAligner-0.6B)",
            )
        out["words"] = []
        for piece in pieces:  # each on its own audio, shifted by where it starts
            language = piece.get("language") or "English"
            try:
                words = await run_compute(
                    self.aligner.align,
                    piece["align"],
                    piece["text"],
                    language,
                )
            except NotImplementedError as exc:
                raise RequestError(str(exc)) from None
            out["words"] += shifted(words, piece.get("offset", 0.0))
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
