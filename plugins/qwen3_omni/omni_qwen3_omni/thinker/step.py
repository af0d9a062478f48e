"""The thinker as the engine backend sees it: a :class:`~omni_core.engine.interface.StepModel`.

A prompt (:class:`~omni_core.engine.prompt.EmbeddedPrompt`) is prefilled
once: token embeddings with the encoders' rows spliced in at the
placeholders, the prompt's three-stream M-RoPE positions, and the vision
deepstack rows added after the first layers. Every later step feeds one
token per sequence at its next position (the same in all three streams,
offset by the prompt's rope delta). Each step returns the sampled token id;
the sequence finishes on an end-of-turn id.

A request that will be spoken also needs, for every position, the layer-0
input row and the hidden state after ``accept_hidden_layer`` (what the
talker reads). For such a request (:meth:`ThinkerStepModel.capture`) a step
returns ``{"token": id, "rows": (layer0 [n, H], accept [n, H])}``: the rows of
the positions that step consumed (the whole prompt at prefill, then the
previous token), so they cost no extra forward pass. Where the prompt's
head was copied from another slot (the engine's shared prompt heads), the
prefill's rows cover the whole prompt all the same: layer 0's are the
prompt's embeddings, the accept layer's come from the slot's kept rows at
media positions (the only ones the talker reads there) and are zero at the
others.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from omni_core.engine.interface import CacheLayout, StepResult
from omni_core.engine.prompt import EmbeddedPrompt, prefix_rows, splice_embeddings
from omni_core.engine.sampling import from_host, sample_sequences
from omni_qwen3_tts.layers import causal_mask
from omni_qwen3_tts.talker import SlotStore

from ..config import TextConfig
from .moe import mixtures_capturable


class ThinkerStepModel:
    """Batched prefill and decode of the thinker's decoder over the engine's slot cache."""

    #: ``accept_hidden_layer`` values spoken requests will capture (compiled up front)
    expected_captures: tuple[int, ...] = ()

    def __init__(
        self,
        lm: Any,
        config: TextConfig,
        *,
        eos_ids: set[int],
        device: torch.device,
        dtype: torch.dtype,
        mirror: Any = None,
        tp_size: int = 1,
    ):
        self.lm, self.config, self.eos_ids = lm, config, set(eos_ids)
        self.device, self.dtype = torch.device(device), dtype
        self.captured: dict[str, int] = {}  # request id -> accept_hidden_layer
        # slot -> {layer: (prompt positions [m], rows [m, H])}: the expected_captures
        # layers' rows at the media positions its cache holds (MediaRows)
        self.media_rows: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
        # Rank 0 of a tensor-parallel group: each pass's inputs go to the other ranks first
        # (omni_core.engine.tp.Mirror), and this rank's cache holds its share of the KV heads.
        self.mirror, self.tp_size = mirror, tp_size

    def capture(self, request_id: str, accept_layer: int) -> None:
        """Return the talker's rows with every step of ``request_id`` (call before submit)."""
        if not 0 <= accept_layer <= self.config.num_hidden_layers:
            raise ValueError(
                f"accept_hidden_layer {accept_layer} is outside 0..{self.config.num_hidden_layers}"
            )
        self.captured[request_id] = accept_layer

    def release(self, request_id: str) -> None:
        self.captured.pop(request_id, None)

    def _layers(self, sequences: list[Any]) -> set[int] | None:
        wanted = {self.captured[s.request_id] for s in sequences if s.request_id in self.captured}
        return {0, *wanted} if wanted else None

    def _keeps_media_rows(self) -> bool:
        """Whether prefills keep the talker's rows at media positions per slot.

        Why: a spoken request's talker reads the accept layer's rows at the
        media positions of the prompt (layer 0's are its embeddings, which
        need no forward pass), so a spoken request may copy a head (the
        earlier turns of a voice conversation, their audio included) only if
        those rows come with it. Kept for the layers a speech deployment
        captures (:attr:`expected_captures`), for every prefill with media,
        spoken or not, so that any slot a head is copied from has them.
        """
        return bool(self.expected_captures) and self.tp_size == 1

    def prefix_copied(self, source: int, slot: int, length: int) -> None:
        """The engine copied ``source``'s first ``length`` positions into ``slot``: their
        media rows come along (engine hook, beside ``SlotKVCache.copy_prefix``)."""
        held = self.media_rows.get(source, {})
        self.media_rows[slot] = {
            layer: _before(index, rows, length) for layer, (index, rows) in held.items()
        }

    def cache_layout(self) -> CacheLayout:
        return CacheLayout.of(self.config, self.dtype, self.device, self.tp_size)

    def prompt_length(self, prompt: Any) -> int:
        return len(_as_prompt(prompt))

    def prefix_rows(self, seq: Any) -> torch.Tensor | None:
        """Token ids, M-RoPE positions and a digest of the encoders' rows, per position: the
        engine may copy a shared head (a system prompt, an image, a conversation's previous
        turn, with ``generated_rows``) from another request's slot. A spoken request only
        where the slots keep its talker's rows at media positions (``_keeps_media_rows``):
        otherwise only a prefill of its whole prompt computes them."""
        accept = self.captured.get(seq.request_id)
        if accept is not None and not (
            self._keeps_media_rows() and accept in self.expected_captures
        ):
            return None
        return prefix_rows(_as_prompt(seq.prompt))

    def chunked_prefill(self, seq: Any) -> bool:
        """Whether a long prompt may be prefilled over several steps (``seq.prefill_end``):
        any, but a spoken one only where the slots keep its talker's rows at media
        positions, since its last chunk hands the talker rows for the whole prompt
        (``_whole_prompt_rows``), as a copied head's do."""
        accept = self.captured.get(seq.request_id)
        return accept is None or (self._keeps_media_rows() and accept in self.expected_captures)

    def generated_rows(self, seq: Any) -> torch.Tensor | None:
        """The answer's positions in the cache as ``prefix_rows`` gives a prompt's (each
        token at its decode position in every M-RoPE stream): the next turn of the
        conversation, which sends this answer back, copies it too."""
        if seq.request_id in self.captured:
            return None
        prompt = _as_prompt(seq.prompt)
        fed = seq.cached - len(prompt)
        tokens = seq.state.get("history", [])[:fed]
        if fed <= 0 or len(tokens) < fed:
            return None
        streams = 1 if prompt.positions is None else int(prompt.positions.shape[0])
        rows = torch.zeros(fed, 1 + streams + 2, dtype=torch.long)
        rows[:, 0] = torch.tensor(tokens, dtype=torch.long)
        start = prompt.first_decode_position
        rows[:, 1 : 1 + streams] = torch.arange(start, start + fed)[:, None]
        return rows

    @torch.no_grad()
    def prefill(self, sequences: list[Any], cache: Any) -> list[StepResult]:
        """Each prompt from ``seq.cached`` on (the positions before are in its slot already:
        a head the engine copied, ``prefix_rows``, or the chunks before) up to
        ``seq.prefill_end``: a chunk of a long prompt, which samples nothing."""
        prompts = [_as_prompt(seq.prompt) for seq in sequences]
        starts = [int(seq.cached) for seq in sequences]
        lengths = [len(p) for p in prompts]
        ends = [
            n if seq.prefill_end is None else min(int(seq.prefill_end), n)
            for seq, n in zip(sequences, lengths, strict=True)
        ]
        news = [end - start for end, start in zip(ends, starts, strict=True)]
        batch, steps, hidden = len(prompts), max(news), self.config.hidden_size
        x = torch.zeros(batch, steps, hidden, dtype=self.dtype, device=self.device)
        positions = torch.zeros(3, batch, steps, dtype=torch.long, device=self.device)
        for row, (prompt, start, end) in enumerate(zip(prompts, starts, ends, strict=True)):
            ids = torch.tensor(prompt.token_ids, dtype=torch.long, device=self.device)
            x[row, : end - start] = splice_embeddings(self.lm.embed(ids), prompt)[start:end]
            if prompt.positions is None:
                where = torch.arange(start, end, device=self.device)
            else:
                where = prompt.positions[:, start:end].to(self.device)
            positions[:, row, : end - start] = where
        news_t = from_host(news, self.device)
        starts_t = from_host(starts, self.device)
        total = max(ends)
        mask = causal_mask(starts_t, news_t, steps, total)
        slots = [int(s.slot) for s in sequences]
        layers = self._layers(sequences)
        keep = self._keeps_media_rows() and any(p.embeddings is not None for p in prompts)
        if keep:
            layers = {*(layers or {0}), *self.expected_captures}
        deepstack = _deepstack(prompts, starts, ends, steps, self.device)
        out = self._forward(cache, [x, positions, mask, slots, starts, total, deepstack], layers)
        out, captured = out if layers else (out, {})
        if self._keeps_media_rows():
            self._keep_media_rows(sequences, prompts, starts, ends, captured)
        for seq, end in zip(sequences, ends, strict=True):
            seq.cached = end
        done = [row for row, (p, e) in enumerate(zip(prompts, ends, strict=True)) if e == len(p)]
        results = [StepResult(output=None)] * batch  # a chunk yields nothing
        if not done:
            return results
        finished = [sequences[row] for row in done]
        for seq in finished:
            seq.state["position"] = _as_prompt(seq.prompt).first_decode_position
            seq.state["history"] = []
        rows: list[Any] = [slice(0, news[row]) for row in done]
        for at, row in enumerate(done):
            seq, prompt, start = sequences[row], prompts[row], starts[row]
            if start and seq.request_id in self.captured:
                rows[at] = self._whole_prompt_rows(seq, prompt, start, captured, row)
        done_t = from_host(done, self.device)
        last = out[done_t, news_t[done_t] - 1]
        picked = captured
        if len(done) < batch:
            picked = {layer: rows_[done_t] for layer, rows_ in captured.items()}
        emitted = self._emit(finished, self.lm.logits(last), picked, rows)
        for row, result in zip(done, emitted, strict=True):
            results[row] = result
        return results

    def _keep_media_rows(
        self,
        sequences: list[Any],
        prompts: list[EmbeddedPrompt],
        starts: list[int],
        ends: list[int],
        captured: dict[int, torch.Tensor],
    ) -> None:
        """Each slot's media rows: those before its start, and this prefill's."""
        for row, (seq, prompt, start, end) in enumerate(
            zip(sequences, prompts, starts, ends, strict=True)
        ):
            held = self.media_rows.get(int(seq.slot), {})
            kept = {}
            for layer in self.expected_captures:
                index, rows = held.get(layer, (_NO_POSITIONS, None))
                index, rows = _before(index, rows, start)
                if prompt.embeddings is not None and layer in captured:
                    at = prompt.embedding_index.to("cpu", torch.long)
                    at = at[(at >= start) & (at < end)]
                    new = captured[layer][row, (at - start).to(self.device)].detach()
                    index = torch.cat([index, at])
                    rows = new if rows is None else torch.cat([rows, new.to(rows.device)])
                kept[layer] = (index, rows)
            self.media_rows[int(seq.slot)] = kept

    def _whole_prompt_rows(
        self,
        seq: Any,
        prompt: EmbeddedPrompt,
        start: int,
        captured: dict[int, torch.Tensor],
        row: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A spoken request's rows for its whole prompt when its head was copied.

        Layer 0's rows are the prompt's embeddings (computed again: no forward
        pass); the accept layer's are this prefill's from ``start`` on and,
        before it, the slot's kept rows at the media positions, zeros at the
        others: the talker reads that layer at media positions only
        (``TalkerPrompt.add_prompt``).
        """
        accept = self.captured[seq.request_id]
        ids = torch.tensor(prompt.token_ids, dtype=torch.long, device=self.device)
        layer0 = splice_embeddings(self.lm.embed(ids), prompt).float().cpu()
        hidden = torch.zeros_like(layer0)
        hidden[start:] = captured[accept][row, : len(prompt) - start].float().cpu()
        index, rows = self.media_rows.get(int(seq.slot), {}).get(accept, (_NO_POSITIONS, None))
        index, rows = _before(index, rows, start)
        if rows is not None and len(index):
            hidden[index] = rows.float().cpu()
        return layer0, hidden

    @torch.no_grad()
    def decode(self, sequences: list[Any], cache: Any) -> list[StepResult]:
        batch = len(sequences)
        ids = from_host([[s.state["last"]] for s in sequences], self.device)
        where = from_host([[s.state["position"]] for s in sequences], self.device)
        positions = where[None].expand(3, batch, 1)
        starts = [int(s.cached) for s in sequences]
        total = max(starts) + 1
        starts_t = from_host(starts, self.device)
        ones = torch.ones(batch, dtype=torch.long, device=self.device)
        mask = causal_mask(starts_t, ones, 1, total)
        slots = [int(s.slot) for s in sequences]
        layers = self._layers(sequences)
        x = self.lm.embed(ids)
        out = self._static_decode(cache, x, positions, starts_t, slots, layers, total)
        if out is None:
            out = self._forward(cache, [x, positions, mask, slots, starts, total, None], layers)
        out, captured = out if layers else (out, {})
        for seq in sequences:
            seq.cached += 1
            seq.state["position"] += 1
        rows = [slice(0, 1)] * batch
        return self._emit(sequences, self.lm.logits(out[:, -1]), captured, rows)

    def _forward(self, cache: Any, value: list[Any], layers: set[int] | None) -> Any:
        """The decoder stack on ``value`` (embeddings, positions, mask, slots, starts,
        total, deepstack); under tensor parallelism the other ranks get ``value`` first."""
        if self.mirror is not None:
            self.mirror.step(value)
        x, positions, mask, slots, starts, total, deepstack = value
        store = SlotStore(cache, slots, starts, total)
        return self.lm(x, positions, mask, store, deepstack=deepstack, capture_layers=layers)

    def close(self) -> None:
        """After the engine stopped: release the other ranks of a tensor-parallel group."""
        if self.mirror is not None:
            self.mirror.close()

    def prepare_static(self, context: Any) -> None:
        """The static decode steps the engine compiles: one per set of captured layers.

        A batch with a spoken request also returns layer 0 and its
        ``accept_hidden_layer`` rows, a different graph; the layers the stage
        will ask for are in :attr:`expected_captures` (set before the engine
        starts), so both are compiled at start-up. The sparse experts are
        stacked first (``moe.stack_mixtures``) and run as grouped products
        that read nothing on the host, so on a GPU whose grouped kernel is
        fused (bf16, Hopper or Blackwell) the step is captured as a CUDA
        graph; elsewhere the experts loop on the host inside the compiled
        step, as one opaque operator (``omni::looped_mixture``), and the
        step is not captured.
        """
        cfg = self.config
        graph_safe = mixtures_capturable(self.lm, self.device, self.dtype)
        self._static = {}
        for accept in (None, *self.expected_captures):
            layers = None if accept is None else frozenset({0, accept})
            name = "thinker" if layers is None else f"thinker (rows of layers 0, {accept})"
            self._static[layers] = context.decoder(
                name,
                functools.partial(_static_forward, self.lm, layers),
                hidden=cfg.hidden_size,
                dtype=self.dtype,
                rope_streams=3,
                graph_safe=graph_safe,
            )

    def _static_decode(
        self,
        cache: Any,
        x: torch.Tensor,
        positions: torch.Tensor,
        starts: torch.Tensor,
        slots: list[int],
        layers: set[int] | None,
        longest: int,
    ) -> Any:
        """The compiled step's output (``engine.enable_torch_compile``), or None: run eagerly."""
        variants = getattr(self, "_static", None)
        if not variants or getattr(self, "mirror", None) is not None:
            return None  # tensor parallelism: every rank must run the same eager step
        static = variants.get(None if layers is None else frozenset(layers))
        if static is None or not static.owns(cache.k) or not static.fits(x):
            return None
        slot_rows = from_host(slots, self.device)
        return static(x, positions, starts[:, None], slot_rows, longest=longest)

    def _emit(
        self,
        sequences: list[Any],
        logits: torch.Tensor,
        captured: dict[int, torch.Tensor],
        rows: list[Any],
    ) -> list[StepResult]:
        """Sample each row's token; a spoken request's output carries its rows: the
        ``captured`` ones of its ``rows[i]`` slice, or ``rows[i]`` itself where that is a
        pair already (a prompt whose head was copied: ``_whole_prompt_rows``)."""
        penalised = any(s.sampling.repetition_penalty != 1.0 for s in sequences)
        previous = [s.state["history"] for s in sequences] if penalised else None
        tokens = sample_sequences(logits, sequences, previous).tolist()  # one sync per step
        results = []
        for row, (seq, token) in enumerate(zip(sequences, tokens, strict=True)):
            seq.state["last"] = token
            seq.state["history"].append(token)
            output: Any = token
            accept = self.captured.get(seq.request_id)
            if accept is not None:
                span = rows[row]
                whole = (
                    span
                    if isinstance(span, tuple)
                    else (
                        captured[0][row, span].float().cpu(),
                        captured[accept][row, span].float().cpu(),
                    )
                )
                output = {"token": token, "rows": whole}
            results.append(StepResult(output=output, finished=token in self.eos_ids))
        return results


_NO_POSITIONS = torch.zeros(0, dtype=torch.long)


def _before(
    index: torch.Tensor, rows: torch.Tensor | None, length: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The kept media rows at positions before ``length``."""
    if rows is None:
        return index, None
    keep = index < length
    return index[keep], rows[keep.to(rows.device)]


def _static_forward(
    lm: Any, layers: frozenset[int] | None, x: Any, positions: Any, mask: Any, store: Any
) -> Any:
    """The decoder for a static step: no deepstack (decode), the given captured layers."""
    return lm(x, positions, mask, store, deepstack=None, capture_layers=layers)


def _as_prompt(prompt: Any) -> EmbeddedPrompt:
    if isinstance(prompt, EmbeddedPrompt):
        return prompt
    raise TypeError(f"the thinker takes an EmbeddedPrompt, got {type(prompt).__name__}")


def _deepstack(
    prompts: list[EmbeddedPrompt],
    starts: list[int],
    ends: list[int],
    steps: int,
    device: torch.device,
) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """Per deepstack layer: flat ``row * steps + position - start`` indexes and the rows to
    add there (those of positions from each row's ``start`` to its ``end``: the positions
    this prefill computes)."""
    layers = max((len(p.layer_additions) for p in prompts), default=0)
    if not layers:
        return None
    out = []
    for layer in range(layers):
        index, rows = [], []
        for row, (prompt, start, end) in enumerate(zip(prompts, starts, ends, strict=True)):
            if layer < len(prompt.layer_additions):
                at = prompt.addition_index.to(device)
                keep = (at >= start) & (at < end)
                index.append(at[keep] - start + row * steps)
                rows.append(prompt.layer_additions[layer].to(device)[keep])
        out.append((torch.cat(index), torch.cat(rows)))
    return out
