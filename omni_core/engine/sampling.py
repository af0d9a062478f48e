"""Batched next-token sampling with per-row parameters and per-row random generators.

A batch mixes requests with different temperatures, top-k, top-p, repetition
penalties and seeds. Every row is filtered by its own parameters and draws its
random number from its own ``torch.Generator``, and the path a row takes
(greedy, plain, or sorted for top-k/top-p) depends only on that row's
parameters. So a seeded request samples the same token whether it runs alone
or batched with others: continuous batching does not change what a user gets.

Order of the transformations (Hugging Face's): repetition penalty on the raw
logits, temperature, top-k, top-p, then one draw by inverse CDF.

On a GPU nothing here reads the device from the host: per-row settings and
row indices go over as one pinned, asynchronous copy each, and the top-k
shortcut's tie check (a host read) is the CPU's alone; a GPU sorts whole
rows in microseconds. The caller reads the chosen ids once, after the step.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence as Seq
from typing import Any

import torch

from .interface import SamplingParams, Sequence


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator on ``device`` seeded with ``seed`` (a random seed when None)."""
    generator = torch.Generator(device=torch.device(device))
    generator.manual_seed(seed if seed is not None else secrets.randbits(63))
    return generator


def to_device(values: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A small host tensor on ``device`` without waiting for the device (pinned, async).

    A plain ``torch.tensor(list, device="cuda")`` copies from pageable memory,
    which waits for everything queued on the stream first.
    """
    device = torch.device(device)
    if values.device == device:
        return values
    if device.type == "cuda" and values.device.type == "cpu":
        values = values.pin_memory()
    return values.to(device, non_blocking=True)


def from_host(
    values: Seq[Any], device: torch.device | str, dtype: torch.dtype = torch.long
) -> torch.Tensor:
    """``torch.tensor(values, dtype=dtype)`` on ``device``, copied without a wait.

    A step's small host-side lists (slots, cache starts, positions, row
    indices) go to the GPU this way: ``torch.tensor(list, device="cuda")``
    waits for the whole queue each time (the GPU check counted 14.6 such
    waits a Qwen3-TTS engine step), so the host can never run ahead of the
    device.
    """
    return to_device(torch.tensor(values, dtype=dtype), device)


def apply_repetition_penalty(
    logits: torch.Tensor, penalties: Seq[float], previous: Seq[Seq[int] | torch.Tensor]
) -> torch.Tensor:
    """Penalise, in place, each row's previously generated ids (CTRL-style).

    A positive logit is divided by the penalty, a negative one multiplied, so a
    penalty > 1 always makes a repeat less likely. Repeated ids count once.
    """
    device = logits.device
    rows, ids = [], []
    for row, (penalty, tokens) in enumerate(zip(penalties, previous, strict=True)):
        if penalty == 1.0 or len(tokens) == 0:
            continue
        tokens = torch.as_tensor(tokens, dtype=torch.long).flatten()
        rows.append(torch.full((tokens.numel(),), row, dtype=torch.long, device=tokens.device))
        ids.append(tokens)
    if not rows:
        return logits
    if all(t.device == device for t in ids):
        at, which = torch.cat(rows), torch.cat(ids)
    else:  # host lists (or a mix): one copy for the batch
        pairs = to_device(
            torch.stack([torch.cat([r.cpu() for r in rows]), torch.cat([t.cpu() for t in ids])]),
            device,
        )
        at, which = pairs[0], pairs[1]
    seen = torch.zeros_like(logits, dtype=torch.bool)
    # not ``seen[at, which] = True``: a Python scalar is copied over from pageable host
    # memory, which waits for the device (caught by the GPU check's no-wait test)
    seen.index_put_((at, which), torch.ones((), dtype=torch.bool, device=device))
    factor = to_device(torch.tensor(penalties, dtype=logits.dtype), device).unsqueeze(1)
    penalised = torch.where(logits > 0, logits / factor, logits * factor)
    return logits.copy_(torch.where(seen, penalised, logits))


def _draw(weights: torch.Tensor, generators: Seq[torch.Generator | None]) -> torch.Tensor:
    """One index per row of non-negative ``weights`` [R, N], by inverse CDF."""
    cdf = weights.cumsum(-1)
    uniform = uniforms(generators, weights.device).to(dtype=cdf.dtype)
    target = (uniform * cdf[:, -1]).unsqueeze(1)
    index = torch.searchsorted(cdf, target, right=True).squeeze(1)
    return index.clamp_(max=weights.shape[-1] - 1)


def uniforms(generators: Seq[torch.Generator | None], device: torch.device) -> torch.Tensor:
    """One uniform number per row ``[R]`` on ``device``, each from its row's generator.

    Rows that share a generator (a MOSS-TTS request's codebooks, one row
    each) draw together, in row order: one kernel per request rather than one
    per row (1024 a step for 32 requests on a GPU). A generator with one row
    draws a single number, as it always did. Unseeded rows (None) draw from
    the default generator together.
    """
    groups: dict[int, list[int]] = {}
    owners: dict[int, torch.Generator | None] = {}
    for row, g in enumerate(generators):
        key = 0 if g is None else id(g)
        groups.setdefault(key, []).append(row)
        owners[key] = g
    parts, order = [], []
    for key, rows in groups.items():
        g = owners[key]
        where = device if g is None else g.device
        shape = () if len(rows) == 1 and g is not None else (len(rows),)
        values = torch.rand(shape, generator=g, device=where).reshape(-1)
        parts.append(to_device(values, device))
        order.extend(rows)
    drawn = torch.cat(parts)
    if order == sorted(order):
        return drawn
    inverse = [0] * len(order)
    for position, row in enumerate(order):
        inverse[row] = position
    return drawn[_rows(inverse, device)]


def _filtered_draw(
    logits: torch.Tensor,
    top_k: Seq[int],
    top_p: Seq[float],
    generators: Seq[torch.Generator | None],
) -> torch.Tensor:
    """Draw after top-k and top-p, in the sorted order (stable, so ties are deterministic)."""
    rows, vocab = logits.shape
    ordered, order = _candidates(logits, top_k)
    width = ordered.shape[1]
    rank = torch.arange(width, device=logits.device).expand(rows, width)
    k = to_device(torch.tensor([kk if kk > 0 else vocab for kk in top_k]), logits.device)
    ordered = ordered.masked_fill(rank >= k.unsqueeze(1), float("-inf"))
    probs = ordered.softmax(-1)
    p = to_device(torch.tensor(top_p, dtype=probs.dtype), logits.device).unsqueeze(1)
    before = probs.cumsum(-1) - probs  # mass of the more likely tokens
    probs = probs.masked_fill(before >= p, 0.0)  # smallest set reaching p; the first stays
    picked = _draw(probs, generators)
    return order.gather(1, picked.unsqueeze(1)).squeeze(1)


def _candidates(logits: torch.Tensor, top_k: Seq[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits best first, ties by id (a stable sort's order), and their ids.

    Why not always sort: a full sort of every row is most of a sampled step's
    cost at a text vocabulary (151936 ids, 8 rows: 57 ms of a 81 ms sample,
    2 threads), where top-k keeps a few dozen. When every row has a top-k, the
    ``widest`` best (plus one) come from ``topk`` instead (1.5 ms); where a row's
    ``widest``-th value does not tie with the next one, they are exactly a
    stable sort's first ``widest``, ordered the same way once ties are put in
    id order. A row with a tie there is sorted whole, alone: bf16 logits tie
    often (eight bits of mantissa), and one such row among the 256 of a MOSS-TTS
    step at 8 requests (32 codebooks each, 1025 codes) used to sort them all,
    5.3 ms of a 43 ms step. A row without top-k sorts everything as before.
    """
    vocab = logits.shape[-1]
    widest = max(kk if kk > 0 else vocab for kk in top_k)
    if widest < vocab and logits.device.type == "cpu":  # the tie check reads the values
        values, ids = torch.topk(logits, widest + 1, dim=-1)
        tied = ~(values[:, widest - 1] > values[:, widest])  # a NaN counts as a tie
        ids, by_id = ids.sort(dim=-1)
        values, best_first = values.gather(1, by_id).sort(dim=-1, descending=True, stable=True)
        ids = ids.gather(1, best_first)
        if bool(tied.any()):
            rows = tied.nonzero().squeeze(1)
            exact, exact_ids = torch.sort(logits[rows], dim=-1, descending=True, stable=True)
            values[rows], ids[rows] = exact[:, : widest + 1], exact_ids[:, : widest + 1]
        return values, ids
    return torch.sort(logits, dim=-1, descending=True, stable=True)


def sample(
    logits: torch.Tensor,
    params: Seq[SamplingParams],
    generators: Seq[torch.Generator | None],
    previous: Seq[Seq[int] | torch.Tensor] | None = None,
) -> torch.Tensor:
    """Next token ids ``[B]`` (long) for logits ``[B, V]``, one row per request.

    ``previous`` holds each row's already generated ids (for the repetition
    penalty). Rows with temperature 0 are greedy and draw no random number.
    """
    if logits.dim() != 2 or logits.shape[0] != len(params) or len(params) != len(generators):
        raise ValueError(
            f"sample needs logits [B, V] and B params and generators, got {tuple(logits.shape)}, "
            f"{len(params)} params, {len(generators)} generators"
        )
    logits = logits.float().clone()
    if previous is not None:
        apply_repetition_penalty(logits, [p.repetition_penalty for p in params], previous)
    greedy = [i for i, p in enumerate(params) if p.temperature == 0]
    plain = [i for i, p in enumerate(params) if p.temperature > 0 and not _filters(p)]
    filtered = [i for i, p in enumerate(params) if p.temperature > 0 and _filters(p)]
    if len(greedy) == len(params):
        return logits.argmax(-1)
    out = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    if greedy:
        at = _rows(greedy, logits.device)
        out[at] = logits[at].argmax(-1)
    if plain:
        at = _rows(plain, logits.device)
        scaled = _scaled(logits, params, plain, at)
        out[at] = _draw(scaled.softmax(-1), [generators[i] for i in plain])
    if filtered:
        at = _rows(filtered, logits.device)
        out[at] = _filtered_draw(
            _scaled(logits, params, filtered, at),
            [params[i].top_k for i in filtered],
            [params[i].top_p for i in filtered],
            [generators[i] for i in filtered],
        )
    return out


def _rows(indices: list[int], device: torch.device) -> torch.Tensor:
    """Row indices as a tensor on ``device`` (a list index would copy from pageable memory)."""
    return to_device(torch.tensor(indices, dtype=torch.long), device)


def _scaled(
    logits: torch.Tensor, params: Seq[SamplingParams], rows: list[int], at: torch.Tensor
) -> torch.Tensor:
    temps = to_device(torch.tensor([params[i].temperature for i in rows]), logits.device)
    return logits[at] / temps.unsqueeze(1)


def _filters(params: SamplingParams) -> bool:
    return params.top_k > 0 or params.top_p < 1.0


def sample_sequences(
    logits: torch.Tensor, sequences: Seq[Sequence], previous: Seq[Seq[int]] | None = None
) -> torch.Tensor:
    """:func:`sample` with each sequence's own parameters and generator."""
    return sample(
        logits, [s.sampling for s in sequences], [s.generator for s in sequences], previous
    )
