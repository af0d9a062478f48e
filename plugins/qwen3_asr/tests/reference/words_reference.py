"""The release's aligner words next to ours, on the same sentences, in the reference environment.

Usage: ``python words_reference.py WORDS_PY CASES_JSON OUT_JSON``. Runs inside
the reference environment (``make qwen-asr-reference-env``: qwen-asr 0.0.6 with
the splitters it pins, nagisa 0.2.11 and soynlp 0.0.493), so both sides split
with the same libraries and the release's Korean word list, which omni's
``words.py`` (loaded from its file: omni is not installed here) finds in the
installed ``qwen_asr`` package. Writes, per case, the word list of the
release's ``Qwen3ForceAlignProcessor.encode_timestamp`` and of ``split_words``.
"""

from __future__ import annotations

import importlib.util
import json
import sys

sys.modules.setdefault("torchvision", None)

from qwen_asr.inference.qwen3_forced_aligner import Qwen3ForceAlignProcessor  # noqa: E402


def main() -> None:
    words_py, cases_json, out_json = sys.argv[1:4]
    spec = importlib.util.spec_from_file_location("omni_words", words_py)
    ours = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ours)
    release = Qwen3ForceAlignProcessor()
    answers = []
    with open(cases_json, encoding="utf-8") as stream:
        cases = json.load(stream)
    for case in cases:
        theirs, _ = release.encode_timestamp(case["text"], case["language"])
        answers.append(
            {
                "release": theirs,
                "ours": ours.split_words(case["text"], case["language"]),
                "list": str(ours.release_korean_list()),
            }
        )
    with open(out_json, "w", encoding="utf-8") as out:
        json.dump(answers, out, ensure_ascii=False)


if __name__ == "__main__":
    main()
