"""The talker as the engine backend sees it: one speech frame per step.

A sequence's prompt is a :class:`~.prompt.TalkerPrompt`, which the talker
stage keeps feeding with the thinker's rows while the sequence runs. Each
step (prefill or decode) runs the talker over the engine's slot cache,
samples codebook 0 from ``codec_head`` and, unless that is the codec EOS,
runs the code predictor for codebooks 1..G-1 (a fresh per-frame cache,
batched over the sequences). The step's output is the frame, an int64 CPU
tensor ``[num_code_groups]``; the EOS step outputs ``None`` and finishes.
So a request that ends on EOS yields (talker tokens - 1) frames, as the
release does.

Decode step ``k`` feeds the sum of frame ``k``'s G code embeddings plus the
text row :meth:`TalkerPrompt.text_row` gives for ``k``, at rotary position
``next_position + k`` in all three streams. :meth:`TalkerStepModel.ready`
says whether that row has arrived; the engine decodes only ready sequences.

Sampling of codebook 0 follows the release's processors: the repetition
penalty over the codebook-0 ids generated so far, the control range
``[vocab - 1024, vocab)`` banned except EOS, then (when sampling)
temperature, top-k, top-p; greedy when the request's temperature is 0. The
release always samples the code predictor (top-k 50, top-p 0.8, temperature
1), whatever the talker does; here a greedy request gets a greedy predictor
too, so that greedy output is deterministic. Every draw of a request uses
its own generator, so a seeded request samples the same alone or batched.
"""

from __future__ import annotations

from typing import Any

import torch

from omni_core.engine.interface import CacheLayout, SequenceError, StepResult
from omni_core.engine.sampling import from_host, make_generator, to_device
from omni_qwen3_tts.layers import causal_mask
from omni_qwen3_tts.sampling import RowSampling, select_tokens
from omni_qwen3_tts.talker import SlotStore, complete_frames

from ..thinker.moe import mixtures_capturable
from .config import TalkerConfig
from .prompt import TalkerPrompt

#: The release's talker sampling defaults (``generate``'s ``talker_*`` arguments).
TALKER_SAMPLING = {"temperature": 0.9, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.05}
#: How the release samples the code predictor (fixed there, not request settings).
PREDICTOR_SAMPLING = RowSampling(temperature=1.0, top_k=50, top_p=0.8)


class TalkerStepModel:
    """Batched prefill and decode of the talker (and its code predictor) over the slot cache."""

    def __init__(
        self,
        talker: Any,
        config: TalkerConfig,
        *,
        device: torch.device | str,
        dtype: torch.dtype,
        predictor_sampling: RowSampling = PREDICTOR_SAMPLING,
    ):
        self.talker, self.config = talker, config
        self.device, self.dtype = torch.device(device), dtype
        self.predictor_sampling = predictor_sampling
        self._banned = talker.suppressed_ids(self.device)

    def cache_layout(self) -> CacheLayout:
        return CacheLayout.of(self.config.text, self.dtype, self.device)

    def prompt_length(self, prompt: Any) -> int:
        return _as_prompt(prompt).prefill_length

    def prefix_rows(self, seq: Any) -> torch.Tensor | None:
        """The prefill's rows as :meth:`TalkerPrompt.prefix_rows` gives them: a voice
        conversation's next turn copies the earlier user turns (the engine's shared
        prompt heads); None for a request with nothing to say."""
        prompt = _as_prompt(seq.prompt)
        if not prompt.prefill_ready or prompt.speechless:
            return None
        return prompt.prefix_rows()

    def chunked_prefill(self, seq: Any) -> bool:
        """A long prompt (a voice conversation's many user turns) may be prefilled over
        several steps, so that the other requests' frames keep coming meanwhile."""
        return True

    def ready(self, seq: Any) -> bool:
        """Whether ``seq`` can take its next step (its prefill, or its next decode)."""
        prompt = _as_prompt(seq.prompt)
        if "step" not in seq.state:
            return prompt.prefill_ready
        return prompt.text_available(seq.state["step"])

    @torch.no_grad()
    def prefill(self, sequences: list[Any], cache: Any) -> list[StepResult]:
        prompts = [_as_prompt(s.prompt) for s in sequences]
        waiting = [
            s.request_id for s, p in zip(sequences, prompts, strict=True) if not p.prefill_ready
        ]
        if waiting:
            raise SequenceError(waiting, "the thinker has not sent the talker's prefill rows yet")
        results: list[StepResult | None] = [None] * len(sequences)
        run = []
        for i, (seq, prompt) in enumerate(zip(sequences, prompts, strict=True)):
            seq.state.update(step=0, history=[], frames=0)
            if prompt.speechless:
                results[i] = StepResult(output=None, finished=True)
            else:
                run.append(i)
        if run:
            batch = [sequences[i] for i in run]
            inputs = [prompts[i].prefill_inputs(self.talker, self.device, self.dtype) for i in run]
            # positions before seq.cached are in the slot already: a head the engine
            # copied from another request's (prefix_rows), or the chunks before; a chunk
            # (seq.prefill_end) samples nothing
            starts = [int(s.cached) for s in batch]
            totals = [
                x.shape[0] if s.prefill_end is None else min(int(s.prefill_end), x.shape[0])
                for s, (x, _) in zip(batch, inputs, strict=True)
            ]
            news = [n - start for n, start in zip(totals, starts, strict=True)]
            steps, hidden = max(news), self.config.text.hidden_size
            x = torch.zeros(len(run), steps, hidden, dtype=self.dtype, device=self.device)
            positions = torch.zeros(3, len(run), steps, dtype=torch.long, device=self.device)
            for row, ((rows, where), start, end) in enumerate(
                zip(inputs, starts, totals, strict=True)
            ):
                x[row, : end - start] = rows[start:end]
                positions[:, row, : end - start] = where[:, start:end]
            news_t = from_host(news, self.device)
            mask = causal_mask(from_host(starts, self.device), news_t, steps, max(totals))
            store = SlotStore(cache, [int(s.slot) for s in batch], starts, max(totals))
            out = self.talker(x, positions, mask, store)
            for seq, n in zip(batch, totals, strict=True):
                seq.cached = n
            done = [
                row
                for row, ((rows, _), end) in enumerate(zip(inputs, totals, strict=True))
                if end == rows.shape[0]
            ]
            for row in range(len(run)):
                if row not in done:
                    results[run[row]] = StepResult(output=None)  # a chunk yields nothing
            if done:
                done_t = from_host(done, self.device)
                last = out[done_t, news_t[done_t] - 1]
                finished = [batch[row] for row in done]
                for row, result in zip(done, self._emit(finished, last), strict=True):
                    results[run[row]] = result
        return [r for r in results if r is not None]

    @torch.no_grad()
    def decode(self, sequences: list[Any], cache: Any) -> list[StepResult]:
        prompts = [_as_prompt(s.prompt) for s in sequences]
        waiting = [
            s.request_id
            for s, p in zip(sequences, prompts, strict=True)
            if not p.text_available(s.state["step"])
        ]
        if waiting:
            raise SequenceError(waiting, "the thinker has not sent this step's text row yet")
        batch = len(sequences)
        codes = to_device(torch.stack([s.state["last_codes"] for s in sequences]), self.device)
        text = torch.stack(
            [
                to_device(p.text_row(s.state["step"]), self.device).to(self.dtype)
                for s, p in zip(sequences, prompts, strict=True)
            ]
        )
        x = self.talker.embed_frame(codes) + self.talker.text_projection(text)
        where = [p.next_position + s.state["step"] for s, p in zip(sequences, prompts, strict=True)]
        positions = from_host(where, self.device)[None, :, None].expand(3, batch, 1)
        starts = [int(s.cached) for s in sequences]
        total = max(starts) + 1
        starts_t = from_host(starts, self.device)
        static = getattr(self, "_static", None)
        out = None
        if static is not None and static.owns(cache.k) and static.fits(x):
            slots = from_host([int(s.slot) for s in sequences], self.device)
            out = static(x[:, None], positions, starts_t[:, None], slots, longest=total)
        if out is None:
            ones = torch.ones(batch, dtype=torch.long, device=self.device)
            mask = causal_mask(starts_t, ones, 1, total)
            store = SlotStore(cache, [int(s.slot) for s in sequences], starts, total)
            out = self.talker(x[:, None], positions, mask, store)
        for seq in sequences:
            seq.cached += 1
            seq.state["step"] += 1
        return self._emit(sequences, out[:, -1])

    def prepare_static(self, context: Any) -> None:
        """The static decode steps the engine compiles: the talker's and its code predictor's.

        The talker's experts are stacked first and, where torch's grouped
        kernel is fused (bf16 on Hopper or Blackwell), read nothing on the
        host, so its step is captured as a CUDA graph there; elsewhere they
        loop on the host between the compiled parts and the step is not
        captured. The code predictor's (dense) is captured either way.
        """
        self._static = context.decoder(
            "talker",
            self.talker,
            hidden=self.config.text.hidden_size,
            dtype=self.dtype,
            rope_streams=3,
            graph_safe=mixtures_capturable(self.talker, self.device, self.dtype),
        )
        self.talker.code_predictor.prepare_static(
            context, self.dtype, self.device, self.predictor_sampling
        )

    def _emit(self, sequences: list[Any], hidden: torch.Tensor) -> list[StepResult]:
        """Codebook 0 for every row, then the predictor's codebooks for the rows that go on."""
        eos = self.config.codec_eos_token_id
        generators = [self._generator(s) for s in sequences]
        rows, predictor_rows = [], []
        for seq in sequences:
            row = RowSampling.of(seq.sampling)
            rows.append(row)
            predictor_rows.append(
                RowSampling(greedy=True) if row.greedy else self.predictor_sampling
            )
        histories = [
            torch.tensor(s.state["history"], dtype=torch.long) if s.state["history"] else None
            for s in sequences
        ]
        logits = self.talker.codec_head(hidden)
        code0 = select_tokens(logits, rows, generators, histories, [self._banned] * len(rows))
        code0_ids, go, frames = complete_frames(
            self.talker, hidden, code0, eos, predictor_rows, generators
        )
        frames_cpu = None if frames is None else frames.to("cpu", torch.long)
        results, slot = [], {row: k for k, row in enumerate(go)}
        for i, seq in enumerate(sequences):
            seq.state["history"].append(code0_ids[i])
            if i not in slot:
                results.append(StepResult(output=None, finished=True))
                continue
            assert frames is not None and frames_cpu is not None
            seq.state["last_codes"] = frames[slot[i]]
            seq.state["frames"] += 1
            results.append(StepResult(output=frames_cpu[slot[i]], finished=False))
        return results

    def _generator(self, seq: Any) -> torch.Generator:
        if seq.generator is None:
            seq.generator = make_generator(seq.sampling.seed, self.device)
        return seq.generator


def _as_prompt(prompt: Any) -> TalkerPrompt:
    if isinstance(prompt, TalkerPrompt):
        return prompt
    raise TypeError(f"the talker takes a TalkerPrompt, got {type(prompt).__name__}")
