"""The tokenizer's causal transformer stage: project in, pre-norm layers, project out.

A stage runs at one rate (12.5 to 100 steps per second in the release) over
``[B, C, T]`` signals, like the patch folds around it. Each layer is
LayerNorm -> windowed attention -> scaled residual, then LayerNorm ->
``linear2(gelu(linear1(.)))`` -> scaled residual; there is no final norm.
Projections are bias-free and absent (``Identity``) when the widths agree,
so the module tree and its state-dict names are the checkpoint's.

The same code serves a one-pass encode/decode and a stream: :meth:`run`
takes each row's absolute start position and, per layer, the keys/values
carried from earlier steps, and can hand back what the next chunk needs
(the newest ``window - 1`` positions at most; fewer while the stream is
younger than that).
"""

from __future__ import annotations

import torch
from torch import nn

from omni_core.engine.cpu_linear import linear_gelu
from omni_qwen3_tts.speech_tokenizer.decoder import LayerScale

from .attention import Rotation, WindowedAttention, rope_tables, window_mask
from .config import TransformerSpec

KV = tuple[torch.Tensor, torch.Tensor]


class TransformerLayer(nn.Module):
    def __init__(self, spec: TransformerSpec):
        super().__init__()
        d = spec.d_model
        self.self_attn = WindowedAttention(d, spec.num_heads)
        self.norm1 = nn.LayerNorm(d, eps=1e-5)
        self.norm2 = nn.LayerNorm(d, eps=1e-5)
        self.linear1 = nn.Linear(d, spec.dim_feedforward, bias=False)
        self.linear2 = nn.Linear(spec.dim_feedforward, d, bias=False)
        if spec.layer_scale is None:
            self.layer_scale_1: nn.Module = nn.Identity()
            self.layer_scale_2: nn.Module = nn.Identity()
        else:
            self.layer_scale_1 = LayerScale(d, spec.layer_scale)
            self.layer_scale_2 = LayerScale(d, spec.layer_scale)

    def forward(
        self,
        x: torch.Tensor,
        rope: Rotation,
        mask: torch.Tensor,
        past: KV | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        update, keys, values = self.self_attn(self.norm1(x), rope, mask, past)
        x = x + self.layer_scale_1(update)
        update = self.linear2(linear_gelu(self.linear1, self.norm2(x)))
        return x + self.layer_scale_2(update), keys, values


class Transformer(nn.Module):
    """The layer stack (``transformer.layers.N`` in the checkpoint)."""

    def __init__(self, spec: TransformerSpec):
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(spec) for _ in range(spec.num_layers))


class ProjectedTransformer(nn.Module):
    """One transformer stage on ``[B, C, T]`` signals."""

    def __init__(self, spec: TransformerSpec, exact_rotation: bool = True):
        super().__init__()
        self.spec = spec
        self.window = spec.context
        self.exact_rotation = exact_rotation
        self.input_proj: nn.Module = (
            nn.Linear(spec.input_dimension, spec.d_model, bias=False)
            if spec.input_dimension != spec.d_model
            else nn.Identity()
        )
        self.transformer = Transformer(spec)
        self.output_proj: nn.Module = (
            nn.Linear(spec.d_model, spec.output_dimension, bias=False)
            if spec.output_dimension != spec.d_model
            else nn.Identity()
        )

    @property
    def num_layers(self) -> int:
        return len(self.transformer.layers)

    def kv_shape(self) -> tuple[int, int]:
        """(heads, head_dim) of the keys/values each layer carries."""
        return self.spec.num_heads, self.spec.head_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """A whole signal from its first step: ``[B, C_in, T] -> [B, C_out, T]``."""
        start = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        return self.run(x, start, None)[0]

    def run(
        self,
        x: torch.Tensor,
        start: torch.Tensor,
        past: list[KV] | None,
        in_place: bool = False,
    ) -> tuple[torch.Tensor, list[KV] | None]:
        """Steps of ``x`` ``[B, C_in, T]`` at positions ``start[b] + t``.

        ``past``: per layer, the keys/values of the positions just before
        ``start`` (all layers equally long), or ``None`` for a signal that
        starts at ``start`` and whose keys need not be kept. Returns the
        output and, when ``past`` was given, the keys/values to carry on.

        ``in_place``: ``past`` holds a full window (``window - 1`` positions,
        the captured chunks' fixed shape, ``graphs.py``) and the window to
        carry on is written into those very tensors, which are returned: a
        CUDA graph reads and writes fixed addresses. Each layer's own keys are
        a new tensor (``past`` joined with the chunk's), so overwriting its
        ``past`` once the layer has run changes nothing it computed.
        """
        t = x.shape[-1]
        held = past[0][0].shape[2] if past else 0
        h = self.input_proj(x.transpose(1, 2))
        rope = Rotation(
            *rope_tables(start, t, self.spec.head_dim, self.spec.max_period),
            exact=self.exact_rotation,
        )
        mask = window_mask(start, held, t, self.window)
        keep = min(self.window - 1, held + t)
        if in_place and (past is None or held != self.window - 1):
            raise ValueError(
                f"an in-place step needs a full window of {self.window - 1} positions, got {held}"
            )
        carried: list[KV] | None = None if past is None else []
        for i, layer in enumerate(self.transformer.layers):
            h, keys, values = layer(h, rope, mask, past[i] if past else None)
            if carried is None:
                continue
            first = keys.shape[2] - keep
            if in_place:
                assert past is not None
                past[i][0].copy_(keys[:, :, first:])
                past[i][1].copy_(values[:, :, first:])
                carried.append(past[i])
            else:
                carried.append((keys[:, :, first:].contiguous(), values[:, :, first:].contiguous()))
        return self.output_proj(h).transpose(1, 2), carried
