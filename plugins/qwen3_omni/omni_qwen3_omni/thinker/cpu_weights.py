"""A Qwen3-Omni decoder's linear layers on this machine's fastest CPU kernels.

One function that the thinker stage, its tensor-parallel followers, the
talker stage (its mixture-of-experts decoder and its code predictor) and
``benchmarks/bench_qwen3_omni_thinker.py`` share, so that the benchmark
measures what the stages run.
"""

from __future__ import annotations

from torch import nn

from omni_core.engine.cpu_linear import pack_linear_weights

from .moe import block_mixtures


def pack_decoder_weights(lm: nn.Module) -> int:
    """Route every large linear layer of ``lm`` (``omni_core.engine.cpu_linear``); how many.

    float32 experts stay dense: each sees a row or two per step, where MKL
    beats oneDNN's packed layout. bf16 experts are blocked for oneDNN where
    this machine's routes say that layout streams faster (:func:`.moe.block_mixtures`).
    """
    packed = pack_linear_weights(lm, skip=lambda name: ".experts." in name)
    return packed + block_mixtures(lm)
