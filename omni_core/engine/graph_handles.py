"""Objects a compiled step names by a number because it cannot take them as inputs.

Why: a compiled decode step calls some work through operators of our own
(``omni::blocked_linear``, a mixture's ``omni::looped_mixture``) whose state
dynamo cannot trace, a oneDNN blocked weight or a module that reads counts
on the host. The graph takes the number as a one-element int64 tensor (the
module's ``handle``, :func:`number_tensor`), an input like its weights,
and the operator finds the object by it at run time. A tensor rather than
a Python int, a constant the graph would guard on: one compiled decoder
layer then serves every layer of a stack (:mod:`.layer_regions`), each
calling with its own number. The table is weak: an
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


def number_tensor(module: Any, number: int) -> None:
    """Set ``module.handle``: ``number`` as a CPU int64 tensor, the operator's argument.

    A plain attribute, not a buffer: a module built on the meta device and
    materialised with ``to_empty`` would leave a buffer uninitialised, a
    follower mapping its leader's tensors (weight sharing) would take the
    leader's numbers, which name nothing here, and ``.to()`` would move it.
    The explicit device wins over a ``torch.device("meta")`` context.
    """
    import torch

    module.handle = torch.tensor(number, dtype=torch.int64, device="cpu")
