"""Qwen3-ASR against the release's own code (opt-in: ``-m reference``; make test-reference).

The reference environment (``QWEN_ASR_REF_PYTHON``: qwen-asr 0.0.6 with
transformers 4.57.6, built by ``make qwen-asr-reference-env``) runs
``reference/asr_reference.py``: a tiny checkpoint written by the release's
``Qwen3ASRForConditionalGeneration.save_pretrained``, then, per case, the
prompt ids its ``Qwen3ASRModel`` builds (context, forced language), the mel,
the audio tower's rows and greedy tokens. We load that checkpoint with zero
unmatched tensors and run our own stages on the same clips (espeak-ng speech):

| what | ours | bound |
|---|---|---|
| loading | ``load_weights`` (strict, by prefix) | every tensor of the checkpoint read |
| prompt ids | the preprocessing stage on the WAV | equal |
| mel | the preprocessing stage | 1e-5 abs |
| tower rows | the asr stage's encoder | 1e-4 rel L2 |
| greedy tokens | the asr stage on the torch engine, all cases at once | equal, token for token |

Clips longer than the tiny tower's 2 s attention window span several windows;
the reference runs them with its own block mask (see the script).
"""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
sf = pytest.importorskip("soundfile")
soxr = pytest.importorskip("soxr")

from omni_core.kit.weights import Checkpoint  # noqa: E402
from omni_qwen3_asr.loading import load_weights, read_config  # noqa: E402
from omni_qwen3_asr.source import PRESETS_DIR  # noqa: E402

REFERENCE_PYTHON = Path(os.environ.get("QWEN_ASR_REF_PYTHON", "/nonexistent/qwen-asr-ref"))
SCRIPT = Path(__file__).parent / "reference" / "asr_reference.py"
pytestmark = [
    pytest.mark.reference,
    pytest.mark.skipif(
        not REFERENCE_PYTHON.exists(),
        reason="opt-in: set QWEN_ASR_REF_PYTHON to the reference environment's python "
        "(make test-reference does)",
    ),
]

TEXTS = {
    "short": "hello there",
    "long": "the quick brown fox jumps over the lazy dog, and then it runs far away",
    "odd": "grafana dashboards",
}
CASES = [
    {"clip": "short", "context": "", "language": None},
    {"clip": "long", "context": "", "language": None},
    {"clip": "short", "context": "Grafana, Kubernetes", "language": "English"},
    {"clip": "odd", "context": "", "language": "German"},
]
BATCH = [0, 1, 3]
MAX_NEW_TOKENS = 10


def _clip(text: str, directory: Path, trim: int) -> np.ndarray:
    path = directory / f"{abs(hash(text))}.wav"
    subprocess.run(["espeak-ng", "-w", str(path), text], check=True)
    samples, rate = sf.read(path, dtype="float32")
    clip = soxr.resample(samples, rate, 16_000).astype(np.float32)
    return clip[: len(clip) - trim]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, speak) -> tuple[Path, dict, dict]:
    out = tmp_path_factory.mktemp("asr_ref")
    clips = {name: _clip(text, out, trim=i * 37) for i, (name, text) in enumerate(TEXTS.items())}
    np.savez(out / "inputs.npz", **clips)
    config = json.loads((PRESETS_DIR / "tiny" / "config.json").read_text())
    for key in ("architectures", "model_type"):
        config.pop(key)
    config["thinker_config"].pop("model_type")
    request = {
        "config": config,
        "preset": str(PRESETS_DIR / "tiny"),
        "seed": 11,
        "cases": CASES,
        "batch": BATCH,
        "max_new_tokens": MAX_NEW_TOKENS,
    }
    (out / "request.json").write_text(json.dumps(request))
    proc = subprocess.run(
        [str(REFERENCE_PYTHON), str(SCRIPT), str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out / "ckpt", dict(np.load(out / "reference.npz")), clips


class _Request:
    def __init__(self, data: dict, request_id: str = "r"):
        self.data, self.request_id, self.emitted = data, request_id, []

    async def emit(self, item) -> None:
        self.emitted.append(item)


def _wav(clip: np.ndarray) -> str:
    buffer = io.BytesIO()
    sf.write(buffer, clip, 16_000, format="WAV", subtype="FLOAT")
    return base64.b64encode(buffer.getvalue()).decode()


def _rel_l2(ours: torch.Tensor, ref: np.ndarray) -> float:
    ref_t = torch.from_numpy(ref).to(torch.float64)
    return float((ours.to(torch.float64) - ref_t).norm() / ref_t.norm())


def _until_eos(tokens, eos: set[int]) -> list[int]:
    out = []
    for token in (int(t) for t in tokens):
        out.append(token)
        if token in eos:
            break
    return out


def test_the_release_checkpoint_loads_with_zero_unmatched_tensors(reference) -> None:
    ckpt, _, _ = reference
    from omni_qwen3_asr.loading import construct_parts

    checkpoint = Checkpoint.open(ckpt)
    config = read_config(ckpt)
    encoder, lm = construct_parts(config, torch.device("cpu"), torch.float32)
    assert load_weights(checkpoint, encoder, lm, config) == len(checkpoint.weight_map)


def test_prompts_mels_tower_rows_and_greedy_tokens_equal_the_release(reference) -> None:
    import anyio

    from omni_qwen3_asr.preprocessing import create_preprocessing
    from omni_qwen3_asr.stages import create_asr

    ckpt, ref, clips = reference
    pre = create_preprocessing(str(ckpt))
    asr = create_asr(str(ckpt), load_format="safetensors", dtype="float32", pack_weights=False)
    eos = {151645, 151643}

    def request(case: dict) -> dict:
        audio = {"type": "input_audio", "input_audio": {"data": _wav(clips[case["clip"]])}}
        return {
            "messages": [{"role": "user", "content": [audio]}],
            "sampling": {"max_tokens": MAX_NEW_TOKENS, "temperature": 0.0},
            "transcription": {
                "task": "transcribe",
                "language": case["language"],
                "prompt": case["context"],
            },
        }

    prepared = [anyio.run(pre.run, _Request(request(case))) for case in CASES]
    for i, got in enumerate(prepared):
        assert got["token_ids"] == ref[f"ids/{i}"].tolist(), f"case {i}: prompt ids"
        mel = got["mel"].numpy()
        assert mel.shape == ref[f"mel/{i}"].shape
        assert np.abs(mel - ref[f"mel/{i}"]).max() < 1e-5, f"case {i}: mel"
        rows = asr._encode(got["mel"])
        assert _rel_l2(rows, ref[f"audio/{i}"]) < 1e-4, f"case {i}: tower rows"

    async def all_at_once() -> list[list[int]]:
        requests = [_Request(p, request_id=f"case{i}") for i, p in enumerate(prepared)]
        async with anyio.create_task_group() as tg:
            for r in requests:
                tg.start_soon(asr.run, r)
        await asr.aclose()
        return [[t for t in r.emitted if isinstance(t, int)] for r in requests]

    ours = anyio.run(all_at_once)
    assert len(clips["long"]) > 2 * 32_000  # the tiny tower's windows are 2 s: several
    assert all(len(t) == MAX_NEW_TOKENS or t[-1] in eos for t in ours) and ours[0] != ours[2]
    for i, tokens in enumerate(ours):
        assert tokens == _until_eos(ref[f"tokens/{i}"], eos), f"case {i}: greedy tokens"
    # The release's own batch (left-padded prompts, mels padded to the longest clip):
    # the longest clip's features are its own there, so its tokens must not move.
    longest = max(range(len(BATCH)), key=lambda j: len(clips[CASES[BATCH[j]]["clip"]]))
    assert ours[BATCH[longest]] == _until_eos(ref[f"batch_tokens/{longest}"], eos)
