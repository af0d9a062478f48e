"""Incremental detokenisation and stop strings, on a byte-level toy vocabulary."""

from __future__ import annotations

from omni_qwen3_omni.detokenize import Detokenizer, StopMatcher

# Each token is some bytes; a multi-byte character may be split across tokens.
VOCAB = {1: b"Hel", 2: b"lo", 3: b" ", 4: "é".encode()[:1], 5: "é".encode()[1:], 6: b"!", 9: b""}


def _decode(ids: list[int]) -> str:
    return b"".join(VOCAB[i] for i in ids).decode("utf-8", errors="replace")


def test_deltas_never_split_a_character_and_add_up_to_the_whole_text():
    detok = Detokenizer(_decode, skip={9})
    deltas = [detok.feed(t) for t in [1, 2, 3, 4, 5, 9, 6]]
    assert deltas == ["Hel", "lo", " ", "", "é", "", "!"]
    assert "".join(deltas) + detok.flush() == "Hello é!"


def test_flush_sends_an_unfinished_character_at_the_end():
    detok = Detokenizer(_decode)
    assert detok.feed(4) == ""
    assert detok.flush() == "\ufffd"


def test_a_stop_string_split_across_deltas_is_cut_and_never_sent():
    stop = StopMatcher(["END", "##"])
    sent = []
    for piece in ["Hello E", "N", "D and more"]:
        text, hit = stop.feed(piece)
        sent.append(text)
        if hit:
            break
    assert "".join(sent) == "Hello "
    assert hit


def test_text_held_back_for_a_possible_stop_comes_out_at_the_end():
    stop = StopMatcher(["STOP"])
    text, hit = stop.feed("ends with ST")
    assert (text, hit) == ("ends with", False)
    assert stop.flush() == " ST"
    assert StopMatcher([]).feed("abc") == ("abc", False)
