"""Boxed text tables that fit a terminal's width, for ``omni plan`` and ``omni plugins list``.

tabulate draws them: it costs a few milliseconds to import where rich cost
~60 ms, and these commands are meant to answer at interactive speed. Cells
may hold several lines; a table wider than ``width`` has its widest columns
folded onto more lines (between words where it can) until it fits.
"""

from __future__ import annotations

from collections.abc import Sequence

LONGEST_UNBROKEN = 24  # a word longer than this may be split to make a table fit


def box_table(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int) -> str:
    """``rows`` under ``headers`` in a box, at most ``width`` characters wide where possible."""
    from tabulate import tabulate

    columns = [[str(header), *(str(row[i]) for row in rows)] for i, header in enumerate(headers)]
    limits = _fit(columns, width)
    natural = [_longest(column) for column in columns]
    folded = [None if limit >= size else limit for limit, size in zip(limits, natural, strict=True)]
    return tabulate(
        [list(row) for row in rows],
        headers=list(headers),
        tablefmt="simple_outline",
        maxcolwidths=folded if rows else None,
        disable_numparse=True,
    )


def _longest(column: list[str]) -> int:
    return max((len(line) for cell in column for line in cell.splitlines()), default=0)


def _fit(columns: list[list[str]], width: int) -> list[int]:
    """Content widths whose table fits ``width``, narrowing the widest column first."""
    limits = [_longest(column) for column in columns]
    floors = [
        min(LONGEST_UNBROKEN, max((len(w) for cell in col for w in cell.split()), default=1))
        for col in columns
    ]
    # tabulate pads a header by two spaces; each cell has "│ " before it and " "
    # after; the table ends with "│".
    minimum = [len(column[0]) + 2 for column in columns]

    def drawn() -> int:
        return (
            sum(max(lim, low) for lim, low in zip(limits, minimum, strict=True))
            + 3 * len(limits)
            + 1
        )

    while drawn() > width:
        narrowable = [i for i in range(len(limits)) if limits[i] > max(floors[i], minimum[i])]
        if not narrowable:
            break  # every column is at its narrowest: the table overflows
        widest = max(narrowable, key=limits.__getitem__)
        limits[widest] = max(floors[widest], minimum[widest], limits[widest] - (drawn() - width))
    return limits
