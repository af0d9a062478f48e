"""Qwen3-ForcedAligner: the time span of every word of a known transcript, in one forward pass.

The release's aligner is Qwen3-ASR's architecture with a classifier head
(``thinker.lm_head``: ``classify_num`` outputs instead of the vocabulary) and
no chat template. Its input is the clip's placeholder rows followed by the
transcript's words, each followed by two ``<timestamp>`` tokens; at every
``<timestamp>`` position the arg-max class times ``timestamp_segment_time``
(milliseconds) is a time: the first of a word's pair its start, the second its
end. Nothing is generated, so a request costs one prefill.

The raw times need not be monotonic. :func:`repair` keeps the longest
non-decreasing run of them (the first one found when several tie, as the
release does) and moves the rest: a stretch of one or two out-of-order times
takes its nearer kept neighbour's value (the left one on a tie), a longer
stretch is spread evenly between its kept neighbours.

The words are split as the release splits them (:mod:`.words`): at spaces
(Chinese ideographs one by one); Japanese with nagisa, the release's own
splitter, an optional dependency (``pip install 'omni-qwen3-asr[ja]'``; without
it Japanese timings are refused naming that command); Korean eojeol cut after
their longest listed prefix, as the release cuts them, when the release's word
list is installed (the ``qwen-asr`` package: omni does not copy it), else the
eojeol whole, since Korean writes spaces between words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from omni_qwen3_tts.layers import causal_mask

from .words import split_words

AUDIO = "<|audio_start|><|audio_pad|><|audio_end|>"
STAMPS = "<timestamp><timestamp>"


@dataclass(frozen=True)
class WordTime:
    word: str
    start: float  # seconds
    end: float


def aligner_text(words: list[str]) -> str:
    """The aligner's input text (one audio placeholder, to be expanded to the clip's rows)."""
    return AUDIO + "".join(word + STAMPS for word in words)


def _longest_run(values: list[float]) -> set[int]:
    """Indexes of the first longest non-decreasing subsequence (O(n^2), n = 2 x words)."""
    length = [1] * len(values)
    parent = [-1] * len(values)
    for i in range(1, len(values)):
        for j in range(i):
            if values[j] <= values[i] and length[j] + 1 > length[i]:
                length[i], parent[i] = length[j] + 1, j
    kept, at = set(), length.index(max(length)) if values else -1
    while at != -1:
        kept.add(at)
        at = parent[at]
    return kept


def repair(values: list[float]) -> list[int]:
    """``values`` made non-decreasing around their longest ordered run (see the module doc)."""
    kept = _longest_run(values)
    out = list(values)
    i = 0
    while i < len(out):
        if i in kept:
            i += 1
            continue
        j = i
        while j < len(out) and j not in kept:
            j += 1
        left = next((out[k] for k in range(i - 1, -1, -1) if k in kept), None)
        right = next((out[k] for k in range(j, len(out)) if k in kept), None)
        for k in range(i, j):
            if left is None or right is None:
                out[k] = right if left is None else left
            elif j - i <= 2:
                out[k] = left if k - i + 1 <= j - k else right
            else:
                out[k] = left + (right - left) / (j - i + 1) * (k - i + 1)
        i = j
    return [int(v) for v in out]


class ForcedAligner:
    """The aligner model and what it needs to read its answer."""

    def __init__(self, encoder: Any, lm: Any, prompter: Any, config: Any):
        self.encoder, self.lm, self.prompter, self.config = encoder, lm, prompter, config
        self.stamp_id = int(config.timestamp_token_id)
        self.segment_ms = float(config.timestamp_segment_time)

    @torch.inference_mode()
    def align(self, mel: torch.Tensor, text: str, language: str) -> list[WordTime]:
        """Each word of ``text`` with its start and end in the clip (seconds, 1 ms steps)."""
        words = split_words(text, language)
        if not words:
            return []
        weight = self.lm.lm_head.weight
        (rows,) = self.encoder([mel.to(weight.device, weight.dtype)])
        ids = self.prompter.expand_placeholders(
            aligner_text(words), audio_token_counts=[rows.shape[0]]
        )
        ids_t = torch.tensor(ids, device=weight.device)
        x = self.lm.embed(ids_t)
        x[ids_t == self.config.audio_token_id] = rows.to(x.dtype)
        steps = len(ids)
        positions = torch.arange(steps, device=weight.device)[None]
        zero, full = torch.zeros(1, dtype=torch.long), torch.tensor([steps])
        mask = causal_mask(zero.to(weight.device), full.to(weight.device), steps, steps)
        hidden = self.lm(x[None], positions, mask)
        classes = self.lm.logits(hidden[0, ids_t == self.stamp_id]).argmax(-1)
        times = repair((classes.float() * self.segment_ms).tolist())
        return [
            WordTime(word, round(times[2 * i] / 1000, 3), round(times[2 * i + 1] / 1000, 3))
            for i, word in enumerate(words)
        ]
