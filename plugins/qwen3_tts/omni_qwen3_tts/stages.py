"""Stage factories of the Qwen3-TTS pipeline: preprocessing, tts_engine, vocoder.

The parent never imports this module (stages are built in the child that
runs them), so torch is imported here freely.

* preprocessing: validates the speech request (400 on bad input), tokenises
  the text and builds the prompt of the checkpoint's variant, decodes and
  resamples reference audio for voice cloning, and fixes the sampling
  parameters (the release's defaults, overridden per request);
* tts_engine: generates frames through the engine backend (continuous
  batching) and streams each frame's 16 codes to the vocoder as it exists;
* vocoder: decodes the codes in chunks, carrying the codec's state from chunk
  to chunk, and streams audio.

When stages share a process they share one loaded model (``load_model`` is
memoised per process), so the talker and the codec are loaded once.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

import torch

from omni_core import RequestError
from omni_core.engine.backends import create_engine
from omni_core.engine.compute import run_compute
from omni_core.engine.cpu_row_copy import apply_row_copies
from omni_core.engine.interface import SamplingParams
from omni_core.engine.quantize import apply_quantization
from omni_core.engine.sampling import to_device
from omni_core.kit.stages import (
    SPEECH_REQUEST_KEYS,
    EngineContext,
    TTSPreprocessing,
    engine_factory,
    torch_device,
)
from omni_core.kit.stages import number as kit_number
from omni_core.media import AudioLimits, decode_base64_audio

from .codec_footprint import (
    CHUNK_MEMORY,
    GPU_BATCH,
    MAX_FRAME_ROWS,
    CodecFootprint,
    captured_shapes,
)
from .config import GenerationDefaults, Qwen3TTSConfig
from .decode_batcher import DecodeBatcher
from .model import Qwen3TTSModel, build_speech_tokenizer
from .prompt import PromptBuilder, PromptError
from .speech_tokenizer import SpeechTokenizer
from .speech_tokenizer.decoder import CodecDecoder
from .speech_tokenizer.stream_graphs import (
    Capture,
    CapturedChunks,
    StreamGraphs,
    chunk_schedule,
    row_buckets,
)
from .tokenizer import TextTokenizer
from .weights import read_json, resolve_model_path

SAMPLE_RATE = 24000
MIN_REF_AUDIO_SECONDS = 0.5  # shorter clips give the speaker encoder too little to go on
# the kit's speech fields (OpenAI's, the server's voices, sampling) and Qwen3-TTS's
REQUEST_KEYS = SPEECH_REQUEST_KEYS | {"language", "ref_audio", "ref_text", "x_vector_only"}


@functools.lru_cache(maxsize=4)
def load_model(
    model_path: str, load_format: str, dtype: str | None, device: str, seed: int
) -> Qwen3TTSModel:
    """One model per process and checkpoint, shared by the stages that need it.

    Its speech tokenizer (for voice cloning) is :func:`load_codec`'s in its
    default dtype, which is the vocoder's too unless the vocoder sets another.
    """
    model = Qwen3TTSModel.from_pretrained(
        model_path,
        load_format=load_format,
        dtype=dtype,
        device=device,
        seed=seed,
        load_speech_tokenizer=False,
    )
    model.speech_tokenizer = load_codec(model_path, load_format, None, device, seed)
    return model


@functools.lru_cache(maxsize=4)
def load_codec(
    model_path: str, load_format: str, dtype: str | None, device: str, seed: int
) -> SpeechTokenizer:
    """The speech tokenizer alone (the vocoder needs no talker), once per process and dtype."""
    root = resolve_model_path(model_path).path
    return build_speech_tokenizer(root, load_format, dtype, torch.device(device), seed)


# -- preprocessing ---------------------------------------------------------------


class Preprocessing(TTSPreprocessing):
    pipeline = "qwen3-tts"
    request_keys = REQUEST_KEYS

    def load(self, model_path: str) -> tuple[Any, int]:
        root = resolve_model_path(model_path).path
        self.config = Qwen3TTSConfig.from_dict(read_json(root / "config.json"))
        self.defaults = GenerationDefaults.from_dict(
            read_json(root / "generation_config.json", required=False)
        )
        self.prompts = PromptBuilder(self.config, TextTokenizer.from_dir(root))
        return self.prompts.tokenizer.encode, self.defaults.max_new_tokens

    def prepare(self, data: dict[str, Any]) -> dict[str, Any]:
        if data.get("speed", 1.0) not in (1, 1.0, None):
            raise RequestError("qwen3-tts does not change speed; omit 'speed' or send 1.0")
        try:
            if data.get("voice_enroll"):
                return {"enroll": self._enrollment(data)}
            return {
                "prompt": self._prompt(data),
                "sampling": self._sampling(data),
                "clone": self._clone(data),
            }
        except PromptError as exc:
            raise RequestError(str(exc)) from None

    def _enrollment(self, data: dict[str, Any]) -> dict[str, Any]:
        """A voice upload: the clip to compute the clone prompt from, once."""
        if self.config.tts_model_type != "base":
            raise PromptError(
                f"this checkpoint is Qwen3-TTS {self.config.tts_model_type!r}, which cannot clone "
                "voices; voice uploads need a Qwen3-TTS Base checkpoint"
            )
        if not data.get("ref_audio"):
            raise PromptError("a voice upload needs its audio")
        return {"ref_audio": self._reference_audio(data["ref_audio"])}

    def _prompt(self, data: dict[str, Any]) -> Any:
        text, language = data.get("input") or "", data.get("language") or "auto"
        variant = self.config.tts_model_type
        if variant == "custom_voice":
            voice = data.get("voice") or (self.prompts.speakers[0] if self.prompts.speakers else "")
            return self.prompts.custom_voice(text, voice, language, data.get("instructions"))
        if variant == "voice_design":
            if not data.get("instructions"):
                raise PromptError("a VoiceDesign model needs 'instructions' describing the voice")
            return self.prompts.voice_design(text, data["instructions"], language)
        return None  # Base: the engine stage computes the reference's codes and x-vector

    def _clone(self, data: dict[str, Any]) -> dict[str, Any] | None:
        if self.config.tts_model_type != "base":
            for key in ("ref_audio", "ref_text", "x_vector_only", "voice_prompt"):
                if data.get(key):
                    raise PromptError(
                        f"{key!r} is for voice cloning, which needs a Base checkpoint; "
                        f"this one is {self.config.tts_model_type!r}"
                    )
            return None
        if not data.get("input", "").strip():
            raise PromptError("text is empty")
        stored = data.get("voice_prompt")
        if not data.get("ref_audio") and stored is None:
            raise PromptError("voice cloning needs 'ref_audio' (base64-encoded wav or flac)")
        x_vector_only = bool(data.get("x_vector_only", False))
        if stored is not None and not (data.get("ref_text") or "").strip():
            x_vector_only = True  # a stored voice without its transcript: the x-vector alone
        if not x_vector_only and not (data.get("ref_text") or "").strip():
            raise PromptError(
                "voice cloning needs 'ref_text', the reference audio's transcript "
                "(or x_vector_only: true)"
            )
        return {
            "text": data["input"],
            "language": data.get("language") or "auto",
            "ref_audio": None if stored is not None else self._reference_audio(data["ref_audio"]),
            "stored": stored,
            "ref_text": data.get("ref_text"),
            "x_vector_only": x_vector_only,
        }

    def _reference_audio(self, encoded: Any) -> Any:
        """The reference clip as mono float32 at 24 kHz, decoded by the core's bounded reader."""
        import numpy as np

        clip = decode_base64_audio(
            encoded,
            "ref_audio",
            AudioLimits(max_seconds=self.max_ref_audio_seconds, min_seconds=MIN_REF_AUDIO_SECONDS),
        )
        mono = clip.samples.mean(axis=1)
        if clip.rate != SAMPLE_RATE:
            import soxr

            mono = soxr.resample(mono, clip.rate, SAMPLE_RATE)
        return np.ascontiguousarray(mono, dtype=np.float32)

    def _sampling(self, data: dict[str, Any]) -> SamplingParams:
        d = self.defaults

        def number(key: str, default: Any, kind: type) -> Any:
            return kit_number(data, key, default, kind)

        max_frames = number("max_frames", self.max_frames, int)
        if not 1 <= max_frames <= self.max_frames:
            raise PromptError(f"'max_frames' must be in 1..{self.max_frames}, got {max_frames}")
        return SamplingParams(
            temperature=number("temperature", d.temperature if d.do_sample else 0.0, float),
            top_k=number("top_k", d.top_k, int),
            top_p=number("top_p", d.top_p, float),
            repetition_penalty=number("repetition_penalty", d.repetition_penalty, float),
            seed=number("seed", None, int),
            max_new_tokens=max_frames,
        )


create_preprocessing = Preprocessing  # the kit's TTSPreprocessing is its own factory


# -- tts_engine -------------------------------------------------------------------


class TTSEngine:
    def __init__(self, model: Qwen3TTSModel, engine: Any):
        self.model, self.engine = model, engine

    async def run(self, request: Any) -> dict[str, Any]:
        if request.data.get("enroll"):
            voice = await run_compute(self._voice_prompt, request.data["enroll"])
            await request.emit({"voice_prompt": voice})  # the vocoder hands it to the server
            return {"frames": 0}
        prompt, sampling = request.data["prompt"], request.data["sampling"]
        if request.data.get("clone"):
            prompt = await run_compute(self._clone_prompt, request.data["clone"])
            if prompt.icl:
                # The release decodes an in-context clone after the reference's codes,
                # so the codec starts from the reference voice, not from silence.
                await request.emit({"reference": torch.as_tensor(prompt.ref_codes).long()})
        frames = 0
        async with self.engine.enqueue(request.request_id, prompt, sampling) as stream:
            async for codes in stream:
                if codes is None:  # the EOS step has no frame
                    continue
                await request.emit(codes)
                frames += 1
        # The vocoder's final output carries both to the API: why the speech ended
        # ("length": the frame cap) and the usage (prompt positions, codec frames).
        usage = {"prompt_tokens": self.model.prompt_length(prompt), "completion_tokens": frames}
        await request.emit({"finish_reason": stream.finish_reason, "usage": usage})
        return {"frames": frames, "finish_reason": stream.finish_reason, "usage": usage}

    def _voice_prompt(self, enroll: dict[str, Any]) -> dict[str, Any]:
        """What a stored voice keeps: the clip's codes and x-vector, computed once."""
        codes, xvector = self.model.voice_clone_reference(torch.from_numpy(enroll["ref_audio"]))
        return {"ref_codes": codes.cpu().numpy(), "x_vector": xvector.float().cpu().numpy()}

    def _clone_prompt(self, clone: dict[str, Any]) -> Any:
        try:
            if clone.get("stored") is not None:
                stored = clone["stored"]
                codes = torch.as_tensor(stored["ref_codes"]).long()
                xvector = torch.as_tensor(stored["x_vector"]).to(self.model.dtype)
            else:
                codes, xvector = self.model.voice_clone_reference(
                    torch.from_numpy(clone["ref_audio"])
                )
            return self.model.prompts.voice_clone(
                clone["text"],
                xvector,
                clone["language"],
                ref_codes=codes,
                ref_text=clone["ref_text"],
                x_vector_only=clone["x_vector_only"],
            )
        except PromptError as exc:
            raise RequestError(str(exc)) from None

    async def aclose(self) -> None:
        await self.engine.aclose()


@engine_factory("tts_engine")
def create_tts_engine(
    engine: EngineContext,
    pack_weights: bool = True,
    quantization: str = "none",
    fp16_row_weights: bool = False,
) -> TTSEngine:
    model = load_model(*engine.load_args)
    if pack_weights and engine.device == "cpu":
        from omni_core.engine.cpu_linear import pack_linear_weights

        pack_linear_weights(model.network)  # idempotent: the model is shared per process
    # int8 weight-only talker and code predictor (bf16 models only; idempotent as well)
    apply_quantization(model.network.talker, quantization, stage="tts_engine")
    apply_row_copies(model.network.talker, fp16_row_weights, stage="tts_engine")
    return TTSEngine(model, create_engine(model, engine.settings, device=engine.device))


# -- vocoder ----------------------------------------------------------------------


class Vocoder:
    """Streams audio in chunks as the engine's frames arrive.

    The first chunk holds ``chunk_frames`` frames (time to first audio); each
    next one doubles, up to ``max_chunk_frames``, so later chunks cost fewer
    codec calls while the listener is already hearing the start.

    ``left_context_frames = None`` (the default) decodes statefully: each
    request keeps a :class:`StreamState` that carries every causal
    operation's look-back (about 5 MB per request at the release's size,
    mostly the codec transformer's key/value window), so each frame is
    decoded once and the streamed audio equals a full decode. A number
    instead re-decodes that many earlier frames with every chunk, the
    release's way (25 frames: an approximation, and about three times the
    codec work at 12-frame chunks).

    An in-context voice clone's stream starts with ``{"reference": codes}``:
    those frames are context only (decoded into the state, never played), as
    in the release. Chunks of concurrent requests that wait at the same
    moment with the same length are decoded as one batch of at most
    ``max_batch_size``: by default 16 on a GPU and 1 on the CPU, where the
    codec's convolutions are memory-bound and a stacked batch measured
    slower than the same chunks one by one (benchmarks/bench_qwen3_tts.py).
    A batch whose chunks would allocate more than
    ``codec_footprint.CHUNK_MEMORY`` (1 GiB) at once is decoded in several
    calls of even size (16 streams' 48-frame chunks of the release's codec:
    4 calls of 4, about 0.73 GB each, instead of one of 2.9 GB), so what the
    stage allocates is bounded whatever the load, and the planner reserves
    it (``memory.py``).

    On a GPU a stateful stream's chunks are captured as CUDA graphs, one per
    rows bucket (1, 2, 4, ... up to ``max_batch_size``) and chunk length of
    the schedule above (``speech_tokenizer/stream_graphs.py``; the stage's
    ``factory.disable_cuda_graph`` turns it off). :attr:`graph_note` says what
    was captured, or why not; the stage factory prints it to the stage's log.
    """

    def __init__(
        self,
        decoder: Any,
        chunk_frames: int,
        left_context_frames: int | None,
        max_batch_size: int | None = None,
        max_chunk_frames: int | None = None,
        sample_rate: int = SAMPLE_RATE,
        chunk_growth: int = 2,
        cuda_graph: bool = True,
        capture: Capture | None = None,
        chunk_memory: int | None = CHUNK_MEMORY,
        graph_max_rows: int | None = None,
    ):
        """``decoder``: a codec decoder (``speech_tokenizer.decoder.CodecDecoder``), shared
        with Qwen3-Omni's code2wav, which streams through this same class, as does
        MOSS-TTS's codec: anything with ``new_stream()`` and ``stream_rows()``.
        ``chunk_growth``: each chunk after the first is this many times the one
        before (up to ``max_chunk_frames``); a codec whose every call reads all of
        its weights (MOSS-TTS's transformers) grows faster, to make fewer calls.
        ``cuda_graph``: capture the chunks on a GPU; ``capture``: how (default
        ``CapturedStep``; a test's stand-in captures on the CPU too). ``chunk_memory``:
        most bytes an eager call allocates (None: a batch in one call, whatever it
        takes; MOSS-TTS's codec, whose every call reads all of its weights).
        ``graph_max_rows``: the largest rows bucket captured (None: ``max_batch_size``);
        MOSS-TTS's ``factory.cuda_graph_max_bs``, whose graphs share windows that many
        rows tall."""
        if chunk_frames < 1:
            raise ValueError(f"factory.chunk_frames must be >= 1, got {chunk_frames}")
        if chunk_growth < 1:
            raise ValueError(f"chunk_growth must be >= 1, got {chunk_growth}")
        self.chunk_growth = chunk_growth
        if left_context_frames is not None and left_context_frames < 0:
            raise ValueError(
                f"factory.left_context_frames must be >= 0 or none, got {left_context_frames}"
            )
        self.decoder, self.sample_rate = decoder, sample_rate
        self.device = next(self.decoder.parameters()).device
        self.chunk_frames = chunk_frames
        self.max_chunk_frames = max(chunk_frames, max_chunk_frames or chunk_frames)
        default_batch = GPU_BATCH if self.device.type == "cuda" else 1
        self.context = left_context_frames
        decode = self.decode_streams if self.context is None else self.decode_with_context
        self.batcher = DecodeBatcher(decode, max_batch_size or default_batch)
        if graph_max_rows is not None and graph_max_rows < 1:
            raise ValueError(f"the largest captured batch must be >= 1, got {graph_max_rows}")
        self.graph_max_rows = graph_max_rows
        footprint = getattr(decoder, "footprint", None)  # a codec without one: one call a batch
        self.footprint: CodecFootprint | None = footprint() if footprint else None
        if self.footprint is not None and graph_max_rows is not None:
            self.footprint = replace(self.footprint, captured_rows=graph_max_rows)
        self.chunk_memory = chunk_memory
        self.graphs: CapturedChunks | None = None  # StreamGraphs, or the codec's own
        self.graph_note = self._capture(cuda_graph, capture)

    def _capture(self, wanted: bool, capture: Capture | None) -> str:
        """Capture the streamed chunks where asked and possible; what happened, or ""."""
        if not wanted or (capture is None and self.device.type != "cuda"):
            return ""
        if self.context is not None:
            return "chunks not captured: left_context_frames re-decodes a context of its own"
        if isinstance(self.decoder, CodecDecoder):
            graphs_of: Any = functools.partial(StreamGraphs, self.decoder)
        else:  # another codec captures its own chunks, if it can (MOSS-TTS's: codec/graphs.py)
            graphs_of = getattr(self.decoder, "stream_graphs", None)
        if graphs_of is None:
            return "chunks not captured: this codec cannot capture its streamed chunks"
        if capture is None:
            from omni_core.engine.cuda_graphs import CapturedStep, graph_pool

            free = torch.cuda.mem_get_info(self.device)[0]
            short = memory_refusal(free, self.device, self._capture_needs())
            if short:  # the engines sharing the GPU took it: the eager chunks need less
                return short
            pool = graph_pool(self.device)

            def capture(fn: Any, example: Any) -> Any:
                return CapturedStep(fn, example, pool=pool)

        lengths = chunk_schedule(self.chunk_frames, self.chunk_growth, self.max_chunk_frames)
        try:
            self.graphs = graphs_of(self._graph_rows(), lengths, capture)
        except ValueError as exc:  # every chunk of the schedule is too large to keep
            return f"chunks not captured: {exc}"
        except RuntimeError as exc:  # fail soft: the eager chunks decode the same audio
            self.graphs = None
            return f"chunks not captured, decoded eagerly ({type(exc).__name__}: {exc})"
        return self.graphs.note()

    def _graph_rows(self) -> list[int]:
        """The rows buckets to capture: powers of two up to the batch, and to
        ``graph_max_rows`` where set (larger batches decode eagerly)."""
        most = self.graph_max_rows
        return [r for r in row_buckets(self.batcher.max_batch) if most is None or r <= most]

    def _capture_needs(self) -> int:
        """Bytes the graphs keep and the eager calls beside them take at most (at least
        :data:`CAPTURE_MIN_FREE`: the CUDA graphs' own bookkeeping and rounding)."""
        if self.footprint is None:
            return CAPTURE_MIN_FREE
        lengths = chunk_schedule(self.chunk_frames, self.chunk_growth, self.max_chunk_frames)
        shapes = captured_shapes(self._graph_rows(), lengths, MAX_FRAME_ROWS)
        budget = self.chunk_memory if self.chunk_memory is not None else 1 << 62
        eager = self.footprint.calls_peak(self.batcher.max_batch, lengths[-1], budget)
        return max(CAPTURE_MIN_FREE, self.footprint.graph_bytes(shapes) + eager)

    async def run(self, request: Any) -> dict[str, Any]:
        stream = self.decoder.new_stream() if self.context is None else None
        behind: list[torch.Tensor] = []  # played frames the next chunk decodes again
        pending: list[torch.Tensor] = []  # frames not played yet
        frames = samples = 0
        finish_reason = usage = None
        voice_prompt = None
        chunk = self.chunk_frames
        async for codes in request.stream:
            if isinstance(codes, dict) and "finish_reason" in codes:
                finish_reason, usage = codes["finish_reason"], codes.get("usage")
                continue
            if isinstance(codes, dict) and "voice_prompt" in codes:
                voice_prompt = codes["voice_prompt"]  # an enrollment: no audio, a prompt
                continue
            if isinstance(codes, dict):  # an in-context clone's reference: context only
                reference = list(torch.as_tensor(codes["reference"]).unbind(0))
                if stream is not None and reference:
                    await self._decode(stream, [], reference)
                behind = self._behind(behind, reference)
                continue
            pending.append(codes)
            frames += 1
            if len(pending) >= chunk:
                samples += await self._play(request, stream, behind, pending)
                behind, pending = self._behind(behind, pending), []
                chunk = min(self.chunk_growth * chunk, self.max_chunk_frames)
        if pending:
            samples += await self._play(request, stream, behind, pending)
        return {
            "frames": frames,
            "samples": samples,
            "sample_rate": self.sample_rate,
            "finish_reason": finish_reason,
            **({"usage": usage} if usage is not None else {}),
            **({"voice_prompt": voice_prompt} if voice_prompt is not None else {}),
        }

    def _behind(self, behind: list[torch.Tensor], played: list[torch.Tensor]) -> list[torch.Tensor]:
        """The left context kept for the next chunk (none when decoding statefully)."""
        if not self.context:
            return []
        return (behind + played)[-self.context :]

    async def _play(
        self, request: Any, stream: Any, behind: list[torch.Tensor], new: list[torch.Tensor]
    ) -> int:
        audio = await self._decode(stream, behind, new)
        await request.emit(audio)
        return int(audio.shape[0])

    async def _decode(
        self, stream: Any, behind: list[torch.Tensor], new: list[torch.Tensor]
    ) -> Any:
        """The audio of ``new`` (``behind``, if any, is decoded again as left context)."""
        if stream is not None:
            return await self.batcher.decode(torch.stack(new), "stream", stream)
        return await self.batcher.decode(torch.stack(behind + new), len(behind), len(behind))

    def decode_streams(self, codes: torch.Tensor, streams: list[Any]) -> Any:
        """Codes ``[B, Q, T]`` -> float32 audio per row, each row advancing its stream.

        Rows may be at different points of their streams (a first chunk beside
        a later one), where a codec that looks ahead gives rows of different
        lengths, so each row's audio comes back on its own.
        """
        with torch.inference_mode():
            codes = to_device(codes, self.device).clamp(min=0)
            rows = None if self.graphs is None else self.graphs.decode(codes, streams)
            if rows is None:
                rows = []
                for start, stop in self._calls(len(streams), codes.shape[-1]):
                    rows += self._decode_eagerly(codes[start:stop], streams[start:stop])
        # one copy to the host for the batch (a copy per row waits for the device each time);
        # the rows' lengths are their shapes, known here without reading the device
        flat = torch.cat([row[0].float().reshape(-1) for row in rows]).cpu()
        parts = flat.split([row[0].numel() for row in rows])
        return [part.view(row[0].shape).numpy() for part, row in zip(parts, rows, strict=True)]

    def _calls(self, rows: int, frames: int) -> list[tuple[int, int]]:
        """The rows ``[start, stop)`` of each eager call: as few calls as keep each one's
        allocations within ``codec_footprint.CHUNK_MEMORY``, of even size."""
        if self.footprint is None or self.chunk_memory is None:
            return [(0, rows)]
        most = self.footprint.rows_per_call(frames, self.chunk_memory)
        calls = -(-rows // most)
        size = -(-rows // calls)
        return [(start, min(start + size, rows)) for start in range(0, rows, size)]

    def _decode_eagerly(self, codes: torch.Tensor, streams: list[Any]) -> list[torch.Tensor]:
        # The decoder's own state type (this package's StreamState, or the MOSS
        # codec's): each offers stack / split / adopt for batching streams.
        batch = type(streams[0]).stack(streams)
        rows = self.decoder.stream_rows(codes, batch)
        if len(streams) > 1:
            for stream, row in zip(streams, batch.split([1] * len(streams)), strict=True):
                stream.adopt(row)
        return rows

    def decode_with_context(self, codes: torch.Tensor, contexts: list[int]) -> Any:
        """Codes ``[B, 16, T]`` -> float32 audio ``[B, N]`` of the frames after the context."""
        with torch.inference_mode():
            codes = to_device(codes, self.device).clamp(min=0)
            calls = self._calls(codes.shape[0], codes.shape[-1])
            parts = [self.decoder.decode_chunk(codes[a:b], contexts[0]) for a, b in calls]
            wav = parts[0] if len(parts) == 1 else torch.cat(parts)
        return wav[:, 0].float().cpu().numpy()


#: Free GPU memory below which a vocoder never captures its chunks, whatever its graphs
#: would keep (``Vocoder._capture_needs``: at the release's size, 16 rows, about 1.7 GiB
#: with the eager calls beside them): a capture that runs out of memory half-way costs
#: more to recover from than the eager chunks cost to run.
CAPTURE_MIN_FREE = 1 << 30


def memory_refusal(free: int, device: Any, needed: int = CAPTURE_MIN_FREE) -> str:
    """Why chunks are not captured with ``free`` bytes left on ``device``, or ""."""
    if free >= needed:
        return ""
    return (
        f"chunks not captured: {free / 2**30:.2f} GiB free on {device}, under the "
        f"{needed / 2**30:.2f} GiB their graphs and the eager chunks beside them may "
        "take (decoded eagerly)"
    )


def vocoder_factory(load_decoder: Any, stage: str) -> Any:
    """A streaming vocoder stage's factory over ``load_decoder(model_path, load_format,
    dtype, device, seed)``: its parameters are ``StreamingVocoderArgs``' fields and
    ``pack_weights``. Qwen3-TTS's vocoder and Qwen3-Omni's code2wav are this factory over
    their own codec decoders."""

    def create(
        model_path: str,
        gpu_id: int | None = None,
        dtype: str | None = None,
        load_format: str = "auto",
        seed: int = 0,
        chunk_frames: int = 4,
        max_chunk_frames: int | None = 48,
        left_context_frames: int | None = None,
        max_batch_size: int | None = None,
        pack_weights: bool = True,
        disable_cuda_graph: bool = False,
    ) -> Vocoder:
        device = torch_device(gpu_id, stage)
        decoder = load_decoder(model_path, load_format, dtype, device, seed)
        if pack_weights:
            route_float32_layers(decoder)
        rate = getattr(decoder, "sample_rate", SAMPLE_RATE)
        vocoder = Vocoder(
            decoder,
            chunk_frames,
            left_context_frames,
            max_batch_size,
            max_chunk_frames,
            rate,
            cuda_graph=not disable_cuda_graph,
        )
        if vocoder.graph_note:  # the stage log's start-up lines, as the engine prints its own
            print(f"{stage}: {vocoder.graph_note}", flush=True)
        return vocoder

    return create


def route_float32_layers(decoder: Any) -> int:
    """A float32 codec decoder's linear layers, every one, on the CPU's faster kernel for
    a chunk's row count (:class:`~omni_core.engine.cpu_linear.PackedLinear`); how many.

    Why every layer, small ones too: the engines' size floor is for a decode step's one
    row, where a small weight sits in cache and MKL is as fast, while a chunk multiplies
    tens to hundreds of rows, where oneDNN ran these decoders' 512x1024 to 4096x1024
    float32 layers faster. Measured on a 2-core AMD EPYC (Qwen3-TTS 0.6B's tokenizer
    decoder, dummy weights, alternated, best of 4): 27.3 -> 25.4 ms per frame for one
    stream's 4-frame chunk, 22.7 -> 20.3 for a 48-frame one, 17.6 -> 16.4 for 8 streams'
    4-frame chunks, 25.0 either way for 8 x 48 (its convolutions' time); the audio equal
    within 3e-6. A bf16 decoder is left as it was (unmeasured here), and so is one on a
    GPU. In place and idempotent: the decoder is shared per process.
    """
    first = next(decoder.parameters(), None)
    if first is None or first.device.type != "cpu" or first.dtype != torch.float32:
        return 0
    from omni_core.engine.cpu_linear import pack_linear_weights

    return pack_linear_weights(decoder, min_elements=0)


def _speech_tokenizer_decoder(*args: Any) -> Any:
    return load_codec(*args).decoder


create_vocoder = vocoder_factory(_speech_tokenizer_decoder, "vocoder")
