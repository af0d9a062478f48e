"""The incremental segmenter: a corpus of tricky texts, each with its exact segments.

Every case is checked three ways: fed whole, fed a character at a time, and
fed in random piece sizes (several seeds); all must give the same segments,
because a boundary is only decided once the text settles it.
"""

# Full-width (Chinese) punctuation is what these cases are about:
# ruff: noqa: RUF001

from __future__ import annotations

import random

import pytest

from omni_core.serve.speech.segmenter import Segmenter

S, C = "sentence", "clause"

CASES: list[tuple[str, str, list[str]]] = [
    # plain sentences
    ("Hello world. How are you?", S, ["Hello world.", "How are you?"]),
    ("One! Two? Three.", S, ["One!", "Two?", "Three."]),
    ("No punctuation at all", S, ["No punctuation at all"]),
    ("Wait?! Really?!", S, ["Wait?!", "Really?!"]),
    ("First part; second part.", S, ["First part;", "second part."]),
    ("  Leading   and\t\ttrailing   spaces.  ", S, ["Leading and trailing spaces."]),
    # abbreviations and titles
    ("Mr. Smith met Dr. Jones. They talked.", S, ["Mr. Smith met Dr. Jones.", "They talked."]),
    ("Use tools, e.g. hammers. Or not.", S, ["Use tools, e.g. hammers.", "Or not."]),
    ("That is, i.e. the rest. Fine.", S, ["That is, i.e. the rest.", "Fine."]),
    ("Apples, pears, etc. Then we left.", S, ["Apples, pears, etc.", "Then we left."]),
    ("Apples, pears, etc. and more.", S, ["Apples, pears, etc. and more."]),
    ("The U.S. Army marched. It rained.", S, ["The U.S. Army marched.", "It rained."]),
    ("J. K. Rowling wrote it. Yes.", S, ["J. K. Rowling wrote it.", "Yes."]),
    ("Prof. Xavier vs. Magneto. Again.", S, ["Prof. Xavier vs. Magneto.", "Again."]),
    ("See No. 5 on p. 12. Done.", S, ["See No. 5 on p. 12.", "Done."]),
    ("I said no. Then I left.", S, ["I said no.", "Then I left."]),
    ("Better than I. Then what?", S, ["Better than I.", "Then what?"]),
    ("We meet at 8 p.m. Bring snacks.", S, ["We meet at 8 p.m.", "Bring snacks."]),
    ("It opens at 9 a.m. sharp. Be there.", S, ["It opens at 9 a.m. sharp.", "Be there."]),
    ("Smith et al. found it. Good.", S, ["Smith et al. found it.", "Good."]),
    ("Apple Inc. Reported profits.", S, ["Apple Inc.", "Reported profits."]),
    ("He used approx. five. Then six.", S, ["He used approx. five.", "Then six."]),
    # numbers, times, URLs, emails
    ("Pi is 3.14159. It never ends.", S, ["Pi is 3.14159.", "It never ends."]),
    ("It costs $1,000.50 today. Wow.", S, ["It costs $1,000.50 today.", "Wow."]),
    ("The score was 3. Then 4.", S, ["The score was 3.", "Then 4."]),
    ("Version 2.0.1 is out. Update.", S, ["Version 2.0.1 is out.", "Update."]),
    ("Meet at 20:00, sharp: bring it.", C, ["Meet at 20:00,", "sharp:", "bring it."]),
    (
        "Visit https://example.com/a.b?x=1. Then go.",
        S,
        ["Visit https://example.com/a.b?x=1.", "Then go."],
    ),
    ("Mail me at a.b@example.org. Thanks!", S, ["Mail me at a.b@example.org.", "Thanks!"]),
    ("Go to www.example.com now.", S, ["Go to www.example.com now."]),
    # ellipses
    ("Wait... what happened? Nothing.", S, ["Wait... what happened?", "Nothing."]),
    ("Well... Maybe later.", S, ["Well...", "Maybe later."]),
    ("So…and then. End.", S, ["So…and then.", "End."]),
    ("Hmm… Okay.", S, ["Hmm…", "Okay."]),
    # quotes and brackets closing after the punctuation
    ('He said "Stop." Then he ran.', S, ['He said "Stop."', "Then he ran."]),
    ('"Why?" she asked. "Because."', S, ['"Why?" she asked.', '"Because."']),
    ("(This is aside.) Back again.", S, ["(This is aside.)", "Back again."]),
    ("He shouted 'Go!' Everyone went.", S, ["He shouted 'Go!'", "Everyone went."]),
    # Chinese
    ("你好。今天天气很好！你呢？", S, ["你好。", "今天天气很好！", "你呢？"]),
    ("他说：“我来了。”然后走了。", S, ["他说：“我来了。”", "然后走了。"]),
    ("我们去吧；好的。", S, ["我们去吧；", "好的。"]),
    ("等一下……好吧。", S, ["等一下……", "好吧。"]),
    ("今天，我们去公园、动物园：很开心。", C, ["今天，", "我们去公园、", "动物园：", "很开心。"]),
    ("你好!我很好", S, ["你好!", "我很好"]),
    ("价格是3.5元。好。", S, ["价格是3.5元。", "好。"]),
    ("Mixed 中文 and English. 然后中文。", S, ["Mixed 中文 and English.", "然后中文。"]),
    # clause mode
    ("Well, I think so; maybe: yes.", C, ["Well,", "I think so;", "maybe:", "yes."]),
    ("It costs 1,000 dollars, really.", C, ["It costs 1,000 dollars,", "really."]),
    ('"Hi," she said.', C, ['"Hi,"', "she said."]),
    ("Time 10:30, then go.", C, ["Time 10:30,", "then go."]),
    # line breaks, lists, nothing to say
    ("Title\n\nFirst line.\nSecond line", S, ["Title", "First line.", "Second line"]),
    ("1. First item\n2. Second item", S, ["1. First item", "2. Second item"]),
    ("... !!! ---\nReal text.", S, ["Real text."]),
    ("", S, []),
]

LONG = " ".join(f"word{i}" for i in range(100))  # 689 characters, no punctuation
LONG_CLAUSES = "alpha beta gamma, " * 30  # clause marks every 18 characters
LONG_CHINESE = "好" * 650


def segments_whole(text: str, mode: str, max_chars: int = 300) -> list[str]:
    segmenter = Segmenter(mode, max_chars)  # type: ignore[arg-type]
    return segmenter.feed(text) + segmenter.flush()


def segments_in_pieces(text: str, mode: str, sizes: list[int], max_chars: int = 300) -> list[str]:
    segmenter = Segmenter(mode, max_chars)  # type: ignore[arg-type]
    out: list[str] = []
    at = 0
    for size in sizes:
        out += segmenter.feed(text[at : at + size])
        at += size
    out += segmenter.feed(text[at:])
    return out + segmenter.flush()


def random_sizes(text: str, seed: int) -> list[int]:
    rng = random.Random(seed)
    sizes, total = [], 0
    while total < len(text):
        size = rng.randint(1, 7)
        sizes.append(size)
        total += size
    return sizes


@pytest.mark.parametrize(("text", "mode", "expected"), CASES, ids=[c[0][:30] for c in CASES])
def test_segments(text: str, mode: str, expected: list[str]) -> None:
    assert segments_whole(text, mode) == expected
    assert segments_in_pieces(text, mode, [1] * len(text)) == expected
    for seed in range(5):
        assert segments_in_pieces(text, mode, random_sizes(text, seed)) == expected


def test_the_corpus_is_big_enough() -> None:
    assert len(CASES) >= 40


def test_a_long_sentence_is_cut_at_its_last_space_before_the_limit() -> None:
    got = segments_whole(LONG + ".", S)
    assert all(len(segment) <= 300 for segment in got)
    assert " ".join(got) == LONG + "."
    assert got[0] == " ".join(f"word{i}" for i in range(44))  # 294 chars; word44 would pass 300
    for seed in range(5):
        assert segments_in_pieces(LONG + ".", S, random_sizes(LONG, seed)) == got


def test_a_long_sentence_prefers_its_last_clause_mark() -> None:
    got = segments_whole(LONG_CLAUSES, S)
    assert all(len(segment) <= 300 and segment.endswith(",") for segment in got)
    assert len(got[0]) == 16 * 18 - 1  # 16 clauses of 18 characters, less the trailing space
    assert segments_in_pieces(LONG_CLAUSES, S, random_sizes(LONG_CLAUSES, 1)) == got


def test_text_without_spaces_is_cut_hard_at_the_limit() -> None:
    got = segments_whole(LONG_CHINESE, S)
    assert [len(segment) for segment in got] == [300, 300, 50]
    assert segments_in_pieces(LONG_CHINESE, S, random_sizes(LONG_CHINESE, 2)) == got


def test_a_sentence_is_emitted_once_it_is_certain_and_not_before() -> None:
    segmenter = Segmenter()
    assert segmenter.feed("It costs 3.") == []  # 3.14 or an end?
    assert segmenter.feed("14 now. And") == ["It costs 3.14 now."]
    assert segmenter.feed(" Mr.") == []
    assert segmenter.feed(" Smith") == []
    assert segmenter.feed(' said "hi."') == []  # a closing quote may still come
    assert segmenter.feed(" Then") == ['And Mr. Smith said "hi."']
    assert segmenter.pending == "Then"
    assert segmenter.flush() == ["Then"]
    assert segmenter.pending == ""


def test_chinese_sentences_need_only_the_next_character() -> None:
    segmenter = Segmenter()
    assert segmenter.feed("你好。") == []  # a closing quote may follow
    assert segmenter.feed("我") == ["你好。"]


def test_the_buffer_stays_small_whatever_arrives() -> None:
    segmenter = Segmenter(max_chars=100)
    for _ in range(1000):
        segmenter.feed("word " + " " * 50 + "\n" * 3 + '."!' * 20)
        assert len(segmenter.pending) <= 130


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="mode"):
        Segmenter("word")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_chars"):
        Segmenter(max_chars=3)
