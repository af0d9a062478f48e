"""Building blocks shared by the talker, the code predictor and the codec transformers.

Attention is written once and reads/writes keys and values through a small
:class:`KVStore` protocol, so the same layer runs over the engine's slot cache
(talker, batched continuous decoding), a per-frame scratch cache (code
predictor) or no cache at all (codec transformers, which see whole chunks).
Parameter names mirror the release's module tree so that checkpoint tensors
map onto ``state_dict`` keys one to one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from omni_core.engine.cpu_attention import attention
from omni_core.engine.fused_linear import project
from omni_core.engine.layer_regions import call_layer

from .config import TransformerConfig


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32 (as the release does), scaled by ``weight``.

    The release normalises in float32, rounds once to the activations' dtype,
    then multiplies by the weight in that dtype. ``F.rms_norm`` without a
    weight is that first part in one call: it accumulates in float32 and
    rounds once, equal bit for bit to the spelled-out float32 ops on the CPU
    in float32 and bfloat16 (``plugins/qwen3_tts/tests/test_layers.py``), a third faster
    there, and one CUDA kernel where the spelled-out form launched seven (the
    GPU check's profile: a Qwen3-TTS frame's 400-odd norms were most of its
    ~5000 small kernels).
    """

    def __init__(self, size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * F.rms_norm(x, (x.shape[-1],), eps=self.eps)


def inv_frequencies(
    head_dim: int, theta: float, device: torch.device | None = None
) -> torch.Tensor:
    """Default RoPE inverse frequencies, ``theta ** (-2i / head_dim)`` for i < head_dim/2."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    return 1.0 / (theta**exponents)


def register_rope(module: nn.Module, head_dim: int, theta: float) -> None:
    """Give ``module`` its rotary table ``inv_freq`` and the ``rope_spec`` that rebuilds it.

    The table is a non-persistent buffer (checkpoints do not carry it), so
    ``to_empty`` leaves it uninitialised; ``weights.reset_rope_buffers``
    recomputes it from ``rope_spec``. Setting both here keeps them in step.
    """
    module.rope_spec = (head_dim, theta)
    # Computed on the CPU, then moved to the device the model is being built on: on the
    # meta device (build_empty) the division runs through torch's Python reference
    # kernels, whose first call imports dynamo (1.1 s of CPU in a stage process).
    table = inv_frequencies(head_dim, theta, device=torch.device("cpu"))
    module.register_buffer("inv_freq", table.to(torch.get_default_device()), persistent=False)


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables ``[B, T, head_dim]`` for integer positions ``[B, T]`` (half-split layout)."""
    freqs = positions.float()[..., None] * inv_freq.float()
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def mrope_cos_sin(
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    section: tuple[int, ...],
    interleaved: bool,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Multimodal RoPE: positions ``[3, B, T]`` (temporal, height, width) -> ``[B, T, head_dim]``.

    Each frequency index takes its angle from one of the three position
    streams. Interleaved (the Qwen3 layout): index ``j`` uses stream 1 if
    ``j % 3 == 1`` and ``j < 3*section[1]``, stream 2 if ``j % 3 == 2`` and
    ``j < 3*section[2]``, else stream 0. Otherwise contiguous blocks of
    ``section`` sizes use streams 0, 1, 2 in turn. For speech all three
    streams are equal and this reduces to plain RoPE; we keep the general form
    so a future caller with distinct streams gets the release's behaviour.
    """
    half = inv_freq.shape[0]
    freqs = positions.float()[..., None] * inv_freq.float()  # [3, B, T, half]
    stream = _mrope_streams(half, tuple(section), interleaved, freqs.device)
    picked = freqs.gather(0, stream.view(1, 1, 1, half).expand(1, *freqs.shape[1:]))[0]
    emb = torch.cat((picked, picked), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


_STREAMS: dict[tuple[int, tuple[int, ...], bool, torch.device], torch.Tensor] = {}


def _mrope_streams(
    half: int, section: tuple[int, ...], interleaved: bool, device: torch.device
) -> torch.Tensor:
    """Which position stream each frequency index reads (see :func:`mrope_cos_sin`).

    Computed from Python ints and kept per device: no data-dependent indexing
    and no host-to-device copy inside a step, so a compiled step stays one
    graph and a CUDA graph can capture it.
    """
    key = (half, section, interleaved, device)
    table = _STREAMS.get(key)
    if table is None:
        streams = [0] * half
        if interleaved:
            for s in (1, 2):
                for j in range(s, section[s] * 3, 3):
                    if j < half:
                        streams[j] = s
        else:
            start = 0
            for s, size in enumerate(section):
                for j in range(start, min(start + size, half)):
                    streams[j] = s % 3
                start += size
        table = _STREAMS[key] = torch.tensor(streams, dtype=torch.long, device=device)
    return table


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[B, heads, T, D]`` by tables ``[B, T, D]``."""
    cos, sin = cos[:, None], sin[:, None]
    return x * cos + rotate_half(x) * sin


def rope_both(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`apply_rope` on queries and keys ``[B, heads, T, D]`` as one tensor.

    The same element-wise ops on the same values (so the same bits), launched
    once instead of twice: five kernels a layer fewer on a GPU, where a
    decode step's layers are hundreds of kernels of a few microseconds each.
    """
    both = apply_rope(torch.cat((q, k), dim=1), cos, sin)
    return both[:, : q.shape[1]], both[:, q.shape[1] :]


class KVStore(Protocol):
    """Where an attention layer keeps keys/values: returns all keys/values to attend to."""

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``: the Qwen3 MLP."""

    #: read one input: one product once fused (``omni_core.engine.fused_linear``)
    sibling_projections = (("gate_proj", "up_proj"),)
    #: one blocked product too where weights are blocked for oneDNN (28 layers at hidden
    #: size 1024, one row: 20.9 -> 19.6 ms; ``omni_core.engine.cpu_linear.BlockedRows``)
    blocked_siblings = sibling_projections

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = project(x, self.gate_proj, self.up_proj)
        return self.down_proj(F.silu(gate) * up)


class Attention(nn.Module):
    """Grouped-query attention with optional per-head q/k RMS norm and rotary positions."""

    sibling_projections = (("q_proj", "k_proj", "v_proj"),)
    #: one blocked product too where weights are blocked for oneDNN: the small k/v
    #: read faster inside it (``omni_core.engine.cpu_linear.BlockedRows``)
    blocked_siblings = sibling_projections

    def __init__(
        self,
        hidden: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        layer: int,
        bias: bool = False,
        qk_norm_eps: float | None = 1e-6,
    ):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.layer = heads, kv_heads, head_dim, layer
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=bias)
        self.q_norm: nn.Module = nn.Identity()
        self.k_norm: nn.Module = nn.Identity()
        if qk_norm_eps is not None:
            self.q_norm = RMSNorm(head_dim, qk_norm_eps)
            self.k_norm = RMSNorm(head_dim, qk_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        store: KVStore | None = None,
    ) -> torch.Tensor:
        """``x`` ``[B, T, hidden]``; ``mask`` boolean ``[B, 1, T, S]`` (True = attend)."""
        batch, steps, _ = x.shape
        q, k, v = project(x, self.q_proj, self.k_proj, self.v_proj)
        q = self.q_norm(q.view(batch, steps, self.heads, self.head_dim))
        k = self.k_norm(k.view(batch, steps, self.kv_heads, self.head_dim))
        v = v.view(batch, steps, self.kv_heads, self.head_dim)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = rope_both(q, k, cos, sin)
        if store is not None:
            k, v = store.update(self.layer, k, v)
        # Grouped heads read their shared keys/values in place: bit-for-bit what
        # repeating them per head gave (checked in float32 and bf16), without the
        # copy, which a compiled step makes of its whole cache capacity at every layer.
        # A bf16 decode step on the CPU takes two batched products instead
        # (cpu_attention), unless OMNI_CPU_ATTENTION=fused asks for the references'
        # kernel (bit-equality with them).
        out = attention(q, k, v, mask)
        return self.o_proj(out.transpose(1, 2).reshape(batch, steps, -1))


class DecoderLayer(nn.Module):
    """Pre-norm Qwen3 block: attention then SwiGLU, each with a residual.

    ``mlp`` replaces the SwiGLU with another feed-forward block of the same
    contract (``[..., hidden] -> [..., hidden]``): Qwen3-Omni's talker uses
    this layer with a mixture of experts there.
    """

    def __init__(self, cfg: TransformerConfig, layer: int, mlp: nn.Module | None = None):
        super().__init__()
        self.self_attn = Attention(
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            layer,
            bias=cfg.attention_bias,
            qk_norm_eps=cfg.rms_norm_eps,
        )
        self.mlp = mlp if mlp is not None else SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        store: KVStore | None,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, store)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderStack(nn.Module):
    """Decoder layers, the final norm and the rotary table: the stack every Qwen3-style
    decoder here is (the talkers', the code predictor's, MOSS-TTS's backbone), under the
    release's names (``layers.N``, ``norm``). A subclass adds its embeddings and heads;
    one whose positions are not plain rotary ones overrides :meth:`rotary`."""

    def __init__(self, t: Any, layers: Iterable[nn.Module] | None = None):
        super().__init__()
        if layers is None:
            layers = (DecoderLayer(t, i) for i in range(t.num_hidden_layers))
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(t.hidden_size, t.rms_norm_eps)
        register_rope(self, t.head_dim, t.rope_theta)

    def rotary(self, positions: torch.Tensor, dtype: torch.dtype) -> Any:
        """cos/sin for integer ``positions`` ``[B, T]`` (plain RoPE)."""
        return rope_cos_sin(positions, self.inv_freq, dtype)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None,
        store: Any,
    ) -> torch.Tensor:
        """Embeddings ``[B, T, H]`` at ``positions`` -> normed hidden states."""
        cos, sin = self.rotary(positions, x.dtype)
        return self.run_layers(x, cos, sin, mask, store)

    def run_layers(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        store: Any,
    ) -> torch.Tensor:
        """Rows ``x`` ``[B, T, H]`` through every layer, then the final norm.

        Through :func:`~omni_core.engine.layer_regions.call_layer`: a compiled
        static step builds one layer and runs it as every layer.
        """
        for layer in self.layers:
            x = call_layer(layer, layer.self_attn.layer, x, cos, sin, mask, store=store)
        return self.norm(x)


def causal_mask(
    starts: torch.Tensor, lengths: torch.Tensor, steps: int, total: int
) -> torch.Tensor:
    """Boolean ``[B, 1, steps, total]``: row b's query i (at ``starts[b]+i``) sees keys up to it.

    Keys at or beyond ``starts[b] + lengths[b]`` (right padding, stale cache
    content) are hidden. A padded query row still sees key 0 so that softmax
    never runs over an empty set; its output is discarded by the caller.
    """
    device = starts.device
    query_pos = starts[:, None] + torch.arange(steps, device=device)[None, :]  # [B, T]
    key_pos = torch.arange(total, device=device)
    valid_end = (starts + lengths)[:, None, None]
    mask = (key_pos[None, None, :] <= query_pos[:, :, None]) & (key_pos[None, None, :] < valid_end)
    mask[:, :, 0] = True
    return mask[:, None]
