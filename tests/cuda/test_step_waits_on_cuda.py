"""A Qwen3-TTS decode step on CUDA waits for the device only where it must read its result.

Marked ``cuda`` (run by ``benchmarks/gpu_check.py``). The GPU check's profile
of Qwen3-TTS 0.6B at c=8 counted 14.6 host waits an engine step: every small
host list (slots, cache starts, lengths, row indices) went over as
``torch.tensor(list, device="cuda")``, a copy from pageable memory that waits
for everything queued, and the vocoder copied each row's audio back on its
own. A step now reads the device twice: codebook 0's ids (which rows ended)
and the finished frames. ``set_sync_debug_mode("warn")`` turns each wait into
a warning whose location is the Python line that waited; the test names them.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.cuda

DEVICE = os.environ.get("OMNI_CUDA_DEVICE", "cuda")
#: The reads a decode step needs: codebook 0's ids, then the frames for the vocoder.
MUST_WAIT = {("talker.py", "ids = code0.tolist()"), ("model.py", "frames_cpu = ")}


def _waits(call: Any) -> list[tuple[str, str]]:
    """Where ``call`` waited for the device: (file name, the line's text) per wait."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            call()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    places = []
    for w in caught:
        if "synchroniz" not in str(w.message):
            continue
        try:
            text = Path(w.filename).read_text().splitlines()[w.lineno - 1].strip()
        except (OSError, IndexError):
            text = f"line {w.lineno}"  # no source to show (a frozen or generated module)
        places.append((Path(w.filename).name, text))
    return places


def _expected(place: tuple[str, str]) -> bool:
    return any(place[0] == name and place[1].startswith(text) for name, text in MUST_WAIT)


def test_a_qwen3_tts_decode_step_waits_only_to_read_its_codes() -> None:
    from omni_core.engine.interface import SamplingParams, Sequence
    from omni_core.engine.kv_cache import SlotKVCache
    from omni_qwen3_tts.model import Qwen3TTSModel

    model = Qwen3TTSModel.from_pretrained(
        "tiny", load_format="dummy", seed=0, dtype="bfloat16", device=DEVICE
    )
    speaker = next(iter(model.config.talker.spk_id))
    sequences = []
    for b, text in enumerate(("Hello from the GPU.", "A second row, longer than the first.")):
        prompt = model.prompts.custom_voice(text, speaker, "english")
        params = SamplingParams(temperature=0.9, top_k=50, max_new_tokens=64, seed=b)
        sequences.append(Sequence(request_id=f"r{b}", prompt=prompt, sampling=params))
    longest = max(model.prompt_length(s.prompt) for s in sequences)
    cache = SlotKVCache(model.cache_layout(), len(sequences), longest + 64)
    for seq in sequences:
        seq.slot = cache.allocate()
    model.prefill(sequences, cache)
    model.decode(sequences, cache)  # kernels chosen, pinned host blocks cached
    for _ in range(3):
        places = _waits(lambda: model.decode(sequences, cache))
        unexpected = [p for p in places if not _expected(p)]
        assert not unexpected, f"the step waited at {unexpected} (all waits: {places})"
        assert len(places) <= len(MUST_WAIT), places
