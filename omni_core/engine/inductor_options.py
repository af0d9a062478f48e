"""What every compiled step asks of inductor beyond its defaults: a wrapper without checks.

Why: inductor writes each graph's driver as Python that, by default, checks
the size, stride and alignment of every input and of every extern kernel's
output (``assert_size_stride``, ``assert_alignment``) and asserts its
unbacked scalars, each call. A decode step on the CPU is hundreds of small
calls, and a Qwen3-TTS code-predictor frame compiled as one graph runs 75
layer passes with about 20 such checks each: about a microsecond apiece,
2.4 ms of a 67 ms frame (``w8a8_int8``, 2 threads; the same frame compiled
both ways and alternated 15 times in one process: 64.8 against 67.2 ms).
The checks guard inductor against its own mistakes about an operator's
output layout; the compiled steps' equality with eager is tested instead
(``test_compiled_decode_steps_equal_eager`` and its kin), and every shape a
step takes was fixed when it compiled.

Someone chasing a wrong compiled result turns them back on with inductor's
own variables (``TORCHINDUCTOR_SIZE_ASSERTS=1`` and its two siblings): a
check whose variable is set is left as the variable says.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

#: inductor's check options, by the environment variable inductor reads for each.
CHECKS = {
    "size_asserts": "TORCHINDUCTOR_SIZE_ASSERTS",
    "alignment_asserts": "TORCHINDUCTOR_ALIGNMENT_ASSERTS",
    "scalar_asserts": "TORCHINDUCTOR_SCALAR_ASSERTS",
}


def step_options(environ: Mapping[str, str] | None = None, **more: Any) -> dict[str, Any]:
    """``torch.compile``'s ``options`` for a decode step: the checks off, then ``more``.

    A check whose variable is in ``environ`` (``os.environ``) is not named,
    so inductor's own reading of that variable stands.
    """
    env = os.environ if environ is None else environ
    options: dict[str, Any] = {name: False for name, var in CHECKS.items() if var not in env}
    options.update(more)
    return options
