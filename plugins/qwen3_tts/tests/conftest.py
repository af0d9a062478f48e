"""Fixtures of the Qwen3-TTS model tests: tiny checkpoints written by the tests themselves.

A checkpoint here is the real Hugging Face layout (root ``config.json``,
``generation_config.json``, tokenizer files, ``model.safetensors``,
``speech_tokenizer/{config.json,model.safetensors}``) at the tiny preset's
widths, filled with seeded dummy weights and saved with safetensors.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tts_reference_support

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

from safetensors.torch import save_file  # noqa: E402

from omni_qwen3_tts.model import Qwen3TTSModel  # noqa: E402
from omni_qwen3_tts.weights import PRESETS_DIR  # noqa: E402


def write_checkpoint(root: Path, variant: str = "custom_voice", seed: int = 0) -> Path:
    """Copy the tiny preset to ``root`` as ``variant`` and save seeded weights into it."""
    shutil.copytree(PRESETS_DIR / "tiny", root)
    config = json.loads((root / "config.json").read_text())
    config["tts_model_type"] = variant
    (root / "config.json").write_text(json.dumps(config))
    model = Qwen3TTSModel.from_pretrained(root, load_format="dummy", seed=seed)
    save_file(_contiguous(model.network.state_dict()), str(root / "model.safetensors"))
    assert model.speech_tokenizer is not None
    save_file(
        _contiguous(model.speech_tokenizer.state_dict()),
        str(root / "speech_tokenizer" / "model.safetensors"),
    )
    return root


def _contiguous(state: dict) -> dict:
    return {k: v.detach().contiguous().clone() for k, v in state.items()}


@pytest.fixture(scope="session")
def checkpoint_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """A tiny checkpoint per variant, written once per session."""
    made: dict[str, Path] = {}

    def make(variant: str = "custom_voice") -> Path:
        if variant not in made:
            made[variant] = write_checkpoint(tmp_path_factory.mktemp(variant) / "ckpt", variant)
        return made[variant]

    return make


@pytest.fixture(scope="session")
def tiny_model() -> Qwen3TTSModel:
    """The tiny CustomVoice preset with dummy weights (seed 0)."""
    return Qwen3TTSModel.from_pretrained("tiny", load_format="dummy", seed=0)


@pytest.fixture(scope="session")
def base_model(checkpoint_factory: Callable[[str], Path]) -> Qwen3TTSModel:
    """A tiny Base (voice clone) model, loaded from a checkpoint on disk."""
    return Qwen3TTSModel.from_pretrained(checkpoint_factory("base"))
