"""Where ``dummy`` weights are drawn: a big model on its GPU, everything else on the CPU.

Run on a GPU by ``make gpu-check`` (marked ``cuda``); the CPU half of the rule
is checked in ``plugins/qwen3_tts/tests/test_loading.py``.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.cuda

DEVICE = os.environ.get("OMNI_CUDA_DEVICE", "cuda")


def _layer(device: str) -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Embedding(10, 8)).to(device)


def test_a_small_model_on_the_gpu_holds_the_weights_it_holds_on_the_cpu():
    from omni_qwen3_tts.weights import dummy_draw_device, dummy_fill

    cpu, gpu = _layer("cpu"), _layer(DEVICE)
    assert dummy_draw_device(gpu).type == "cpu"
    dummy_fill(cpu, 7)
    dummy_fill(gpu, 7)
    for (name, a), b in zip(cpu.state_dict().items(), gpu.state_dict().values(), strict=True):
        assert torch.equal(a, b.cpu()), name


def test_a_big_model_draws_on_its_gpu_and_the_same_seed_gives_the_same_weights(monkeypatch):
    from omni_qwen3_tts import weights

    monkeypatch.setattr(weights, "DEVICE_DRAW_MIN_PARAMETERS", 1)  # "big": any model
    first, second, cpu = _layer(DEVICE), _layer(DEVICE), _layer("cpu")
    assert weights.dummy_draw_device(first) == next(first.parameters()).device
    for module in (first, second, cpu):
        weights.dummy_fill(module, 7)
    a, b, c = (m[0].weight.detach().cpu() for m in (first, second, cpu))
    assert torch.equal(a, b)  # seeded on the device too
    assert not torch.equal(a, c)  # and drawn there, not on the CPU
    assert 0.5 < float(a.std() * 64**0.5) < 2.0  # N(0, 1/fan_in) all the same
