"""``bench_qwen3_tts.ours`` and ``bench_moss_tts.ours`` size their cache as a served GPU
stage does when asked.

The GPU check measures Qwen3-TTS and MOSS-TTS with the cache the stages of
``examples/qwen3_tts.toml`` and ``examples/moss_tts.toml`` would have on that
GPU (a share of its memory, slots of up to the model's positions), so that
its rows read the attention spans a deployment
reads; a cache of 512 positions a request once hid a compiled step that read
its whole slot. Here the device's memory is handed to the engine (there is
no GPU), as ``TorchEngine``'s ``device_memory`` parameter allows.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import anyio
import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tts_bench(load_script) -> Iterator[ModuleType]:
    with load_script("bench_qwen3_tts.py") as module:
        yield module


def _tiny(bench: ModuleType, tmp_path: Path, frames: int):
    from omni_qwen3_tts.model import Qwen3TTSModel

    bench.write_configs(tmp_path, frames, "tiny")
    return Qwen3TTSModel.from_pretrained(
        tmp_path, load_format="dummy", seed=0, dtype="float32", device="cpu"
    )


def test_a_memory_share_sizes_the_cache_from_the_devices_memory(
    tts_bench, tmp_path, monkeypatch, capsys
):
    from omni_core.engine.budget import bytes_per_token

    model = _tiny(tts_bench, tmp_path, frames=2)
    memory = 2**30  # as a device would report it
    monkeypatch.setattr(
        tts_bench, "TorchEngine", functools.partial(tts_bench.TorchEngine, device_memory=memory)
    )
    runs = anyio.run(
        functools.partial(tts_bench.ours, model, 2, [1, 2], None, None, False, memory_share=0.5)
    )
    assert [r.concurrency for r in runs] == [1, 2] and all(r.audio_s > 0 for r in runs)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("engine cache:"))
    layout = model.cache_layout()
    per_slot = min(memory // 2 // bytes_per_token(layout) // 2, layout.max_positions)
    assert line.startswith(f"engine cache: 2 slots of {per_slot} positions (memory")
    assert per_slot > 512  # not the default sizing's 512 a request


def test_without_a_share_the_cache_holds_512_positions_a_request(tts_bench, tmp_path, capsys):
    model = _tiny(tts_bench, tmp_path, frames=2)
    anyio.run(functools.partial(tts_bench.ours, model, 2, [1], None, None, False))
    out = capsys.readouterr().out
    assert "engine cache: 1 slots of 512 positions (max_total_tokens)" in out


@pytest.fixture(scope="module")
def moss_bench(load_script) -> Iterator[ModuleType]:
    with load_script("bench_moss_tts.py") as module:
        yield module


def test_moss_sizes_its_cache_from_a_memory_share_too(moss_bench, monkeypatch, capsys):
    """The MOSS-TTS rows of the GPU check pass ``examples/moss_tts.toml``'s share."""
    from omni_core.engine.backends import create_engine
    from omni_moss_tts import stages

    memory = 2**30
    monkeypatch.setattr(
        stages, "create_engine", functools.partial(create_engine, device_memory=memory)
    )
    runs, _, _ = anyio.run(
        functools.partial(moss_bench.ours, "tiny", 2, [1], 0, None, "dummy", memory_share=0.5)
    )
    assert runs[0].audio_s > 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("engine cache:"))
    assert re.fullmatch(r"engine cache: 1 slots of \d+ positions \(memory.*\)", line), line
    assert int(line.split()[5]) > 1024 + 2  # not the default sizing's room a request
