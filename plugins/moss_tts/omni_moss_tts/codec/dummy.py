"""Seeded random weights for the tokenizer (``load_format="dummy"``) that still give sane audio.

The project-wide filler (:func:`omni_qwen3_tts.weights.dummy_fill`) draws
matrices as N(0, 1/fan_in), codebooks as N(0, 1), norms one, biases zero and
layer scales 0.1. Two of its choices do not suit this codec:

* weight-norm magnitudes (``original0``, shape ``[out, 1, 1]``, fan-in 1)
  come out N(0, 1): each 1x1 projection's rows get random lengths and signs,
  and the 32 codebook stages add up to a latent of RMS ~5;
* the waveform is the last decoder transformer's output projection applied
  to a residual stream of RMS ~1, i.e. samples of RMS ~1 or more.

So after the shared fill the magnitudes are set: one for the quantizer's
outer projections, ``1/sqrt(num_quantizers)`` for each stage's output
projection (the summed latent has RMS ~1), and the waveform projection is
damped to give RMS ~0.1. Everything stays a function of the config and seed.
"""

from __future__ import annotations

import math

import torch
from torch import nn

WAVE_GAIN = 0.1
"""Scale of the last decoder projection: dummy audio at roughly -20 dBFS."""


def dummy_fill_codec(module: nn.Module, seed: int) -> None:
    """Fill an ``AudioTokenizer`` with seeded weights that decode to finite, modest audio."""
    from omni_qwen3_tts.weights import dummy_fill

    from .model import AudioTokenizer
    from .transformer import ProjectedTransformer

    if not isinstance(module, AudioTokenizer):
        raise TypeError(f"dummy_fill_codec fills an AudioTokenizer, got {type(module).__name__}")
    dummy_fill(module, seed)
    quantizer = module.quantizer
    with torch.no_grad():
        for proj in (quantizer.input_proj, quantizer.output_proj):
            _set_magnitude(proj, 1.0)
        per_stage = 1.0 / math.sqrt(len(quantizer.quantizers))
        for stage in quantizer.quantizers:
            _set_magnitude(stage.in_proj, 1.0)
            _set_magnitude(stage.out_proj, per_stage)
        last = [m for m in module.decoder if isinstance(m, ProjectedTransformer)][-1]
        if isinstance(last.output_proj, nn.Linear):
            last.output_proj.weight.mul_(WAVE_GAIN)
        else:  # no output projection: damp the last residual branches instead
            layer = last.transformer.layers[-1]
            layer.linear2.weight.mul_(WAVE_GAIN)


def _set_magnitude(proj: nn.Module, value: float) -> None:
    """Give every output row of a weight-normed projection the length ``value``."""
    parametrizations = getattr(proj, "parametrizations", None)
    if parametrizations is not None:
        parametrizations.weight.original0.fill_(value)
