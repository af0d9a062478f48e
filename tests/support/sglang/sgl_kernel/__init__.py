"""A test-only stand-in for SGLang's ``sgl_kernel`` (CUDA kernels) on a CPU without them.

The registry's kernel wheels link CUDA and hold no CPU operators, and SGLang's
CPU kernels must be built from its sources, which this project's CI cannot
fetch. With this module first on ``PYTHONPATH`` every kernel SGLang asks for is
a function that raises ``NotImplementedError``; SGLang then reports no AMX
support and takes its pure-PyTorch paths (``attention_backend="torch_native"``,
``sampling_backend="pytorch"``). Only ``make sglang-env`` / ``make test-sglang``
put it on the path; it must never be installed where real kernels exist.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.0.0+omni-cpu-stand-in"


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)

    def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"sgl_kernel.{name}: the CPU test stand-in has no kernels (tests/support/sglang)"
        )

    unavailable.__name__ = name
    return unavailable
