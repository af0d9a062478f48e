"""``engine.cpu_weight_prepack``: compiled CPU steps over weights packed for a GEMM template.

The rules (which decoders, which settings) run anywhere; the compile runs on
a CPU with AMX tiles (this project's machines have them) and is skipped
elsewhere, saying why.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from omni_core.engine import cpu_cache, prepack  # noqa: E402
from omni_core.engine.backends import EngineSettingsError, validate_engine_settings  # noqa: E402
from omni_core.engine.buckets import StaticPlan, static_plan  # noqa: E402
from omni_core.engine.compiled import StaticContext  # noqa: E402
from omni_core.engine.cpu_linear import RowLinear, pack_linear_weights  # noqa: E402
from omni_core.engine.fused_linear import _FUSION  # noqa: E402
from omni_core.engine.interface import EngineSettings  # noqa: E402
from omni_core.engine.kv_cache import SlotKVCache  # noqa: E402
from omni_core.engine.toy_model import TinyDecoder  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.*:DeprecationWarning")

needs_amx = pytest.mark.skipif(
    not prepack.amx_available(), reason="prepacked steps need a CPU with AMX tiles"
)


def test_prepacking_needs_compiled_steps():
    with pytest.raises(ValueError, match="set enable_torch_compile = true too"):
        EngineSettings(cpu_weight_prepack=True)
    with pytest.raises(EngineSettingsError, match="engine: cpu_weight_prepack packs") as caught:
        validate_engine_settings("tts_engine", {"cpu_weight_prepack": True})
    assert caught.value.keys == ("cpu_weight_prepack",)  # located where the user set it
    settings = EngineSettings(enable_torch_compile=True, cpu_weight_prepack=True)
    assert settings.cpu_weight_prepack


def test_the_plan_prepacks_only_compiled_cpu_steps():
    settings = EngineSettings(enable_torch_compile=True, cpu_weight_prepack=True)
    cpu = static_plan(settings, "cpu")
    assert cpu.prepack and "prepacked where they fit" in cpu.reason
    assert not static_plan(settings, "cuda").prepack
    plain = static_plan(EngineSettings(enable_torch_compile=True), "cpu")
    assert not plain.prepack and "prepacked" not in plain.reason


def test_the_last_level_cache_is_the_largest_level(tmp_path, monkeypatch):
    for index, (level, size) in enumerate([(1, "48K"), (2, "2048K"), (3, "491520K")]):
        entry = tmp_path / f"index{index}"
        entry.mkdir()
        (entry / "level").write_text(f"{level}\n")
        (entry / "size").write_text(f"{size}\n")
    monkeypatch.setattr(cpu_cache, "_CACHE_ROOT", tmp_path)
    cpu_cache.last_level_cache_bytes.cache_clear()
    try:
        assert prepack.last_level_cache_bytes() == 491520 * 1024  # what prepack reads
        monkeypatch.setattr(cpu_cache, "_CACHE_ROOT", tmp_path / "absent")
        cpu_cache.last_level_cache_bytes.cache_clear()
        assert prepack.last_level_cache_bytes() is None
    finally:
        cpu_cache.last_level_cache_bytes.cache_clear()


def test_only_bf16_cpu_steps_that_fit_the_cache_are_prepacked(monkeypatch):
    model = TinyDecoder(num_layers=1, dim=64, dtype=torch.bfloat16)
    cpu, bf16 = torch.device("cpu"), torch.bfloat16
    monkeypatch.setattr(prepack, "amx_available", lambda: True)
    monkeypatch.setattr(prepack, "last_level_cache_bytes", lambda: 1 << 30)
    assert prepack.refusal(model.stack, bf16, cpu) is None
    assert prepack.refusal(model, bf16, cpu) is None  # a module as the step (a talker's model)
    assert "not bfloat16" in prepack.refusal(model.stack, torch.float32, cpu)
    assert "not the CPU" in prepack.refusal(model.stack, bf16, torch.device("meta"))
    assert "neither a module nor a module's method" in prepack.refusal(lambda *a: a, bf16, cpu)
    size = prepack.product_bytes(model)
    monkeypatch.setattr(prepack, "last_level_cache_bytes", lambda: size - 1)
    assert "do not fit the last-level cache" in prepack.refusal(model.stack, bf16, cpu)
    monkeypatch.setattr(prepack, "last_level_cache_bytes", lambda: None)
    assert "does not say" in prepack.refusal(model.stack, bf16, cpu)
    monkeypatch.setattr(prepack, "amx_available", lambda: False)
    assert "no AMX" in prepack.refusal(model.stack, bf16, cpu)


def test_an_int8_step_is_prepacked_whatever_its_size(monkeypatch):
    """torch's int8 kernel is bound by arithmetic: the template gains from memory too."""
    from omni_core.engine.quantize import quantize_linear_weights

    model = TinyDecoder(num_layers=1, dim=64, dtype=torch.bfloat16)
    assert quantize_linear_weights(model) > 0
    assert prepack.has_int8_layers(model)
    monkeypatch.setattr(prepack, "amx_available", lambda: True)
    monkeypatch.setattr(prepack, "last_level_cache_bytes", lambda: 1)
    assert prepack.refusal(model.stack, torch.bfloat16, torch.device("cpu")) is None
    assert "not bfloat16" in prepack.refusal(model.stack, torch.float32, torch.device("cpu"))
    assert not prepack.has_int8_layers(TinyDecoder(num_layers=1, dim=64))


def test_product_weights_are_counted_once_when_tied_and_embeddings_not_at_all():
    from omni_core.engine.quantize import Int8Linear
    from omni_core.engine.w8a8 import W8A8Linear, w8a8_problem

    layer = nn.Linear(8, 4, bias=False)
    tied = nn.ModuleDict({"a": layer, "b": layer, "table": nn.Embedding(1000, 8)})
    assert prepack.product_bytes(tied) == 8 * 4 * 4
    int8 = Int8Linear(nn.Linear(8, 4, bias=False).to(torch.bfloat16))
    assert prepack.product_bytes(int8) == 8 * 4 * 1 + 4 * 2  # int8 weights + bf16 scales
    if w8a8_problem() is None:  # w8a8_int8: int8 weights + float32 scales, in oneDNN's layout
        assert prepack.product_bytes(W8A8Linear(torch.ones(4, 8), None)) == 8 * 4 + 4 * 4


def test_routed_layers_and_fused_products_become_template_layers_with_the_same_outputs():
    class Block(nn.Module):
        sibling_projections = (("gate", "up"),)

        def __init__(self):
            super().__init__()
            self.gate, self.up = nn.Linear(256, 512, bias=False), nn.Linear(256, 512, bias=False)
            self.down = nn.Linear(512, 256, bias=False)

    block = Block().to(torch.bfloat16)
    pack_linear_weights(block)
    fused = block.gate.__dict__[_FUSION].product
    assert type(block.down) is RowLinear and type(fused) is RowLinear
    x = torch.randn(1, 512, dtype=torch.bfloat16)
    before = block.down(x)
    assert prepack.route_to_template(block) == 4  # gate, up, down and the fused product
    assert type(block.down) is prepack.TemplateRowLinear
    assert type(fused) is prepack.TemplateRowLinear
    assert torch.equal(block.down(x), before)  # eager calls keep RowLinear's kernel


def test_a_step_that_does_not_qualify_compiles_as_usual_and_says_why():
    model = TinyDecoder(num_layers=1, dim=64)  # float32
    cache = SlotKVCache(model.cache_layout(), 2, 16, spare=True)
    context = StaticContext(StaticPlan(True, False, (1,), "test", prepack=True), cache)
    model.prepare_static(context)
    assert not model.static.prepacked
    assert model.static.note == (
        "toy decoder: weights not prepacked (its weights are float32, not bfloat16)"
    )


@needs_amx
@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
def test_a_prepacked_step_runs_the_gemm_template_and_equals_eager(capsys, int8):
    """Two buckets of a bf16 toy decoder compiled prepacked: eager's hidden states, in tolerance.

    int8: its layers int8 weight-only first, whose products the template takes too.
    """
    from torch._dynamo.utils import counters
    from torch._inductor import config as inductor_config

    from omni_core.engine.quantize import quantize_linear_weights

    model = TinyDecoder(num_layers=2, dim=128, num_heads=4, dtype=torch.bfloat16, seed=3)
    converted = quantize_linear_weights(model) if int8 else 0
    assert converted == (8 if int8 else 0)  # every block projection, never the head
    cache = SlotKVCache(model.cache_layout(), 2, 16, spare=True)
    context = StaticContext(StaticPlan(True, False, (1, 2), "test", prepack=True), cache)
    model.prepare_static(context)
    decoder = model.static
    assert decoder.prepacked and "packed for inductor's CPU GEMM template" in decoder.note
    assert "each of its 2 compiled graphs" in decoder.note
    counters["inductor"].clear()
    with inductor_config.patch(fx_graph_cache=False):  # generate the kernels, not a cache hit
        context.warm_up()
    # a templated kernel per product, the int8 ones included (at least one per int8 layer)
    assert counters["inductor"]["cpp_templated_kernel_counter"] >= max(converted, 1)

    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for step in range(3):  # each step writes the cache the next one reads
            x = torch.randn(2, 1, model.dim, generator=generator).to(torch.bfloat16)
            where = torch.full((2, 1), step)
            slots = torch.arange(2)
            compiled = decoder(x, where, where, slots)
            eager = decoder._eager_step(x, where, where, slots)
            torch.testing.assert_close(compiled.float(), eager.float(), atol=3e-2, rtol=3e-2)
