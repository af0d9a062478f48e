"""Where a value came from, and the patch that carries it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any


class Layer(IntEnum):
    """Precedence between sources: model default < deploy file < command line."""

    DEFAULT = 0
    FILE = 1
    CLI = 2


class Rank(IntEnum):
    """Precedence inside one layer: broadcast < [[shared]] < explicit path."""

    BROADCAST = 0
    SHARED = 1
    EXPLICIT = 2


@dataclass(frozen=True)
class Origin:
    """A human-readable origin: ``deploy.toml:7``, ``--mps``, ``[[shared]] #1 (deploy.toml:12)``."""

    label: str
    layer: Layer
    rank: Rank = Rank.EXPLICIT

    def __str__(self) -> str:
        return self.label


DEFAULT_ORIGIN = Origin("model default", Layer.DEFAULT)

Path = tuple[str, ...]


@dataclass
class Patch:
    """One write of one value to one path, in the order sources produced it."""

    path: Path
    value: Any
    origin: Origin
    seq: int = 0

    @property
    def precedence(self) -> tuple[int, int, int, int]:
        # Deeper paths apply after their containers; later writes after earlier.
        return (self.origin.layer, self.origin.rank, len(self.path), self.seq)


def dotted(path: Path) -> str:
    return ".".join(path)
