"""Run the official MOSS-TTS text normaliser over a list of strings.

Usage: ``python normalize_reference.py OFFICIAL_FILE < inputs.json > outputs.json``

``OFFICIAL_FILE`` is ``moss_tts_delay/tts_robust_normalizer_single_script.py`` of an
official MOSS-TTS checkout; it needs only the standard library, so any Python 3.10+
runs this script. Reads a JSON list of strings on stdin and writes the JSON list of
``normalize_tts_text`` results, in the same order, on stdout. Nothing of the official
file is copied here: it is loaded by path at run time.
"""

from __future__ import annotations

import importlib.util
import json
import sys


def load_official(path: str):
    """Import the official file as a module without putting it on sys.path."""
    spec = importlib.util.spec_from_file_location("moss_tts_official_normalizer", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    official = load_official(sys.argv[1])
    inputs = json.loads(sys.stdin.read())
    outputs = [official.normalize_tts_text(text) for text in inputs]
    sys.stdout.write(json.dumps(outputs, ensure_ascii=True))


if __name__ == "__main__":
    main()
