"""The release's long-clip cut and repetition clean-up, on inputs our test wrote.

Usage: ``python split_reference.py DIR``. Runs inside the reference
environment (``make qwen-asr-reference-env``: qwen-asr 0.0.6), never inside
omni's. Reads ``DIR/signals.npz`` (float32 16 kHz clips) and
``DIR/request.json`` (``{"pieces": {clip: piece seconds}, "texts": [...]}``);
writes ``DIR/split.npz``, per clip the release's pieces (``<clip>/<j>``,
padded as it pads them) and their offsets (``<clip>/offsets``, seconds), from
``split_audio_into_chunks``, and ``DIR/cleaned.json``, each text through
``detect_and_fix_repetitions`` (its default threshold).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from qwen_asr.inference.utils import (
    SAMPLE_RATE,
    detect_and_fix_repetitions,
    split_audio_into_chunks,
)


def main() -> None:
    directory = Path(sys.argv[1])
    request = json.loads((directory / "request.json").read_text(encoding="utf-8"))
    signals = np.load(directory / "signals.npz")
    out = {}
    for name, seconds in request["pieces"].items():
        pieces = split_audio_into_chunks(signals[name], SAMPLE_RATE, float(seconds))
        for j, (samples, _) in enumerate(pieces):
            out[f"{name}/{j}"] = samples
        out[f"{name}/offsets"] = np.array([offset for _, offset in pieces], np.float64)
    np.savez(directory / "split.npz", **out)
    cleaned = [detect_and_fix_repetitions(text) for text in request["texts"]]
    (directory / "cleaned.json").write_text(json.dumps(cleaned, ensure_ascii=False), "utf-8")


if __name__ == "__main__":
    main()
