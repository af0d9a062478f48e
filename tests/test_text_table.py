"""The boxed tables of `omni plan` and `omni plugins list` fit the width they are given."""

from __future__ import annotations

from omni_core.text_table import box_table

STAGES = "image_encoder, audio_encoder, thinker, code2wav"


def widths(table: str) -> set[int]:
    return {len(line) for line in table.splitlines()}


def cell_lines(table: str, column: int) -> list[str]:
    rows = [line.strip("│").split("│") for line in table.splitlines() if line.startswith("│")]
    return [row[column].strip() for row in rows[1:]]


def test_a_table_that_fits_is_drawn_as_it_is():
    table = box_table(["process", "stages"], [["thinker", STAGES]], 200)
    assert cell_lines(table, 1) == [STAGES]
    # tabulate pads a header by two spaces; the stages column is as wide as its text
    assert widths(table) == {len("│ process   │ ") + len(STAGES) + len(" │")}


def test_the_widest_column_folds_between_words_to_fit():
    table = box_table(["process", "where", "stages"], [["thinker", "GPU 0", STAGES]], 40)
    assert max(widths(table)) <= 40
    assert cell_lines(table, 0) == ["thinker", "", "", ""]  # the narrow columns keep their text
    assert " ".join(cell_lines(table, 2)) == STAGES  # every word, none split
    assert all(len(line) <= 16 for line in cell_lines(table, 2))


def test_cells_of_several_lines_and_an_empty_table():
    table = box_table(["plugin", "hooks"], [["a", "one\ntwo"]], 80)
    assert cell_lines(table, 1) == ["one", "two"]
    empty = box_table(["plugin", "hooks"], [], 80)
    assert "plugin" in empty and len(empty.splitlines()) == 4  # top, header, rule, bottom


def test_words_are_not_split_to_fit_an_impossible_width():
    table = box_table(["a", "b"], [["image_encoder", "audio_encoder"]], 10)
    assert cell_lines(table, 0) == ["image_encoder"] and cell_lines(table, 1) == ["audio_encoder"]
