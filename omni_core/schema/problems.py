"""One validation error that carries several problems, each with the fields it concerns."""

from __future__ import annotations


class SchemaProblems(ValueError):
    """Several problems of one model, each with the fields it concerns.

    The config resolver uses the fields to say which file line or flag wrote
    the offending value.
    """

    def __init__(self, problems: list[tuple[tuple[str, ...], str]]):
        self.problems = problems
        super().__init__("; ".join(message for _, message in problems))
