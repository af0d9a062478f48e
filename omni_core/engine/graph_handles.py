"""Objects a compiled step names by a number because it cannot take them as inputs.

Why: a compiled decode step calls some work through operators of our own
(``omni::blocked_linear``, a mixture's ``omni::looped_mixture``) whose state
dynamo cannot trace, a oneDNN blocked weight or a module that reads counts
on the host. The graph holds a plain integer, a constant it guards on, and
the operator finds the object by it at run time. The table is weak: an
object that is freed leaves it, so a model dropped after compiling takes
its weights with it, and a graph that outlives it fails on the missing
number (a ``KeyError``) instead of computing on freed memory.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

# one counter for every table: a number never names two objects, whichever table holds it
_numbers = itertools.count()


class Handles(weakref.WeakValueDictionary[int, Any]):
    """Objects by number, held weakly (see the module's docstring)."""

    def add(self, obj: Any) -> int:
        """The new number ``obj`` is found by from now on."""
        number = next(_numbers)
        self[number] = obj
        return number
