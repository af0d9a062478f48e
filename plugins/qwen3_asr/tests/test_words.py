"""The aligner's word units per language (words.py), and against the release's (opt-in).

Japanese needs the optional nagisa (``omni-qwen3-asr[ja]``): its splitting tests
skip without it, and the refusal without it is tested either way. Korean's rule
is run on a short word list of our own; the reference test runs both splitters
on the release's list in the reference environment.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from omni_qwen3_asr import words
from omni_qwen3_asr.words import (
    WordSplitterMissing,
    clean,
    release_korean_list,
    split_japanese,
    split_korean,
    split_words,
)

REFERENCE_PYTHON = Path(os.environ.get("QWEN_ASR_REF_PYTHON", "/nonexistent/qwen-asr-ref"))
SCRIPT = Path(__file__).parent / "reference" / "words_reference.py"
HAVE_NAGISA = importlib.util.find_spec("nagisa") is not None
needs_nagisa = pytest.mark.skipif(
    not HAVE_NAGISA, reason="nagisa is not installed (pip install 'omni-qwen3-asr[ja]')"
)


@needs_nagisa
def test_japanese_is_split_into_nagisas_words_without_punctuation_or_spaces() -> None:
    assert split_japanese("今日はいい天気ですね。") == ["今日", "は", "いい", "天気", "です", "ね"]
    spaced = split_words("東京 タワーへ、行きました!", "Japanese")
    assert spaced[0] == "東京" and "タワー" in spaced
    assert "".join(spaced) == "東京タワーへ行きました"  # every kept character, once, in order
    assert all(word == clean(word) and word for word in spaced)
    assert split_words("", "japanese") == []


def test_japanese_without_nagisa_is_refused_naming_the_install_command(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "nagisa", None)  # what an absent package imports as
    with pytest.raises(WordSplitterMissing) as refused:
        split_words("こんにちは", "Japanese")
    assert isinstance(refused.value, NotImplementedError)  # the align stage answers it: a 400
    assert "nagisa" in str(refused.value)
    assert "pip install 'omni-qwen3-asr[ja]'" in str(refused.value)


def test_korean_without_the_release_list_is_timed_eojeol_by_eojeol(monkeypatch) -> None:
    monkeypatch.setattr(words, "release_korean_list", lambda: None)
    text = "안녕하세요, 반갑습니다! 학교에 갔다. (서울)"
    assert split_words(text, "Korean") == ["안녕하세요", "반갑습니다", "학교에", "갔다", "서울"]
    assert split_korean(" ... ", None) == []


def test_korean_with_a_word_list_cuts_each_eojeol_once_as_the_release_does(tmp_path) -> None:
    listed = tmp_path / "ko.dict"
    listed.write_text("학교 10 x\n\n한국 10 x\n한국어 10 x\n대학교 10 x\n공부하다 10 x\n학 10 x\n")
    said = "학교에 갔다 한국어를 공부했다 대학교 학교 학생 “학교에.” 학교에서."
    assert split_korean(said, listed) == [
        *("학교", "에"),  # after the listed prefix
        "갔다",
        *("한국어", "를"),  # the longest listed prefix, not the shortest
        "공부했다",  # no listed prefix: whole
        "대학교",  # the whole eojeol listed: one unit
        "학교",
        "학생",  # a one-character prefix never counts
        "학교에",  # cut before cleaning: the quote makes "“학교" the prefix, unlisted
        *("학교", "에서"),  # the cut part keeps its characters until cleaned
    ]


def test_the_release_list_is_found_in_an_installed_qwen_asr_without_importing_it(
    tmp_path, monkeypatch
) -> None:
    assets = tmp_path / "qwen_asr" / "inference" / "assets"
    assets.mkdir(parents=True)
    (tmp_path / "qwen_asr" / "__init__.py").write_text("raise RuntimeError('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    release_korean_list.cache_clear()
    try:
        assert release_korean_list() is None  # the package without its list
        (assets / "korean_dict_jieba.dict").write_text("학교 10 x\n")
        release_korean_list.cache_clear()
        assert release_korean_list() == assets / "korean_dict_jieba.dict"
        assert split_words("학교에 갔다", "Korean") == ["학교", "에", "갔다"]
        assert "qwen_asr" not in sys.modules
    finally:
        release_korean_list.cache_clear()


JAPANESE = (
    "今日はいい天気ですね。",
    "私は昨日、友達と一緒に映画を見に行きました。",
    "Pythonで簡単に使えるツールです",
    "東京 タワーへ行きました!",
    "１２３円です。「こんにちは」と彼は言った……",
    "この音声認識モデルは日本語にも対応しています。",
)
KOREAN = (
    "안녕하세요, 반갑습니다.",
    "저는 어제 학교에 가서 한국어를 공부했습니다.",
    "경찰관이 인민공화국의 경제학자를 만났다!",
    "“오늘 날씨가 정말 좋네요” 라고 그가 말했다",
    "AI 모델이 2026년에 음성을 인식합니다",
)


@pytest.mark.reference
@pytest.mark.skipif(
    not REFERENCE_PYTHON.exists(),
    reason="opt-in: set QWEN_ASR_REF_PYTHON to the reference environment's python "
    "(make test-reference does)",
)
def test_word_lists_equal_the_releases(tmp_path) -> None:
    cases = [
        *({"text": text, "language": "Japanese"} for text in JAPANESE),
        *({"text": text, "language": "Korean"} for text in KOREAN),
        {"text": "Hello, world! It's 42°C -- 你好吗 today", "language": "English"},
        {"text": "一二 three 四五六 seven", "language": "Chinese"},
    ]
    (tmp_path / "cases.json").write_text(json.dumps(cases, ensure_ascii=False), encoding="utf-8")
    paths = (SCRIPT, Path(words.__file__), tmp_path / "cases.json", tmp_path / "out.json")
    proc = subprocess.run(
        [str(REFERENCE_PYTHON), *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    answers = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    assert answers[0]["list"].endswith("korean_dict_jieba.dict")  # the release's units, not eojeol
    for case, answer in zip(cases, answers, strict=True):
        assert answer["release"], case  # every sentence has words to compare
        assert answer["ours"] == answer["release"], case
    korean = [a for c, a in zip(cases, answers, strict=True) if c["language"] == "Korean"]
    eojeol = sum(len(text.split()) for text in KOREAN)
    assert sum(len(a["ours"]) for a in korean) > eojeol  # the list did cut eojeol
