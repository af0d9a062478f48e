"""Batched token selection with per-row sampling settings and generators.

One function, :func:`select_tokens`, used by both talkers' codebook-0 step and
by the code predictor's 15 steps a frame. It applies the logits processors in
the order the release's generation loop (transformers ``generate``) applies
them: repetition penalty, the minimum-length EOS ban, suppressed ids, then --
only when sampling -- temperature, top-k (ties with the k-th kept) and top-p
(the least likely tokens whose mass stays under ``1 - top_p`` removed), and a
draw by inverse CDF from one uniform number of each row's own generator, so a
request samples the same codes alone or in a batch.

Why batched, with no host round trip: on a GPU the step used to loop over
rows, about 15 small kernels each, and a seeded row's generator lived on the
CPU, so every draw copied its probabilities to the host (a device sync per
row, 16 a frame): the GPU check measured Qwen3-TTS at 28 ms a frame at
concurrency 1, mostly waiting. Now a call is a fixed handful of batched
kernels whatever the batch, the per-row settings go to the device once per
batch (cached), and nothing waits for the device.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from omni_core.engine.sampling import to_device


@dataclass(frozen=True)
class RowSampling:
    """How one row picks its token. ``greedy`` ignores temperature/top-k/top-p."""

    greedy: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0

    @classmethod
    def of(cls, params: Any) -> RowSampling:
        """A request's ``SamplingParams`` as one row's rule (no temperature, or 0: greedy)."""
        return cls(
            greedy=params.temperature is None or params.temperature <= 0,
            temperature=params.temperature or 1.0,
            top_k=params.top_k,
            top_p=params.top_p,
            repetition_penalty=params.repetition_penalty,
        )

    @property
    def draws(self) -> bool:
        """Whether this row draws a random number (it is not greedy)."""
        return not (self.greedy or self.temperature <= 0)


@dataclass(frozen=True)
class RowSettings:
    """A batch's per-row settings on the device, built once per distinct batch."""

    greedy: torch.Tensor  # [B] bool
    temperature: torch.Tensor  # [B, 1]
    top_p: torch.Tensor  # [B, 1]
    kth: torch.Tensor  # [B, 1] long: each row's top-k - 1 (the vocabulary's last id: none)
    widest: int  # the largest top-k asked for (0: no row filters by top-k)
    nucleus: bool  # some row has top_p < 1


def frame_settings(
    rows: tuple[RowSampling, ...], total: int, vocab: int, device: torch.device
) -> RowSettings:
    """``rows``' settings on the device, padded with greedy rows up to ``total`` rows.

    A captured code-predictor frame (:mod:`.code_predictor`) runs a whole
    batch bucket; its padding rows pick greedily and are dropped. Cached
    apart in and out of inference mode: a compiled frame's graphs were traced
    with inference tensors and guard on it (a plain tensor would miss every
    graph), while an inference tensor cannot take part in autograd.
    """
    return _settings_table(rows, total, vocab, device, torch.is_inference_mode_enabled())


@functools.lru_cache(maxsize=64)
def _settings_table(
    rows: tuple[RowSampling, ...], total: int, vocab: int, device: torch.device, inference: bool
) -> RowSettings:
    padded = rows + (RowSampling(greedy=True),) * (total - len(rows))
    ks = [min(r.top_k, vocab) if r.draws and r.top_k > 0 else vocab for r in padded]
    table = torch.tensor(
        [
            [float(not r.draws), r.temperature if r.draws else 1.0, r.top_p, float(k - 1)]
            for r, k in zip(padded, ks, strict=True)
        ],
        dtype=torch.float32,
    )
    table = to_device(table, device)
    return RowSettings(
        greedy=table[:, 0] > 0,
        temperature=table[:, 1:2],
        top_p=table[:, 2:3],
        kth=table[:, 3:4].long(),
        widest=max((k for k in ks if k < vocab), default=0),
        nucleus=any(r.draws and r.top_p < 1.0 for r in padded),
    )


def _pairs(
    per_row: list[torch.Tensor | None], keep: list[bool], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(row, id) index pairs of each kept row's ids, on ``device``, in one copy."""
    rows, ids = [], []
    for b, (tensor, wanted) in enumerate(zip(per_row, keep, strict=True)):
        if wanted and tensor is not None and tensor.numel():
            flat = tensor.flatten().long()
            ids.append(flat)
            rows.append(torch.full((flat.numel(),), b, dtype=torch.long, device=flat.device))
    if not ids:
        return None
    if all(t.device == device for t in ids):
        return torch.cat(rows), torch.cat(ids)
    host = torch.stack([torch.cat(rows).cpu(), torch.cat([t.cpu() for t in ids])])
    host = to_device(host, device)
    return host[0], host[1]


def _uniforms(
    generators: list[torch.Generator | None], draws: list[bool], device: torch.device
) -> torch.Tensor:
    """One uniform number per row: from the row's own generator where it has one."""
    return frame_uniforms(generators, draws, 1, device)[:, 0]


def frame_uniforms(
    generators: list[torch.Generator | None], draws: list[bool], count: int, device: torch.device
) -> torch.Tensor:
    """``count`` uniform numbers per row ``[B, count]``: from the row's own generator where it
    has one, zeros for a row that does not draw.

    A code-predictor frame draws its 15 picks' numbers at once, before the
    first pick: one draw per row and frame instead of one per row and pick,
    and a frame captured as a CUDA graph takes them as an input (a graph
    cannot hold a request's generator).
    """
    parts = []
    for g, wanted in zip(generators, draws, strict=True):
        if not wanted:
            parts.append(torch.zeros(count, device=device))
        elif g is None:
            parts.append(torch.rand(count, device=device))
        elif g.device == device:
            parts.append(torch.rand(count, generator=g, device=device))
        else:  # a host generator for a device batch: draw there, copy without waiting
            parts.append(to_device(torch.rand(count, generator=g, device=g.device), device))
    return torch.stack(parts)


def select_tokens(
    logits: torch.Tensor,
    rows: list[RowSampling],
    generators: list[torch.Generator | None],
    histories: list[torch.Tensor | None] | None = None,
    banned: list[torch.Tensor | None] | None = None,
    uniforms: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pick one token per row of ``logits`` ``[B, V]``; returns int64 ``[B]`` on their device.

    ``histories[b]``: ids already generated by row b (repetition penalty).
    ``banned[b]``: ids row b may not pick this step (suppressed ids, EOS
    before the minimum length). ``uniforms`` ``[B]``: each row's number for
    this pick, drawn beforehand (:func:`frame_uniforms`); without it each
    drawing row draws one from its generator now.
    """
    batch, vocab = logits.shape
    device = logits.device
    scores = logits.float().clone()
    if histories is not None:
        penalised = _pairs(histories, [r.repetition_penalty != 1.0 for r in rows], device)
        if penalised is not None:
            factor = to_device(torch.tensor([r.repetition_penalty for r in rows]), device)
            at, ids = penalised
            picked, by = scores[at, ids], factor[at]
            scores[at, ids] = torch.where(picked < 0, picked * by, picked / by)
    if banned is not None:
        pairs = _pairs(banned, [True] * batch, device)
        if pairs is not None:
            # a device value: a Python scalar would be copied from pageable host memory
            # (a wait for the device, which the GPU check's no-wait test catches)
            scores.index_put_(pairs, torch.full((), float("-inf"), device=device))
    draws = [r.draws for r in rows]
    if not any(draws):
        return scores.argmax(-1)
    settings = frame_settings(tuple(rows), batch, vocab, device)
    if uniforms is None:
        uniforms = _uniforms(generators, draws, device)
    return draw_tokens(scores, settings, uniforms, greedy_rows=not all(draws))


def draw_tokens(
    scores: torch.Tensor,
    settings: RowSettings,
    uniforms: torch.Tensor,
    *,
    widest: int | None = None,
    nucleus: bool | None = None,
    greedy_rows: bool = True,
) -> torch.Tensor:
    """Temperature, top-k, top-p and an inverse-CDF draw for float32 ``scores`` ``[B, V]``.

    Every operation has a fixed shape and none reads the device, so a CUDA
    graph can hold it. ``widest`` (default: the settings' largest top-k) and
    ``nucleus`` (default: whether a row has top-p below 1) may be widened to
    the whole vocabulary and True without changing a pick: the k-th largest
    score is the same in a longer sorted list, and top-p 1 removes only
    tokens whose probability is already 0. A captured frame widens them, so
    that one graph serves every batch's settings. ``greedy_rows=False``
    promises that no row is greedy (skips the argmax).
    """
    widest = settings.widest if widest is None else widest
    nucleus = settings.nucleus if nucleus is None else nucleus
    vocab = scores.shape[-1]
    best = scores.argmax(-1) if greedy_rows else None
    scores = scores / settings.temperature
    if widest:
        top = torch.topk(scores, widest, dim=-1).values
        kth = top.gather(1, settings.kth.clamp(max=widest - 1))
        kth = kth.masked_fill(settings.kth >= vocab - 1, float("-inf"))
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if nucleus:
        ascending, order = torch.sort(scores, dim=-1)
        mass = ascending.softmax(-1).cumsum(-1)
        remove = mass <= 1 - settings.top_p
        remove[:, -1].fill_(False)
        scores = scores.masked_fill(remove.scatter(1, order, remove), float("-inf"))
    cdf = scores.softmax(-1).cumsum(-1)
    target = uniforms.unsqueeze(1) * cdf[:, -1:]
    drawn = torch.searchsorted(cdf, target, right=True).squeeze(1).clamp_(max=vocab - 1)
    return drawn if best is None else torch.where(settings.greedy, best, drawn)
