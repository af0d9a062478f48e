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


def test_the_talker_and_root_ids_have_the_release_defaults_and_nulls_keep_them():
    from omni_qwen3_tts.config import Qwen3TTSConfig

    talker = {**SECTION, "code_predictor_config": {**SECTION, "num_code_groups": 16}}
    talker.update(num_code_groups=16, codec_pad_id=None, codec_think_id=6, codec_bos_id=5)
    raw = {"tts_model_type": "base", "talker_config": talker, "tts_bos_token_id": None}
    cfg = Qwen3TTSConfig.from_dict({**raw, "im_end_token_id": 11})
    t = cfg.talker
    assert (t.codec_pad_id, t.codec_bos_id, t.codec_think_id, t.codec_eos_token_id) == (
        4196,
        5,
        6,
        4198,
    )
    assert (cfg.im_start_token_id, cfg.im_end_token_id, cfg.tts_bos_token_id) == (
        151644,
        11,
        151672,
    )


def test_qwen3_omni_reads_its_code_predictor_through_the_same_builder():
    from omni_qwen3_omni.config import ConfigError
    from omni_qwen3_omni.talker.config import _predictor_config

    section = {**SECTION, "num_code_groups": 16, "rope_scaling": {"rope_type": "mrope"}}
    ours = _predictor_config(section)
    assert ours.num_key_value_heads == 2 and ours.num_code_groups == 16
    # A section naming its heads but not its KV heads has as many KV heads (the release's rule).
    assert _predictor_config({**section, "num_key_value_heads": None}).num_key_value_heads == 4
    with pytest.raises(ConfigError, match="multiple of num_key_value_heads"):
        _predictor_config({**section, "num_key_value_heads": 3})
