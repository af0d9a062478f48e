"""A function compiled while a stage starts, then run only as it was compiled.

Why: a model may compile more than one decoder step as one graph (the
Qwen3-TTS / Qwen3-Omni code predictor's whole frame: 15 steps and picks) to
save what the steps cost between them on the CPU: a graph entry with its
guards, and the picks run eagerly, each time. Such a function is compiled for
every batch bucket before the process says ready. A call while serving that
fails every compiled graph's guards (an input nobody foresaw) must not compile
in the middle of serving, which would stall every running request for
seconds: it returns None, and the caller takes its uncompiled path, which
gives the same result. It says so once, since that path is right but slower
and would otherwise pass unnoticed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from .inductor_options import step_options
from .switches import switch_on

log = logging.getLogger(__name__)

#: ``OMNI_COMPILE_FRAMES=0``: no whole frames compiled around the steps (a faster start;
#: the frames then step through the compiled steps, with the same results).
FRAMES_SWITCH = "OMNI_COMPILE_FRAMES"


def frames_wanted() -> bool:
    """Whether a model should compile several steps as one graph (:data:`FRAMES_SWITCH`)."""
    return switch_on(FRAMES_SWITCH, "whole frames compiled, the default")


class WarmCompiled:
    """``fn`` through inductor with static shapes: :meth:`compile` at start-up, then calls.

    ``name`` goes to the warning of a call that missed every graph.
    """

    def __init__(self, name: str, fn: Callable[..., Any]):
        self.name = name
        self._compiled = torch.compile(fn, dynamic=False, options=step_options())
        self.graphs = 0  # compiled at start-up (one per distinct input shape)
        self.calls = 0  # served by a compiled graph
        self.misses = 0  # answered None: the caller's uncompiled path ran
        self._warned = False

    def compile(self, *example: torch.Tensor) -> Any:
        """Compile for ``example``'s shapes now (before serving); its output."""
        output = self._compiled(*example)
        self.graphs += 1
        return output

    def __call__(self, *inputs: torch.Tensor) -> Any:
        """The compiled graph's output, or None where no graph compiled at start-up fits.

        Under a Python dispatch mode (a benchmark counting the bytes a step
        reads) the inputs carry keys no graph was traced with: None, quietly.
        """
        if is_in_torch_dispatch_mode():
            return None
        try:
            with torch.compiler.set_stance("fail_on_recompile"):
                output = self._compiled(*inputs)
        except RuntimeError as exc:
            if "fail_on_recompile" not in str(exc):
                raise
            self._missed(exc)
            return None
        self.calls += 1
        return output

    def _missed(self, exc: RuntimeError) -> None:
        self.misses += 1
        if self._warned:
            return
        self._warned = True
        failures = [line.strip() for line in str(exc).splitlines() if line.strip()[:2] == "- "]
        log.warning(
            "engine: %s: a call missed every graph compiled at start-up and ran uncompiled "
            "(said once): %s",
            self.name,
            "; ".join(failures[:2]) or str(exc).splitlines()[0],
        )
