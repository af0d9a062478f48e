"""The contract between an engine backend and the model it drives.

A model implements :class:`StepModel`: how many cache positions a prompt
takes, and two batched steps (``prefill`` for sequences that just joined,
``decode`` for running ones) that read and write a :class:`SlotKVCache`.
The backend owns everything else: which sequences run together (continuous
batching: new requests join between steps), which cache slot each holds,
per-request sampling state (seeded generators), streaming each step's output
to its request, finishing and aborting.

Nothing here imports torch at module import time; the types are referenced
lazily so that planning can read :class:`EngineSettings` without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..errors import OmniError, RequestError


class EngineSettings(BaseModel):
    """The ``engine.*`` keys the PyTorch backend accepts (unknown keys are refused).

    Planning validates a stage's ``engine`` group against this model, so a typo
    fails before any process starts, naming the key and the accepted ones. The
    engine keeps its cache in the model's dtype (the stage's ``factory.dtype``),
    so there is no ``engine.dtype``.
    """

    model_config = ConfigDict(extra="forbid")

    backend: str = Field(default="torch", description="engine backend: torch or sglang")
    max_running_requests: int = Field(
        default=8,
        ge=1,
        description="sequences decoded together; left unwritten on a GPU engine sized from "
        "memory, the plan sizes it: as many full-length requests as the share holds, "
        "8 to 256",
    )
    max_total_tokens: int = Field(
        default=16384, ge=1, description="KV-cache positions across all running sequences"
    )
    max_prefill_tokens: int = Field(
        default=8192, ge=1, description="prompt positions the prefills of one step compute"
    )
    chunked_prefill_size: int | None = Field(
        default=None,
        description="a prompt longer than this is prefilled in chunks of at most this many "
        "positions, one chunk per step, the running sequences decoding between chunks "
        "(models that offer chunked_prefill: the Qwen3-Omni thinker and talker, MOSS-TTS); "
        "default "
        "max_prefill_tokens; -1 never chunks (a prompt over max_prefill_tokens is refused); "
        "SGLang's key of that name",
    )
    mem_fraction_static: float | None = Field(
        default=None, gt=0, le=1, description="GPU memory share for weights and KV cache"
    )
    device: str | None = Field(default=None, description="cpu, cuda or cuda:N; placement decides")
    enable_torch_compile: bool = Field(
        default=False,
        description="compile the decode step with torch.compile, one static shape per "
        "batch-size bucket, at start-up (as SGLang's key of that name)",
    )
    cuda_graph_max_bs: int | None = Field(
        default=None,
        ge=1,
        description="largest batch-size bucket of compiled / CUDA-graph decode steps "
        "(buckets 1, 2, 4, ... up to it; larger batches run eagerly); default "
        "max_running_requests",
    )
    disable_cuda_graph: bool = Field(
        default=False, description="on CUDA, do not capture the decode buckets as CUDA graphs"
    )
    disable_radix_cache: bool = Field(
        default=False,
        description="compute every prompt whole, instead of copying the KV of a leading "
        "part another request already computed (models that offer prefix_rows: MOSS-TTS, "
        "the Qwen3-Omni thinker and talker; SGLang's key of that name)",
    )
    cpu_weight_prepack: bool = Field(
        default=False,
        description="on the CPU, compile the steps of decoders whose bf16 weights fit the "
        "last-level cache with their weights packed for inductor's AMX GEMM template "
        "(faster products; one packed copy of those weights per compiled graph); needs "
        "enable_torch_compile",
    )

    @model_validator(mode="after")
    def _chunk_size(self) -> EngineSettings:
        size = self.chunked_prefill_size
        if size is not None and size != -1 and size < 1:
            raise ValueError(f"chunked_prefill_size must be >= 1, or -1 to never chunk, got {size}")
        return self

    @property
    def prefill_chunk(self) -> int | None:
        """The most positions of one prompt a step computes, or None: prompts are not chunked."""
        size = self.chunked_prefill_size
        if size == -1:
            return None
        return min(size, self.max_prefill_tokens) if size is not None else self.max_prefill_tokens

    @model_validator(mode="after")
    def _prepack_needs_compile(self) -> EngineSettings:
        if self.cpu_weight_prepack and not self.enable_torch_compile:
            raise ValueError(
                "cpu_weight_prepack packs weights into compiled steps: set "
                "enable_torch_compile = true too, or drop cpu_weight_prepack"
            )
        return self


@dataclass
class SamplingParams:
    """Per-request sampling; defaults are the model's (e.g. Qwen3-TTS: top-k 50, T 0.9)."""

    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_new_tokens: int = 2048  # steps (for TTS: frames)


def check_sampling(params: SamplingParams) -> None:
    """Refuse parameters no sampler can honour, as the client's error (HTTP 400).

    Checked at submit, in the caller's task, so a bad request fails before it
    takes a slot (and without torch: a preprocessing stage can call it too).
    """
    problems = []
    if not params.temperature >= 0:
        problems.append(f"temperature must be >= 0 (0: greedy), got {params.temperature}")
    if params.top_k < 0:
        problems.append(f"top_k must be >= 0 (0: off), got {params.top_k}")
    if not 0 < params.top_p <= 1:
        problems.append(f"top_p must be in (0, 1], got {params.top_p}")
    if not params.repetition_penalty > 0:
        problems.append(f"repetition_penalty must be > 0, got {params.repetition_penalty}")
    if params.max_new_tokens < 1:
        problems.append(f"max_new_tokens must be >= 1, got {params.max_new_tokens}")
    if problems:
        raise RequestError("invalid sampling parameters: " + "; ".join(problems))


@dataclass
class Sequence:
    """One request inside the engine.

    ``prompt`` is model-specific (token ids, embeddings, reference codes).
    ``slot`` is the cache slot the backend assigned; ``cached`` how many
    positions of that slot are filled (the model advances it). ``generator``
    is a ``torch.Generator`` seeded from ``sampling.seed`` so that one request
    samples the same whether it runs alone or batched. ``state`` is the
    model's own per-sequence scratch space. ``prefill_end``: where the
    backend wants this prefill to stop (a chunk of a long prompt, for a model
    that offers ``chunked_prefill``), None for the prompt's end.
    """

    request_id: str
    prompt: Any
    sampling: SamplingParams
    slot: int = -1
    cached: int = 0
    steps: int = 0
    generator: Any = None
    state: dict[str, Any] = field(default_factory=dict)
    finished: bool = False
    prefill_end: int | None = None


@dataclass
class StepResult:
    """What one step produced for one sequence: streamed to the request as it is.

    A model that finds one row of a batch unusable returns that row with
    ``error`` set (the other rows go on) instead of raising for the whole batch.
    """

    output: Any
    finished: bool = False
    error: BaseException | None = None


class SequenceError(Exception):
    """Raised by a step to say which sequences it failed for.

    The backend fails only ``request_ids``; the model promises that the other
    sequences of the batch are as they were before the step, so they are
    stepped again. Any other exception from ``decode`` fails every sequence of
    the batch (their state is unknown); one from ``prefill`` is retried one
    sequence at a time to find the culprit (a prefill starts from scratch).
    """

    def __init__(self, request_ids: list[str], message: str):
        self.request_ids = list(request_ids)
        super().__init__(message)


class EngineError(OmniError):
    """A request failed inside the engine (a model step raised, or the engine closed)."""


@dataclass(frozen=True)
class CacheLayout:
    """The shape of the KV cache a model needs per position."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: Any  # torch.dtype
    device: Any  # torch.device
    #: The longest sequence the model's positions cover (``max_position_embeddings``);
    #: a cache sized from memory gives no slot more (None: no limit known).
    max_positions: int | None = None

    @classmethod
    def of(cls, config: Any, dtype: Any, device: Any, tp_size: int = 1) -> CacheLayout:
        """The layout of a decoder whose config names its geometry as transformers does
        (``num_hidden_layers``, ``num_key_value_heads``, ``head_dim``, and
        ``max_position_embeddings`` where it has one); with ``tp_size`` ranks each
        holds its share of the KV heads."""
        heads = config.num_key_value_heads // tp_size
        limit = getattr(config, "max_position_embeddings", None)
        return cls(
            config.num_hidden_layers,
            heads,
            config.head_dim,
            dtype,
            device,
            int(limit) if isinstance(limit, int) and limit > 0 else None,
        )


class StepModel(Protocol):
    """What a model gives the engine backend."""

    def cache_layout(self) -> CacheLayout: ...

    def prompt_length(self, prompt: Any) -> int:
        """Cache positions the prompt takes (for admission against the token budget)."""
        ...

    def prefill(self, sequences: list[Sequence], cache: Any) -> list[StepResult]:
        """Run the prompts of newly joined sequences; return each one's first output."""
        ...

    def decode(self, sequences: list[Sequence], cache: Any) -> list[StepResult]:
        """One step for every running sequence; return each one's next output.

        A model may also define ``ready(seq) -> bool``: then only the
        sequences it calls ready are decoded (the others wait for input that
        streams in, e.g. a talker fed by a thinker in another process), and
        whoever feeds them calls ``engine.wake()`` when input arrives.

        And ``prefix_rows(seq) -> Tensor | None``: one row per position of
        ``seq.prompt`` of what decides that position's keys and values given
        the positions before it (token ids, rotary positions, a digest of an
        encoder's rows), or None for a request whose prefix must not be
        shared (the Qwen3-Omni thinker's spoken requests where it keeps no
        rows for their talker, which reads them from the prefill). A model that
        defines it promises that its ``prefill`` computes positions from
        ``seq.cached`` on (the engine may have copied the ones before from
        another request's slot, :mod:`omni_core.engine.prefix_cache`) and
        writes every prompt position to the cache. With it, optionally,
        ``generated_rows(seq) -> Tensor | None``: the same rows for the
        generated positions the sequence fed back (``seq.cached`` less the
        prompt), so that a finished request's answer is shared too: the next
        turn of a conversation sends it back as part of its prompt. And
        ``prefix_copied(source, slot, length)``: the engine copied ``source``'s
        first ``length`` positions into ``slot``, for state a model keeps per
        slot beside the cache (the thinker's rows at media positions).

        And ``chunked_prefill(seq) -> bool`` (cheap: the event loop asks it
        at submit): whether ``seq``'s prompt may be prefilled over several
        steps. For such a sequence the backend may set ``seq.prefill_end``
        below the prompt's length; ``prefill`` then computes positions
        ``seq.cached .. prefill_end - 1`` only, writes them to the cache,
        advances ``seq.cached`` to ``prefill_end``, samples nothing and
        returns ``StepResult(None)``; the backend calls ``prefill`` again, a
        step later, from there. A long prompt then no longer stalls the
        running sequences for its whole prefill, and no prompt is refused
        for being longer than one step's ``max_prefill_tokens``.
        """
        ...
