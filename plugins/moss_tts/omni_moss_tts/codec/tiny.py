"""A miniature tokenizer config with the release's layout, for tests and the CPU demo.

Same module list as the released 24 kHz config (fold 240, four
transformers with 2x folds between them, the mirror in the decoder), the
same frame (1920 samples at 24 kHz) and the same code space (32 codebooks
of 1024 entries of dimension 8), so everything downstream of the codec sees
real shapes. Only the widths and depths shrink. Like the release, some
projections are identities (input or output width equal to ``d_model``), so
both kinds of checkpoint names occur.

``context_seconds`` sets every transformer's attention window; a small
value (0.4 s: 5 frames at 12.5 Hz, 40 steps at 100 Hz) lets a test stream
well past the window in a few frames.
"""

from __future__ import annotations

from typing import Any


def _transformer(
    input_dimension: int, output_dimension: int, d_model: int, num_layers: int = 1
) -> dict[str, Any]:
    return {
        "module_type": "Transformer",
        "input_dimension": input_dimension,
        "output_dimension": output_dimension,
        "d_model": d_model,
        "num_heads": 2,
        "num_layers": num_layers,
        "dim_feedforward": 2 * d_model,
        "causal": True,
        "norm": "layer_norm",
        "positional_embedding": "rope",
        "max_period": 10000,
        "gating": "none",
        "layer_scale": 0.01,
        "conv_layout": True,
    }


def _patch(size: int) -> dict[str, Any]:
    return {"module_type": "PatchedPretransform", "patch_size": size}


def tiny_codec_config(context_seconds: float = 10.0) -> dict[str, Any]:
    """A ``config.json``-style dict (parse it with ``CodecConfig.from_dict``)."""
    return {
        "model_type": "speech_tokenizer",
        "sampling_rate": 24000,
        "downsample_rate": 1920,
        "causal_transformer_context_duration": context_seconds,
        "encoder_kwargs": [
            _patch(240),
            _transformer(240, 16, 32),
            _patch(2),
            _transformer(32, 16, 32),  # input width == d_model: no input_proj
            _patch(2),
            _transformer(32, 24, 32),
            _patch(2),
            _transformer(48, 32, 48, num_layers=2),  # no input_proj
        ],
        "quantizer_type": "rlfq",
        "quantizer_kwargs": {
            "input_dim": 32,
            "rvq_dim": 16,
            "output_dim": 32,
            "num_quantizers": 32,
            "codebook_size": 1024,
            "codebook_dim": 8,
            "quantizer_type": "rlfq",
        },
        "decoder_kwargs": [
            _transformer(32, 48, 48, num_layers=2),  # output width == d_model: no output_proj
            _patch(2),
            _transformer(24, 32, 32),  # no output_proj
            _patch(2),
            _transformer(16, 32, 32),
            _patch(2),
            _transformer(16, 240, 32),
            _patch(240),
        ],
    }
