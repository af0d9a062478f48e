"""Parity of the thinker's text decoder and position ids with transformers' ``qwen3_omni_moe``.

Opt-in (marker ``reference``): runs only when ``QWEN_TTS_REF_PYTHON`` names
the reference environment's python (transformers 4.57.3; set-up in
``plugins/qwen3_tts/tests/REFERENCE.md``). ``reference/thinker_reference.py``
builds a tiny seeded Qwen3OmniMoeThinkerTextModel plus lm_head there and
records its outputs for a fixed input with distinct position streams and
deepstack features, and the reference ``get_rope_index`` on prompts its
processor expands. We load the weights strictly and compare: hidden states,
logits and recorded layer states within 1e-4 relative L2, positions exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from reference_support import opt_in, run_reference

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from safetensors.torch import load_file  # noqa: E402

from omni_qwen3_omni.config import ThinkerConfig  # noqa: E402
from omni_qwen3_omni.thinker.decoder import ThinkerLM, flat_positions  # noqa: E402
from omni_qwen3_omni.thinker.positions import (  # noqa: E402
    MediaTokens,
    audio_token_count,
    prompt_positions,
)

SCRIPT = Path(__file__).parent / "reference" / "thinker_reference.py"

pytestmark = opt_in


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("thinker_ref")
    run_reference(SCRIPT.name, str(out))
    return out


def _rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def test_decoder_matches_reference(reference: Path):
    torch.set_num_threads(1)
    cfg = ThinkerConfig.from_dict(json.loads((reference / "config.json").read_text()))
    lm = ThinkerLM(cfg.text).eval()
    state = load_file(str(reference / "model.safetensors"))
    result = lm.load_state_dict(state, strict=False)
    assert not result.missing_keys and not result.unexpected_keys, result
    data = np.load(reference / "outputs.npz")
    ref = {k: torch.from_numpy(data[k]) for k in data.files}
    index = flat_positions(ref["visual"])
    sets = sorted(k for k in ref if k.startswith("deepstack_"))
    deepstack = [(index, ref[k]) for k in sets]
    layers = cfg.text.num_hidden_layers
    with torch.no_grad():
        hidden, captured = lm(
            ref["inputs_embeds"],
            ref["positions"],
            deepstack=deepstack,
            capture_layers=set(range(layers + 1)),
        )
        logits = lm.logits(hidden)
        plain = lm(ref["inputs_embeds"], ref["positions"])
    assert _rel_l2(hidden, ref["hidden"]) <= 1e-4
    assert _rel_l2(logits, ref["logits"]) <= 1e-4
    for k in range(layers + 1):
        assert _rel_l2(captured[k], ref[f"hidden_states_{k}"]) <= 1e-4, k
    # the comparison is sensitive to the deepstack features
    assert _rel_l2(plain, ref["hidden"]) > 1e-2


def test_positions_match_reference(reference: Path):
    cfg = ThinkerConfig.from_dict(json.loads((reference / "config.json").read_text()))
    tokens = MediaTokens.from_config(cfg)
    cases = json.loads((reference / "positions.json").read_text())
    assert len(cases) >= 8
    for case in cases:
        assert [audio_token_count(m) for m in case["mel_frames"]] == case["audio_tokens"]
        ours = prompt_positions(
            case["ids"],
            tokens,
            image_grids=case["image_grids"],
            video_grids=case["video_grids"],
            video_seconds_per_grid=case["video_seconds_per_grid"],
            audio_lengths=case["audio_tokens"],
        )
        assert ours.positions.tolist() == case["positions"], case["name"]
        assert ours.rope_delta == case["rope_delta"], case["name"]
