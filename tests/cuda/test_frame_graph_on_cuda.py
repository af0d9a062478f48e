"""A Qwen3-TTS code-predictor frame captured whole as a CUDA graph picks the per-pick path's codes.

Marked ``cuda`` (run by ``benchmarks/gpu_check.py``). The GPU check's profile
of Qwen3-TTS 0.6B at c=8 counted 936 kernel launches an engine step, most of
them the 15 picks of the code predictor's frame launched from Python between
replays of its captured step. Each batch bucket's whole frame (steps, heads,
sampling) is now one graph; its picks must be the ones the per-pick path
makes for the same rows and the same generators, and replaying it must not
wait for the device.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.cuda

DEVICE = os.environ.get("OMNI_CUDA_DEVICE", "cuda")


@pytest.mark.parametrize("filtered", ["top-k as usual", "top-p too"])
def test_a_captured_frame_picks_the_per_pick_paths_codes_without_waiting(filtered: str) -> None:
    from omni_core.engine.buckets import StaticPlan
    from omni_core.engine.compiled import StaticContext
    from omni_qwen3_tts.model import Qwen3TTSModel
    from omni_qwen3_tts.sampling import RowSampling

    model = Qwen3TTSModel.from_pretrained(
        "tiny", load_format="dummy", seed=0, dtype="bfloat16", device=DEVICE
    )
    predictor = model.talker.code_predictor
    usual = RowSampling(temperature=0.9, top_k=50)
    context = StaticContext(StaticPlan(False, True, (1, 2, 4), "test"), None)
    predictor.prepare_static(context, model.dtype, model.device, usual)
    context.warm_up()
    vocab = model.config.talker.code_predictor.vocab_size
    shapes = [(50, False), (vocab, True)]
    assert sorted(predictor.frame_graphs) == sorted(
        (b, w, n) for b in (1, 2, 4) for w, n in shapes
    ), context.notes
    assert any("captured as one CUDA graph" in note for note in context.notes)

    rows = [usual, RowSampling(greedy=True), RowSampling(temperature=1.2, top_k=9)]
    if filtered == "top-p too":
        rows[2] = RowSampling(temperature=1.2, top_p=0.6)
    width = model.config.talker.transformer.hidden_size
    draw = torch.Generator(device=model.device).manual_seed(3)
    hidden, code0 = torch.randn(2, 3, width, generator=draw, device=model.device)
    hidden, code0 = hidden.to(model.dtype), code0.to(model.dtype)

    def generators() -> list[torch.Generator]:
        return [torch.Generator(device=model.device).manual_seed(30 + b) for b in range(3)]

    with torch.inference_mode():  # as the engine steps
        predictor.generate_frame(hidden, code0, rows, generators())  # settings cached
    static_calls = predictor.static.calls
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        captured = predictor.generate_frame(hidden, code0, rows, generators())  # no_grad only
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert predictor.static.calls == static_calls  # the frame graph ran, not the per-pick path
    graphs, predictor.frame_graphs = predictor.frame_graphs, {}
    per_pick = predictor.generate_frame(hidden, code0, rows, generators())
    predictor.frame_graphs = graphs
    assert predictor.static.calls == static_calls + 15
    assert torch.equal(captured, per_pick)
    again = predictor.generate_frame(hidden, code0, rows, generators())
    assert torch.equal(again, captured)  # the output was copied out of the graph's buffer
