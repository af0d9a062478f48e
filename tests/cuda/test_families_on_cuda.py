"""Each family's tiny demo model on CUDA in bfloat16 against the same model in float32 on the CPU.

Marked ``cuda``: skipped, saying why, where ``torch.cuda.is_available()`` is
false (the root conftest); ``benchmarks/gpu_check.py`` runs them first when
a GPU is there (``make gpu-check``). ``OMNI_CUDA_DEVICE`` picks the device
(default ``cuda``).

What is compared: the hidden states each model hands its heads at the
prefill and at two decode steps, teacher-forced (the GPU run is fed the CPU
run's frames, so a near-tie that rounding flips cannot make the two runs
diverge), and for Qwen3-TTS also its codec's waveform for the same codes;
for the Qwen3-Omni thinker the logits of a 12-token prompt. The measure is
the relative L2 error, ``|gpu - cpu| / |cpu|``, and the bound is
``TOLERANCE``: bfloat16 keeps 8 bits of mantissa (0.4 % relative rounding
per value), which a few layers of the tiny models compound to a percent or
two; a wrong kernel, a lost upcast of a norm or softmax, a mis-cast cache or
a wrong dtype on a path gives errors of order one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.cuda

DEVICE = os.environ.get("OMNI_CUDA_DEVICE", "cuda")
TOLERANCE = 0.05  # relative L2 error, bfloat16 on the device vs float32 on the CPU
DECODE_STEPS = 2


def rel_l2(ours: Any, ref: Any) -> float:
    ours, ref = ours.double().cpu(), ref.double().cpu()
    return float((ours - ref).norm() / ref.norm().clamp_min(1e-12))


def run_steps(
    model: Any,
    prompt: Any,
    sampling: Any,
    taken: Callable[[Any], Any],
    forced: list[Any] | None = None,
    put: Callable[[Any, Any], None] | None = None,
) -> tuple[list[Any], list[Any]]:
    """The hidden states the model's heads get at the prefill and ``DECODE_STEPS`` decode steps,
    and what each step took (``taken(seq)``); with ``forced``, step k is fed ``forced[k]``
    (``put(seq, forced[k])``) instead of its own choice: teacher forcing."""
    from omni_core.engine.interface import Sequence
    from omni_core.engine.kv_cache import SlotKVCache

    seq = Sequence("cuda-check", prompt, sampling)
    cache = SlotKVCache(model.cache_layout(), 1, model.prompt_length(prompt) + DECODE_STEPS + 8)
    seq.slot = cache.allocate()
    hidden: list[Any] = []
    emit = model._emit

    def capture(sequences: list[Any], last_hidden: Any) -> Any:
        hidden.append(last_hidden.float().cpu())
        return emit(sequences, last_hidden)

    model._emit = capture
    choices = []
    try:
        model.prefill([seq], cache)
        choices.append(taken(seq))
        for step in range(DECODE_STEPS):
            if forced is not None and put is not None:
                put(seq, forced[step])
            model.decode([seq], cache)
            choices.append(taken(seq))
    finally:
        del model._emit
    return hidden, choices


def assert_close_steps(gpu: list[Any], cpu: list[Any], what: str) -> None:
    assert len(gpu) == len(cpu) == DECODE_STEPS + 1, (len(gpu), len(cpu))
    errors = [rel_l2(g, c) for g, c in zip(gpu, cpu, strict=True)]
    assert max(errors) < TOLERANCE, f"{what}: relative L2 per step {errors} (bound {TOLERANCE})"


def test_qwen3_tts_talker_steps_and_codec_in_bf16_on_cuda_match_float32_on_the_cpu():
    from omni_core.engine.interface import SamplingParams
    from omni_qwen3_tts.model import Qwen3TTSModel

    cpu = Qwen3TTSModel.from_pretrained("tiny", load_format="dummy", seed=0)
    gpu = Qwen3TTSModel.from_pretrained(
        "tiny", load_format="dummy", seed=0, dtype="bfloat16", device=DEVICE
    )
    assert gpu.device.type == torch.device(DEVICE).type and gpu.dtype == torch.bfloat16
    speaker = next(iter(cpu.config.talker.spk_id))
    prompt = cpu.prompts.custom_voice("Hello from the GPU.", speaker, "english")
    greedy = SamplingParams(temperature=0.0, max_new_tokens=DECODE_STEPS + 1, seed=0)

    def taken(seq: Any) -> Any:
        return seq.state["last_codes"].clone().cpu()

    def put(seq: Any, codes: Any) -> None:
        seq.state["last_codes"] = codes.clone()

    cpu_hidden, frames = run_steps(cpu, prompt, greedy, taken)
    gpu_hidden, _ = run_steps(gpu, prompt, greedy, taken, frames, put)
    assert_close_steps(gpu_hidden, cpu_hidden, "Qwen3-TTS talker")

    codes = torch.stack(frames)  # [T, 16], the CPU's frames
    wav_cpu = cpu.decode_audio(codes)
    wav_gpu = gpu.decode_audio(codes.to(gpu.device))
    assert wav_gpu.shape == wav_cpu.shape
    assert rel_l2(wav_gpu.float(), wav_cpu) < TOLERANCE


def test_moss_tts_backbone_steps_in_bf16_on_cuda_match_float32_on_the_cpu():
    from omni_moss_tts.model import MossTTSModel

    cpu = MossTTSModel.from_pretrained("tiny", load_format="dummy", seed=0, with_codec=False)
    gpu = MossTTSModel.from_pretrained(
        "tiny", load_format="dummy", seed=0, dtype="bfloat16", device=DEVICE, with_codec=False
    )
    assert gpu.device.type == torch.device(DEVICE).type and gpu.dtype == torch.bfloat16
    assert cpu.prompts is not None
    prompt = cpu.request(cpu.prompts.build("Hello from the GPU.", max_frames=8), text_temperature=0)
    greedy = cpu.audio_sampling(temperature=0.0, seed=0)

    def taken(seq: Any) -> Any:
        return [row.clone() for row in seq.state["rows"]]

    def put(seq: Any, rows: Any) -> None:
        seq.state["rows"] = [row.clone() for row in rows]

    cpu_hidden, rows = run_steps(cpu, prompt, greedy, taken)
    gpu_hidden, _ = run_steps(gpu, prompt, greedy, taken, rows, put)
    assert_close_steps(gpu_hidden, cpu_hidden, "MOSS-TTS backbone")


def test_qwen3_omni_thinker_logits_in_bf16_on_cuda_match_float32_on_the_cpu():
    from omni_qwen3_omni.loading import load_part

    cpu, _, _ = load_part("tiny", "thinker", "dummy", "float32", "cpu", 0)
    gpu, _, _ = load_part("tiny", "thinker", "dummy", "bfloat16", DEVICE, 0)
    assert next(gpu.parameters()).dtype == torch.bfloat16
    ids = torch.arange(1, 13) * 7
    positions = torch.arange(12).expand(3, 1, 12)

    def logits(lm: Any) -> Any:
        device = next(lm.parameters()).device
        with torch.no_grad():
            hidden = lm(lm.embed(ids.to(device))[None], positions.to(device))
            hidden = hidden[0] if isinstance(hidden, tuple) else hidden
            return lm.logits(hidden).float().cpu()

    assert rel_l2(logits(gpu), logits(cpu)) < TOLERANCE
