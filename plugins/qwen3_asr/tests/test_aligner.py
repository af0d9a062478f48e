"""The forced aligner's own parts, and its word timings against the release's (opt-in)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from omni_qwen3_asr.aligner import aligner_text, repair, split_words

REFERENCE_PYTHON = Path(os.environ.get("QWEN_ASR_REF_PYTHON", "/nonexistent/qwen-asr-ref"))
SCRIPT = Path(__file__).parent / "reference" / "aligner_reference.py"


def test_words_keep_letters_digits_and_apostrophes_and_split_ideographs() -> None:
    text = "Hello, world! It's 42°C -- 你好吗 today3 ..."
    assert split_words(text, "English") == [
        "Hello",
        "world",
        "It's",
        "42C",
        "你",
        "好",
        "吗",
        "today3",
    ]
    assert split_words("ab你cd", "Chinese") == ["ab", "你", "cd"]
    assert aligner_text(["a", "b"]) == (
        "<|audio_start|><|audio_pad|><|audio_end|>a<timestamp><timestamp>b<timestamp><timestamp>"
    )


def test_times_are_repaired_around_their_longest_ordered_run() -> None:
    assert repair([0, 80, 160, 240]) == [0, 80, 160, 240]  # ordered: untouched
    # one stray value takes its nearer kept neighbour (the left one on a tie)
    assert repair([0, 80, 900, 160, 240]) == [0, 80, 80, 160, 240]
    assert repair([0, 80, 900, 950, 160, 240, 300]) == [0, 80, 80, 160, 160, 240, 300]
    # three or more in a row are spread evenly between their kept neighbours
    assert repair([0, 900, 950, 990, 400, 500, 600, 700]) == [0, 100, 200, 300, 400, 500, 600, 700]
    # of two equally long runs the one ending first is kept, as the release keeps it
    assert repair([0, 900, 400]) == [0, 900, 900]
    # at an edge the only kept neighbour is copied
    assert repair([500, 0, 80, 160]) == [0, 0, 80, 160]
    assert repair([]) == []


@pytest.mark.reference
@pytest.mark.skipif(
    not REFERENCE_PYTHON.exists(),
    reason="opt-in: set QWEN_ASR_REF_PYTHON to the reference environment's python "
    "(make test-reference does)",
)
def test_word_timings_equal_the_release_aligner(tmp_path, speak) -> None:
    torch = pytest.importorskip("torch")
    sf = pytest.importorskip("soundfile")
    soxr = pytest.importorskip("soxr")
    import io

    from omni_core.kit.weights import Checkpoint
    from omni_qwen3_asr.aligner import ForcedAligner
    from omni_qwen3_asr.loading import construct_parts, load_weights, read_config
    from omni_qwen3_asr.source import PRESETS_DIR
    from omni_qwen3_omni.audio.mel import log_mel
    from omni_qwen3_omni.chat import ChatPrompter

    clips = {}
    for name, said in (("short", "hello there"), ("long", "one two three four five six seven")):
        samples, rate = sf.read(io.BytesIO(speak(said)), dtype="float32")
        clips[name] = soxr.resample(samples, rate, 16_000).astype(np.float32)
    np.savez(tmp_path / "inputs.npz", **clips)
    config = json.loads((PRESETS_DIR / "tiny" / "config.json").read_text())
    for key in ("architectures", "model_type"):
        config.pop(key)
    config["thinker_config"].update(model_type="qwen3_forced_aligner", classify_num=40)
    config.update(timestamp_token_id=151705, timestamp_segment_time=80.0)
    cases = [
        {"clip": "short", "text": "Hello, there!", "language": "English"},
        {"clip": "long", "text": "one two three four five six seven", "language": "English"},
        {"clip": "long", "text": "一二 three 四五六 seven", "language": "Chinese"},
    ]
    request = {"config": config, "preset": str(PRESETS_DIR / "tiny"), "seed": 5, "cases": cases}
    (tmp_path / "request.json").write_text(json.dumps(request))
    proc = subprocess.run(
        [str(REFERENCE_PYTHON), str(SCRIPT), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    expected = json.loads((tmp_path / "aligned.json").read_text())

    ckpt = tmp_path / "aligner"
    checkpoint, model_config = Checkpoint.open(ckpt), read_config(ckpt)
    encoder, lm = construct_parts(model_config, torch.device("cpu"), torch.float32)
    assert load_weights(checkpoint, encoder, lm, model_config) == len(checkpoint.weight_map)
    prompter = ChatPrompter.from_dir(ckpt)
    aligner = ForcedAligner(encoder, lm, prompter, model_config)
    for case, want in zip(cases, expected, strict=True):
        mel = log_mel(clips[case["clip"]])
        rows = encoder([mel])[0].shape[0]
        ids = prompter.expand_placeholders(
            aligner_text(split_words(case["text"], case["language"])), audio_token_counts=[rows]
        )
        assert ids == want["ids"]
        got = aligner.align(mel, case["text"], case["language"])
        assert [[w.word, w.start, w.end] for w in got] == want["items"]
    assert all(w["items"] for w in expected)
