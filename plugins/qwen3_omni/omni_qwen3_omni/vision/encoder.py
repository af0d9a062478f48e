"""Qwen3-Omni's vision tower (``thinker.visual``): patch rows in, thinker-width embeddings out.

Data flow for a batch of images (rows from :mod:`.processor`, concatenated):

1. patch embedding: a Conv3d whose kernel equals its stride
   (``temporal_patch_size`` x ``patch_size`` x ``patch_size``), i.e. one
   linear map per patch row. We keep the Conv3d parameter (so checkpoints
   load by name) but apply it as a matrix product on the flat rows, which is
   the same arithmetic without a 5-D reshape and a convolution call;
2. absolute positions: a learned ``side x side`` table
   (``side**2 == num_position_embeddings``) resampled bilinearly to each
   image's patch grid (sample points spread evenly from the first to the last
   table cell), then put in merge-block order like the rows;
3. ``depth`` pre-norm ViT blocks with 2-D rotary positions: a head's first
   half of rotary frequencies follows the patch row, the second the patch
   column. Attention never crosses an image, nor a temporal patch of one
   image: each ``h * w`` run of rows is its own sequence;
4. the merger: LayerNorm per patch, then each ``merge x merge`` block of rows
   (contiguous, thanks to the row order) is concatenated and sent through
   Linear -> GELU (erf) -> Linear to ``out_hidden_size``;
5. deepstack: after each block listed in ``deepstack_visual_indexes`` a
   separate merger (LayerNorm *after* concatenating the block) makes a
   feature of the same shape as the output; the thinker adds the k-th one to
   its hidden states at image positions after decoder layer k.

Module and parameter names are the release's (``thinker.visual.`` stripped),
so a checkpoint's tensors load with ``load_state_dict(strict=True)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ConfigError, VisionEncoderConfig

_LN_EPS = 1e-6
_ROPE_THETA = 10000.0

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
}


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions on ``x`` [n, heads, head_dim], in float32 like the release."""
    xf = x.float()
    half = xf.shape[-1] // 2
    turned = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos + turned * sin).to(x.dtype)


class VisionPatchEmbed(nn.Module):
    """``proj``: the Conv3d patch embedding, applied to flat patch rows."""

    def __init__(self, config: VisionEncoderConfig) -> None:
        super().__init__()
        kernel = (config.temporal_patch_size, config.patch_size, config.patch_size)
        self.proj = nn.Conv3d(
            config.in_channels, config.hidden_size, kernel_size=kernel, stride=kernel, bias=True
        )

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        weight = self.proj.weight
        # A row is (channel, frame, y, x) flattened: the Conv3d kernel's own order.
        return F.linear(rows.to(weight.dtype), weight.reshape(weight.shape[0], -1), self.proj.bias)


class VisionAttention(nn.Module):
    """``qkv`` / ``proj``: multi-head self-attention within each image (and temporal patch)."""

    def __init__(self, config: VisionEncoderConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=True)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size, bias=True)

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        segments: Sequence[int],
    ) -> torch.Tensor:
        n = hidden.shape[0]
        q, k, v = self.qkv(hidden).view(n, 3, self.num_heads, self.head_dim).unbind(1)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        # -> [heads, n, head_dim]
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
        out = _segmented_attention(q, k, v, segments)  # [heads, n, head_dim]
        return self.proj(out.transpose(0, 1).reshape(n, -1))


def _segmented_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: Sequence[int]
) -> torch.Tensor:
    """Attention of ``[heads, n, d]`` tensors where rows attend only inside their segment.

    One segment, or segments of one length (the common case: a batch of
    same-sized images), become a single batched call; otherwise each segment
    is attended on its own, which is what a block-diagonal mask computes
    without materialising an ``n x n`` mask.
    """
    heads, n, d = q.shape
    if len(segments) == 1:
        return F.scaled_dot_product_attention(q[None], k[None], v[None])[0]
    if len(set(segments)) == 1:
        count, length = len(segments), segments[0]

        def batched(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(heads, count, length, d).transpose(0, 1)

        out = F.scaled_dot_product_attention(batched(q), batched(k), batched(v))
        return out.transpose(0, 1).reshape(heads, n, d)
    parts = [
        F.scaled_dot_product_attention(qs[None], ks[None], vs[None])[0]
        for qs, ks, vs in zip(
            q.split(list(segments), dim=1),
            k.split(list(segments), dim=1),
            v.split(list(segments), dim=1),
            strict=True,
        )
    ]
    return torch.cat(parts, dim=1)


class VisionMLP(nn.Module):
    """``linear_fc1`` / ``linear_fc2`` with the config's activation between."""

    def __init__(self, config: VisionEncoderConfig) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(config.hidden_size, config.intermediate_size, bias=True)
        self.linear_fc2 = nn.Linear(config.intermediate_size, config.hidden_size, bias=True)
        self._act = _ACTIVATIONS[config.hidden_act]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(self._act(self.linear_fc1(hidden)))


class VisionBlock(nn.Module):
    """Pre-norm ViT block: ``norm1`` -> ``attn`` -> residual, ``norm2`` -> ``mlp`` -> residual."""

    def __init__(self, config: VisionEncoderConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.hidden_size, eps=_LN_EPS)
        self.norm2 = nn.LayerNorm(config.hidden_size, eps=_LN_EPS)
        self.attn = VisionAttention(config)
        self.mlp = VisionMLP(config)

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        segments: Sequence[int],
    ) -> torch.Tensor:
        hidden = hidden + self.attn(self.norm1(hidden), cos, sin, segments)
        return hidden + self.mlp(self.norm2(hidden))


class VisionPatchMerger(nn.Module):
    """``ln_q`` + ``mlp.{0,2}``: folds each merge block of patch rows into one embedding.

    The final merger normalises each patch (width ``hidden_size``) before
    concatenating; the deepstack mergers (``norm_after_merge``) normalise the
    concatenated block (width ``hidden_size * merge**2``). ``mlp.1`` is the
    exact (erf) GELU and holds no weights.
    """

    def __init__(self, config: VisionEncoderConfig, *, norm_after_merge: bool) -> None:
        super().__init__()
        self.width = config.hidden_size * config.spatial_merge_size**2
        self.norm_after_merge = norm_after_merge
        self.ln_q = nn.LayerNorm(
            self.width if norm_after_merge else config.hidden_size, eps=_LN_EPS
        )
        self.mlp = nn.Sequential(
            nn.Linear(self.width, self.width, bias=True),
            nn.GELU(),
            nn.Linear(self.width, config.out_hidden_size, bias=True),
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.norm_after_merge:
            merged = self.ln_q(hidden.reshape(-1, self.width))
        else:
            merged = self.ln_q(hidden).reshape(-1, self.width)
        return self.mlp(merged)


def _grid_list(grid_thw: torch.Tensor | Sequence[Sequence[int]]) -> list[tuple[int, int, int]]:
    rows = grid_thw.tolist() if isinstance(grid_thw, torch.Tensor) else list(grid_thw)
    grid = [tuple(int(v) for v in row) for row in rows]
    if not grid or any(len(row) != 3 for row in grid):
        raise ValueError("grid_thw must be a non-empty [num_images, 3] list of (t, h, w)")
    return grid  # type: ignore[return-value]


class VisionEncoder(nn.Module):
    """The vision tower: ``forward(pixel_values, grid_thw) -> (embeds, deepstack)``."""

    def __init__(self, config: VisionEncoderConfig) -> None:
        super().__init__()
        config.validate()
        if config.hidden_act not in _ACTIVATIONS:
            raise ConfigError(
                f"thinker_config.vision_config.hidden_act {config.hidden_act!r} is not "
                f"supported (one of {sorted(_ACTIVATIONS)})"
            )
        self.config = config
        self.merge = config.spatial_merge_size
        self.side = math.isqrt(config.num_position_embeddings)
        self.patch_embed = VisionPatchEmbed(config)
        self.pos_embed = nn.Embedding(config.num_position_embeddings, config.hidden_size)
        self.blocks = nn.ModuleList(VisionBlock(config) for _ in range(config.depth))
        self.merger = VisionPatchMerger(config, norm_after_merge=False)
        self.merger_list = nn.ModuleList(
            VisionPatchMerger(config, norm_after_merge=True)
            for _ in config.deepstack_visual_indexes
        )

    @property
    def row_width(self) -> int:
        """Values per patch row: ``in_channels * temporal_patch_size * patch_size**2``."""
        c = self.config
        return c.in_channels * c.temporal_patch_size * c.patch_size**2

    def forward(
        self,
        pixel_values: torch.Tensor,
        grid_thw: torch.Tensor | Sequence[Sequence[int]],
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Encode the concatenated patch rows of one or more images.

        ``pixel_values`` is ``[sum(t*h*w), C*T*P*P]`` (each image's rows from
        the processor, in ``grid_thw`` order); ``grid_thw`` is ``[num_images,
        3]``. Returns ``embeds`` ``[sum(t*h*w) / merge**2, out_hidden_size]``
        (image after image, in the same order) and one tensor of that shape
        per deepstack block, in ascending block order (the release lists its
        indexes ascending, so the k-th tensor belongs to ``deepstack_visual_indexes[k]``).
        """
        grid = _grid_list(grid_thw)
        self._check_inputs(pixel_values, grid)
        hidden = self.patch_embed(pixel_values)
        hidden = hidden + self._absolute_positions(grid, hidden.dtype, hidden.device)
        cos, sin = self._rotary(grid, hidden.device)
        segments = [h * w for t, h, w in grid for _ in range(t)]

        taps = {
            layer: k for k, layer in reversed(list(enumerate(self.config.deepstack_visual_indexes)))
        }
        deepstack: list[torch.Tensor] = []
        for layer, block in enumerate(self.blocks):
            hidden = block(hidden, cos, sin, segments)
            if layer in taps:
                deepstack.append(self.merger_list[taps[layer]](hidden))
        return self.merger(hidden), deepstack

    def _check_inputs(self, pixel_values: torch.Tensor, grid: list[tuple[int, int, int]]) -> None:
        if pixel_values.dim() != 2 or pixel_values.shape[1] != self.row_width:
            raise ValueError(
                f"pixel_values must be [rows, {self.row_width}], got {tuple(pixel_values.shape)}"
            )
        for t, h, w in grid:
            if t <= 0 or h <= 0 or w <= 0 or h % self.merge or w % self.merge:
                raise ValueError(
                    f"grid ({t}, {h}, {w}) must be positive with h and w multiples of "
                    f"spatial_merge_size ({self.merge})"
                )
        total = sum(t * h * w for t, h, w in grid)
        if total != pixel_values.shape[0]:
            raise ValueError(
                f"grid_thw describes {total} patch rows but pixel_values has "
                f"{pixel_values.shape[0]}"
            )

    def _merge_order(self, table: torch.Tensor, h: int, w: int) -> torch.Tensor:
        """Reorder a row-major ``[h*w, ...]`` table so each merge block is contiguous."""
        m = self.merge
        tail = table.shape[1:]
        blocks = table.reshape(h // m, m, w // m, m, *tail).transpose(1, 2)
        return blocks.reshape(h * w, *tail)

    def _absolute_positions(
        self, grid: list[tuple[int, int, int]], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """The learned position table, bilinearly resampled to each grid, one row per patch."""
        side = self.side
        indices, weights, sizes = [], [], []
        for _, h, w in grid:
            # Sample points in table cells; computed in float32 on the CPU, as the release does.
            ys = torch.linspace(0, side - 1, h)
            xs = torch.linspace(0, side - 1, w)
            y0, x0 = ys.int(), xs.int()
            y1, x1 = (y0 + 1).clamp(max=side - 1), (x0 + 1).clamp(max=side - 1)
            fy, fx = ys - y0, xs - x0
            corners = ((y0, x0), (y0, x1), (y1, x0), (y1, x1))
            indices.append(
                torch.stack([(yy[:, None] * side + xx[None, :]).flatten() for yy, xx in corners])
            )
            gy, gx = 1 - fy, 1 - fx
            weights.append(
                torch.stack(
                    [
                        (gy[:, None] * gx[None, :]).flatten(),
                        (gy[:, None] * fx[None, :]).flatten(),
                        (fy[:, None] * gx[None, :]).flatten(),
                        (fy[:, None] * fx[None, :]).flatten(),
                    ]
                )
            )
            sizes.append(h * w)
        index = torch.cat(indices, dim=1).long().to(device)
        weight = torch.cat(weights, dim=1).to(device=device, dtype=self.pos_embed.weight.dtype)
        corner = self.pos_embed(index) * weight[:, :, None]  # [4, sum(h*w), hidden]
        mixed = corner[0] + corner[1] + corner[2] + corner[3]
        pieces = []
        for (t, h, w), part in zip(grid, mixed.split(sizes), strict=True):
            pieces.append(self._merge_order(part, h, w).repeat(t, 1))
        return torch.cat(pieces).to(dtype)

    def _rotary(
        self, grid: list[tuple[int, int, int]], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[rows, 1, head_dim]`` (float32) of each patch's (row, column) in its image."""
        # Each axis gets head_dim/4 frequencies; row and column together fill head_dim/2,
        # which is then repeated for the two halves that rotate together.
        rot_dim = self.config.head_dim // 2
        steps = torch.arange(0, rot_dim, 2, dtype=torch.float32, device=device)
        inv_freq = 1.0 / (_ROPE_THETA ** (steps / rot_dim))
        longest = max(max(h, w) for _, h, w in grid)
        table = torch.outer(torch.arange(longest, dtype=torch.float32, device=device), inv_freq)
        coords = []
        for t, h, w in grid:
            ys = torch.arange(h, device=device)[:, None].expand(h, w).reshape(-1, 1)
            xs = torch.arange(w, device=device)[None, :].expand(h, w).reshape(-1, 1)
            yx = self._merge_order(torch.cat([ys, xs], dim=1), h, w)
            coords.append(yx.repeat(t, 1))
        yx = torch.cat(coords)
        freqs = table[yx].flatten(1)  # [rows, head_dim/2]: row frequencies, then column ones
        angles = torch.cat([freqs, freqs], dim=-1)[:, None, :]
        return angles.cos(), angles.sin()
