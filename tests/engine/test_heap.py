"""Converted weights give their memory back (omni_core.engine.heap, quantize's conversion)."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import weakref

import pytest
import torch
from torch import nn

from omni_core.engine import quantize

# A fresh interpreter, so that the heap holds nothing but this. Freeing a 32 MB
# block first raises glibc's mmap threshold, as loading a checkpoint does: the
# layers' weights then live in the heap, where freed chunks stay unless trimmed.
CONVERT = """
import json, sys
from pathlib import Path
import torch
from torch import nn
from omni_core.engine import quantize

def resident():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon"):
            return int(line.split()[1]) * 1024

big = torch.ones(32 << 20, dtype=torch.uint8)
del big
layers = nn.Sequential(
    *[nn.Linear(1024, 1536, bias=False, dtype=torch.bfloat16) for _ in range(64)]
)
before = resident()
converted = quantize.quantize_linear_weights(layers)
print(json.dumps({"converted": converted, "before": before, "after": resident()}))
"""


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="resident memory read from /proc; the trim is glibc's",
)
def test_an_int8_conversion_leaves_the_process_holding_less_than_before():
    """64 bf16 layers (192 MB) become int8 (96 MB): the process holds about 96 MB less.

    Without the trim it held 238 MB more than before (the freed bf16 chunks
    kept in the heap next to the new int8 ones).
    """
    done = subprocess.run(
        [sys.executable, "-c", CONVERT], capture_output=True, text=True, check=True, timeout=120
    )
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["converted"] == 64
    saved = 64 * 1024 * 1536  # bf16 bytes minus int8 bytes
    assert figures["after"] <= figures["before"] - 0.75 * saved, figures


def test_each_layer_is_released_as_soon_as_it_is_converted(monkeypatch):
    """The peak is one model, not two: no layer outlives its conversion."""
    layers = nn.Sequential(*[nn.Linear(64, 96, bias=False, dtype=torch.bfloat16) for _ in range(4)])
    first = weakref.ref(layers[0])
    alive_at_last: list[bool] = []
    original = quantize.Int8Linear

    class Watching(original):  # type: ignore[misc, valid-type]
        def __init__(self, linear: nn.Linear):
            if linear is layers[3]:
                alive_at_last.append(first() is not None)
            super().__init__(linear)

    monkeypatch.setattr(quantize, "Int8Linear", Watching)
    assert quantize.quantize_linear_weights(layers, min_elements=1) == 4
    assert alive_at_last == [False]
