"""Compiled steps with each layer built once (``layer_regions``) on CUDA: Triton, not C++.

Marked ``cuda`` (run by ``benchmarks/gpu_check.py``). On the CPU the regions
are tested through inductor's C++ backend (``tests/engine/test_layer_regions.py``);
here the same toy decoder compiles through Triton, where a region is its own
kernel set, and must still give eager's output, reuse one traced body, and
write each layer's keys at its own rows of the cache.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.cuda

DEVICE = os.environ.get("OMNI_CUDA_DEVICE", "cuda")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_compiled_step_with_regions_equals_eager_on_cuda(dtype) -> None:
    from torch._dynamo.utils import compilation_time_metrics as metrics

    from omni_core.engine.buckets import StaticPlan
    from omni_core.engine.compiled import StaticContext
    from omni_core.engine.kv_cache import SlotKVCache
    from omni_core.engine.toy_model import TinyDecoder

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    device = torch.device(DEVICE)
    model = TinyDecoder(dim=64, num_heads=4, num_layers=4, seed=11, dtype=dtype, device=device)
    cache = SlotKVCache(model.cache_layout(), 4, 64, spare=True)
    # compiled only: CUDA graphs of a compiled step are the GPU check's frame-graph tests
    context = StaticContext(StaticPlan(True, False, (1, 4), "test"), cache)
    model.prepare_static(context)
    torch._dynamo.reset()
    context.warm_up()
    decoder = model.static
    assert decoder.regions, decoder.note  # a fallback would say why here
    assert len(metrics.get("invoke_subgraph_trace", ())) <= 2 * 4  # a body per shape, no more
    torch.manual_seed(0)
    x = torch.randn(3, 1, 64, device=device).to(dtype)
    positions = torch.tensor([[5], [9], [2]], device=device)
    slots = torch.tensor([0, 1, 2], device=device)
    with torch.inference_mode():
        got = decoder(x, positions, positions, slots)
        keys = decoder.k_cache.clone()
        want = decoder._eager_step(x, positions, positions, slots)
    tolerance = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(got, want, **tolerance)
    torch.testing.assert_close(keys, decoder.k_cache, **tolerance)
    written = keys[:, 0, :, 5].abs().sum(dim=(1, 2))  # slot 0, position 5, every layer
    assert written.gt(0).all()
