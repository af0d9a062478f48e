"""transformer_config: one Qwen3 stack's geometry, shared with MOSS-TTS's backbone."""

from __future__ import annotations

import pytest

from omni_qwen3_tts.config import transformer_config

SECTION = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
DEFAULTS = {"rope_theta": 10000.0, "head_dim": None}


def test_the_rotary_base_of_either_transformers_spelling_wins_over_the_default():
    old = transformer_config({**SECTION, "rope_theta": 1e6}, DEFAULTS, "talker_config")
    new = transformer_config(
        {**SECTION, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
        DEFAULTS,
        "talker_config",
    )
    assert old == new and new.rope_theta == 1e6 and new.head_dim == 8
    assert transformer_config(SECTION, DEFAULTS, "talker_config").rope_theta == 10000.0


def test_moss_tts_reads_its_backbone_through_the_same_builder():
    from omni_moss_tts.config import _QWEN3_DEFAULTS, backbone_config

    section = {**SECTION, "rope_parameters": {"rope_theta": 5e5}}
    ours = backbone_config(section, "language_config")
    assert ours == transformer_config(section, _QWEN3_DEFAULTS, "language_config")
    assert ours.rope_theta == 5e5 and ours.max_position_embeddings == 32768
    with pytest.raises(ValueError, match="rope type 'yarn' is not supported"):
        backbone_config({**SECTION, "rope_scaling": {"rope_type": "yarn"}}, "language_config")
    with pytest.raises(ValueError, match="sliding-window attention is not supported"):
        backbone_config({**SECTION, "sliding_window": 8, "use_sliding_window": True}, "l")
