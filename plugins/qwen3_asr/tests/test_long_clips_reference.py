"""Our long-clip cut and repetition clean-up against the release's functions (opt-in).

``-m reference`` with ``QWEN_ASR_REF_PYTHON`` naming the reference
environment's python (``make test-reference`` sets it): that environment runs
``reference/split_reference.py``, the release's ``split_audio_into_chunks``
and ``detect_and_fix_repetitions`` (qwen-asr 0.0.6) on the clips and texts
written here, and our :func:`split_clip` and :func:`collapse_repetitions` must
give the same pieces (sample for sample, padding included), the same offsets
and the same text. The clips: noise with quiet stretches at several levels,
plain noise (its quietest window wins by a hair), silence (every window ties),
a tone whose loudness swells, a clip that leaves a short tail to pad, a clip
shorter than a piece, and one cut at the aligner's real 180 s. The texts: runs,
patterns, Chinese, and seeded random mixes of them.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest

from omni_qwen3_asr.repetitions import collapse_repetitions
from omni_qwen3_asr.split import MAX_ALIGNED_PIECE_SECONDS, split_clip

REFERENCE_PYTHON = Path(os.environ.get("QWEN_ASR_REF_PYTHON", "/nonexistent/qwen-asr-ref"))
SCRIPT = Path(__file__).parent / "reference" / "split_reference.py"
pytestmark = [
    pytest.mark.reference,
    pytest.mark.skipif(
        not REFERENCE_PYTHON.exists(),
        reason="opt-in: set QWEN_ASR_REF_PYTHON to the reference environment's python "
        "(make test-reference does)",
    ),
]
RATE = 16_000


def _signals() -> dict[str, tuple[np.ndarray, float]]:
    """Clip name -> (samples, piece seconds)."""
    rng = np.random.default_rng(5)

    def noise(seconds: float, level: float = 0.3) -> np.ndarray:
        return rng.uniform(-level, level, int(seconds * RATE)).astype(np.float32)

    gaps = noise(50.0)
    for at, level in ((9.0, 0.02), (11.4, 0.004), (13.0, 0.01), (24.2, 0.001), (35.5, 0.003)):
        start = int(at * RATE)
        gaps[start : start + 2400] = noise(0.15, level)
    gaps[int(40.0 * RATE) : int(40.4 * RATE)] = 0.0
    seconds = np.arange(int(65.0 * RATE)) / RATE
    swell = (np.sin(2 * np.pi * 220 * seconds) * (0.5 + 0.45 * np.sin(seconds / 3))).astype(
        np.float32
    )
    tail = noise(10.3)
    tail[int(10.1 * RATE) : int(10.25 * RATE)] = 0.0
    aligned = noise(400.0, 0.2)
    for at in (150.0, 178.0, 181.5, 330.0, 362.0):
        aligned[int(at * RATE) : int(at * RATE) + 1800] *= 0.01
    return {
        "gaps": (gaps, 12.0),
        "noise": (noise(40.0), 10.0),
        "silence": (np.zeros(30 * RATE, np.float32), 8.0),
        "swell": (swell, 20.0),
        "tail": (tail, 10.0),
        "short": (noise(3.0), 10.0),
        "aligned": (aligned, MAX_ALIGNED_PIECE_SECONDS),
    }


def _texts() -> list[str]:
    fixed = [
        "",
        "hello world",
        "wow" + "!" * 50,
        "好" * 21 + "的",
        "好" * 20 + "的",
        "ha" * 25,
        "I said " + "no way " * 22 + "ok",
        "我们今天" + "你好" * 30 + "再见了" * 21 + "。",
        "嗯" * 300,
        "abc " * 19,
        "hello " + "a" * 20,
        "x" + "ab" * 20 + "y" * 40 + "z",
        "the end. " + "and then " * 40 + "a" * 30 + " done " + "la" * 20,
        "一二三四五六七八九十一二三四五六七八九十" * 21 + "完",
    ]
    rng = random.Random(7)
    alphabets = ["ab", "abc", "你好吗", "a ", "x", "的了是"]
    for _ in range(200):
        parts = []
        for _ in range(rng.randint(1, 6)):
            letters = rng.choice(alphabets)
            if rng.random() < 0.4:
                parts.append("".join(rng.choice(letters) for _ in range(rng.randint(0, 30))))
            else:
                pattern = "".join(rng.choice(letters) for _ in range(rng.randint(1, 22)))
                parts.append(pattern * rng.randint(1, 45))
        fixed.append("".join(parts))
    return fixed


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, list[str]]:
    out = tmp_path_factory.mktemp("split_ref")
    signals = _signals()
    np.savez(out / "signals.npz", **{name: clip for name, (clip, _) in signals.items()})
    texts = _texts()
    request = {"pieces": {name: s for name, (_, s) in signals.items()}, "texts": texts}
    (out / "request.json").write_text(json.dumps(request, ensure_ascii=False), "utf-8")
    proc = subprocess.run(
        [str(REFERENCE_PYTHON), str(SCRIPT), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    cleaned = json.loads((out / "cleaned.json").read_text("utf-8"))
    return signals, dict(np.load(out / "split.npz")), cleaned


def test_the_pieces_and_offsets_equal_the_releases(release) -> None:
    signals, theirs, _ = release
    for name, (clip, seconds) in signals.items():
        ours = split_clip(clip, RATE, seconds)
        offsets = theirs[f"{name}/offsets"]
        assert len(ours) == len(offsets), name
        for j, piece in enumerate(ours):
            assert np.array_equal(piece.samples, theirs[f"{name}/{j}"]), f"{name} piece {j}"
        assert [p.offset for p in ours] == pytest.approx(offsets.tolist(), abs=1e-9), name
    clip, seconds = signals["aligned"]
    assert len(split_clip(clip, RATE, seconds)) == 3  # the aligner's 180 s: cut twice


def test_the_cleaned_texts_equal_the_releases(release) -> None:
    _, _, cleaned = release
    texts = _texts()
    assert [collapse_repetitions(t) for t in texts] == cleaned
    assert sum(t != c for t, c in zip(texts, cleaned, strict=True)) > 50  # most were changed
