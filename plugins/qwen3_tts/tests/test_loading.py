"""Loading: the real checkpoint layout, shards, strictness, dummy weights, presets, hub ids."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from omni_qwen3_tts.model import Qwen3TTSModel  # noqa: E402
from omni_qwen3_tts.weights import CheckpointError  # noqa: E402


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _prompt(model: Qwen3TTSModel):
    assert model.prompts is not None
    return model.prompts.custom_voice("Hello the world", "serena", "english")


def test_real_layout_loads_every_tensor_and_matches_dummy(checkpoint_factory, tiny_model):
    model = Qwen3TTSModel.from_pretrained(checkpoint_factory("custom_voice"))
    for name, tensor in tiny_model.network.state_dict().items():
        assert torch.equal(model.network.state_dict()[name], tensor), name
    prompt = _prompt(model)
    assert torch.equal(model.generate(prompt, 8), tiny_model.generate(prompt, 8))


def test_weight_names_follow_the_release_tree(tiny_model, base_model):
    names = set(tiny_model.network.state_dict())
    for expected in (
        "talker.model.codec_embedding.weight",
        "talker.model.text_embedding.weight",
        "talker.model.layers.0.self_attn.q_norm.weight",
        "talker.model.layers.1.mlp.gate_proj.weight",
        "talker.text_projection.linear_fc1.bias",
        "talker.codec_head.weight",
        "talker.code_predictor.model.codec_embedding.14.weight",
        "talker.code_predictor.lm_head.14.weight",
        "talker.code_predictor.model.layers.0.self_attn.k_norm.weight",
    ):
        assert expected in names
    assert not any(n.startswith("speaker_encoder.") for n in names)
    assert "speaker_encoder.asp.tdnn.conv.weight" in base_model.network.state_dict()
    assert tiny_model.speech_tokenizer is not None
    codec = set(tiny_model.speech_tokenizer.state_dict())
    for expected in (
        "decoder.quantizer.rvq_first.vq.layers.0._codebook.embedding_sum",
        "decoder.quantizer.rvq_rest.vq.layers.14._codebook.cluster_usage",
        "decoder.pre_transformer.layers.0.self_attn_layer_scale.scale",
        "decoder.upsample.1.1.dwconv.conv.weight",
        "decoder.decoder.4.block.4.conv1.conv.weight",
        "decoder.decoder.6.conv.weight",
        "encoder.encoder.layers.1.block.1.conv.weight",
        "encoder.encoder_transformer.layers.0.mlp.fc1.weight",
        "encoder.downsample.conv.weight",
        "encoder.quantizer.acoustic_residual_vector_quantizer.layers.0.codebook.embed_sum",
    ):
        assert expected in codec


def test_sharded_index_loads(checkpoint_factory, tmp_path):
    root = _copy(checkpoint_factory("custom_voice"), tmp_path / "sharded")
    state = load_file(str(root / "model.safetensors"))
    (root / "model.safetensors").unlink()
    names = sorted(state)
    halves = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    weight_map = {}
    for file, part in halves.items():
        save_file({n: state[n] for n in part}, str(root / file))
        weight_map.update(dict.fromkeys(part, file))
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    model = Qwen3TTSModel.from_pretrained(root)
    assert torch.equal(model.network.state_dict()[names[1]], state[names[1]].to(model.dtype))


def _rewrite(root: Path, edit) -> None:
    path = root / "model.safetensors"
    state = load_file(str(path))
    edit(state)
    save_file(state, str(path))


def test_missing_tensor_is_named(checkpoint_factory, tmp_path):
    root = _copy(checkpoint_factory("custom_voice"), tmp_path / "missing")
    _rewrite(root, lambda s: s.pop("talker.codec_head.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensor\(s\) talker\.codec_head\.weight"):
        Qwen3TTSModel.from_pretrained(root)


def test_unexpected_tensor_is_named(checkpoint_factory, tmp_path):
    root = _copy(checkpoint_factory("custom_voice"), tmp_path / "unexpected")
    _rewrite(root, lambda s: s.__setitem__("talker.extra.weight", torch.zeros(2)))
    with pytest.raises(CheckpointError, match=r"unexpected tensor\(s\) talker\.extra\.weight"):
        Qwen3TTSModel.from_pretrained(root)


def test_wrong_shape_is_named(checkpoint_factory, tmp_path):
    root = _copy(checkpoint_factory("custom_voice"), tmp_path / "shape")
    _rewrite(root, lambda s: s.__setitem__("talker.model.norm.weight", torch.ones(7)))
    with pytest.raises(CheckpointError, match=r"wrong shape for talker\.model\.norm\.weight"):
        Qwen3TTSModel.from_pretrained(root)


def test_speech_tokenizer_is_strict_too(checkpoint_factory, tmp_path):
    root = _copy(checkpoint_factory("custom_voice"), tmp_path / "codec")
    path = root / "speech_tokenizer" / "model.safetensors"
    state = load_file(str(path))
    state.pop("encoder.downsample.conv.weight")
    save_file(state, str(path))
    with pytest.raises(CheckpointError, match=r"encoder\.downsample\.conv\.weight"):
        Qwen3TTSModel.from_pretrained(root)


def test_index_naming_an_absent_tensor_is_refused(checkpoint_factory, tmp_path):
    root = _copy(checkpoint_factory("custom_voice"), tmp_path / "badindex")
    with safe_open(str(root / "model.safetensors"), framework="pt") as handle:
        names = list(handle.keys())
    weight_map = dict.fromkeys(names, "model.safetensors")
    weight_map["talker.ghost.weight"] = "model.safetensors"
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError, match=r"talker\.ghost\.weight"):
        Qwen3TTSModel.from_pretrained(root)


def test_no_weights_file_says_how_to_run_without(checkpoint_factory, tmp_path):
    root = _copy(checkpoint_factory("custom_voice"), tmp_path / "noweights")
    (root / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="load_format='dummy'"):
        Qwen3TTSModel.from_pretrained(root)


def test_dummy_weights_are_deterministic_per_seed():
    a = Qwen3TTSModel.from_pretrained("tiny", load_format="dummy", seed=3)
    b = Qwen3TTSModel.from_pretrained("tiny", load_format="dummy", seed=3)
    c = Qwen3TTSModel.from_pretrained("tiny", load_format="dummy", seed=4)
    name = "talker.model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(a.network.state_dict()[name], b.network.state_dict()[name])
    assert not torch.equal(a.network.state_dict()[name], c.network.state_dict()[name])
    assert a.speech_tokenizer is not None and b.speech_tokenizer is not None
    for key, value in a.speech_tokenizer.state_dict().items():
        assert torch.equal(value, b.speech_tokenizer.state_dict()[key]), key


def test_dummy_weights_on_the_cpu_are_drawn_there_whatever_the_models_size(monkeypatch):
    """Big models on a GPU draw there (tests/cuda/test_dummy_draw.py); on the CPU every
    model draws from the CPU's generator, and the values are those of a plain seeded draw."""
    from omni_qwen3_tts import weights

    layer = torch.nn.Linear(16, 4, bias=False)
    assert weights.dummy_draw_device(layer).type == "cpu"
    monkeypatch.setattr(weights, "DEVICE_DRAW_MIN_PARAMETERS", 1)
    assert weights.dummy_draw_device(layer).type == "cpu"
    assert weights.dummy_draw_device(torch.nn.ReLU()).type == "cpu"  # no parameters at all
    weights.dummy_fill(layer, 5)
    expected = torch.randn((4, 16), generator=torch.Generator().manual_seed(5)) / 4.0
    assert torch.equal(layer.weight.detach(), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_draws_equal_one_draw_over_the_whole_tensor(monkeypatch, dtype):
    """Chunk edges, tails under 16 values and non-contiguous tensors, each value for value."""
    from omni_qwen3_tts import weights

    monkeypatch.setattr(weights, "DRAW_CHUNK", 32)  # many chunk edges on small tensors
    cpu = torch.device("cpu")
    for size in (1, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65, 79, 100, 1000):
        for std in (None, 0.125):
            target = torch.empty(size, dtype=dtype)
            weights.draw_normal(target, torch.Generator().manual_seed(size), cpu, std)
            whole = torch.randn(size, generator=torch.Generator().manual_seed(size))
            expected = (whole if std is None else whole * std).to(dtype)
            assert torch.equal(target, expected), (size, std)
    strided = torch.empty(40, 30, dtype=dtype).t()  # not contiguous: one draw, copied in
    weights.draw_normal(strided, torch.Generator().manual_seed(1), cpu, 0.5)
    expected = torch.randn((30, 40), generator=torch.Generator().manual_seed(1)) * 0.5
    assert torch.equal(strided, expected.to(dtype))


def test_preset_needs_dummy_weights():
    with pytest.raises(ValueError, match="load_format='dummy'"):
        Qwen3TTSModel.from_pretrained("tiny")


def test_hub_id_offline_fails_with_the_fix(monkeypatch):
    import huggingface_hub

    def offline(*args, **kwargs):
        raise OSError("network unreachable")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(FileNotFoundError, match=r"hf download Qwen/Qwen3-TTS-Nope --local-dir"):
        Qwen3TTSModel.from_pretrained("Qwen/Qwen3-TTS-Nope")


def test_bad_variant_is_refused(tmp_path):
    from omni_qwen3_tts.weights import PRESETS_DIR

    root = _copy(PRESETS_DIR / "tiny", tmp_path / "bad")
    config = json.loads((root / "config.json").read_text())
    config["tts_model_type"] = "karaoke"
    (root / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="tts_model_type is 'karaoke'"):
        Qwen3TTSModel.from_pretrained(root, load_format="dummy")


def test_bfloat16_load(checkpoint_factory):
    model = Qwen3TTSModel.from_pretrained(checkpoint_factory("custom_voice"), dtype="bfloat16")
    assert model.dtype == torch.bfloat16
    codes = model.generate(_prompt(model), 4)
    assert codes.shape[1] == 16


def test_bf16_projections_fused_by_packing_generate_what_separate_ones_do(
    checkpoint_factory, monkeypatch
):
    """q/k/v and gate/up become one product each (talker and code predictor): same codes."""
    from omni_core.engine import cpu_linear

    monkeypatch.setattr(cpu_linear, "ROW_MIN_ELEMENTS", 0)  # the tiny layers get routed too
    root = checkpoint_factory("custom_voice")
    fused = Qwen3TTSModel.from_pretrained(root, dtype="bfloat16")
    separate = Qwen3TTSModel.from_pretrained(root, dtype="bfloat16")
    cpu_linear.pack_linear_weights(fused.network)
    monkeypatch.setattr(cpu_linear, "fuse_sibling_projections", lambda module, kinds: 0)
    cpu_linear.pack_linear_weights(separate.network)
    talker = fused.config.talker
    layers = talker.transformer.num_hidden_layers + talker.code_predictor.num_hidden_layers
    groups = sum("_omni_fusion" in m.__dict__ for m in fused.network.modules())
    assert groups == 2 * layers  # attention's q/k/v and the MLP's gate/up, in every layer
    assert not any("_omni_fusion" in m.__dict__ for m in separate.network.modules())
    for seed in (None, 3):  # greedy, then sampled with the same seed
        temperature = 0.0 if seed is None else 0.9
        want = separate.generate(_prompt(separate), 6, temperature=temperature, seed=seed)
        got = fused.generate(_prompt(fused), 6, temperature=temperature, seed=seed)
        assert torch.equal(got, want)


def test_bf16_weights_blocked_for_onednn_generate_what_dense_ones_do(
    checkpoint_factory, monkeypatch
):
    """The bf16_blocked route (every bf16 layer's weight reordered for oneDNN, q/k/v as one
    blocked product): same codes as the dense weights through F.linear, the product it
    replaces."""
    import torch.nn.functional as F

    from omni_core.engine import cpu_linear
    from omni_core.engine.cpu_kernel_choice import KernelChoice

    if not cpu_linear.blocking_available():
        pytest.skip("this torch build or CPU has no oneDNN bf16 inner product")
    probe = torch.randn(5, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    weight = torch.randn(96, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    blocked_probe = torch.ops.mkldnn._linear_pointwise(
        probe, cpu_linear.block_weight(weight), None, "none", [], ""
    )
    if not torch.equal(blocked_probe, F.linear(probe, weight)):
        pytest.skip("here the blocked and dense kernels round differently (covered per layer)")
    monkeypatch.setattr(cpu_linear, "ROW_MIN_ELEMENTS", 0)  # the tiny layers get routed too
    monkeypatch.setattr(cpu_linear, "_routes", cpu_linear.routes())  # restored afterwards
    root = checkpoint_factory("custom_voice")
    models = {}
    for blocked in (True, False):
        chosen = KernelChoice(0, False, 0, bf16_blocked=blocked, source="test")
        monkeypatch.setattr(cpu_linear, "kernel_choice", lambda onednn=True, c=chosen: c)
        monkeypatch.setattr(cpu_linear, "fuse_sibling_projections", lambda module, kinds: 0)
        models[blocked] = Qwen3TTSModel.from_pretrained(root, dtype="bfloat16")
        cpu_linear.pack_linear_weights(models[blocked].network)
    kinds = {type(m).__name__ for m in models[True].network.modules()}
    assert "BlockedLinear" in kinds and "RowLinear" not in kinds
    assert "BlockedRows" in kinds  # q/k/v: one blocked product per attention layer
    # the dense model's RowLinear layers: F.linear at every row count under these routes
    for seed in (None, 3):  # greedy, then sampled with the same seed
        temperature = 0.0 if seed is None else 0.9
        want = models[False].generate(_prompt(models[False]), 6, temperature=temperature, seed=seed)
        got = models[True].generate(_prompt(models[True]), 6, temperature=temperature, seed=seed)
        assert torch.equal(got, want)


def test_empty_models_are_allocated_once_in_their_dtype() -> None:
    # Allocated in float32 and cast afterwards, MOSS-TTS 8B in bf16 first took 32 GB.
    from torch.utils._python_dispatch import TorchDispatchMode

    from omni_qwen3_tts.layers import register_rope
    from omni_qwen3_tts.weights import build_empty

    allocated: list[tuple[torch.dtype, int]] = []

    class Allocations(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and out.device.type == "cpu":
                allocated.append((out.dtype, out.numel()))
            return out

    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(256, 256)
            register_rope(self, 16, 10000.0)

    with Allocations():
        module = build_empty(Stack, torch.device("cpu"), torch.bfloat16)
    assert module.proj.weight.dtype == torch.bfloat16 and module.inv_freq.dtype == torch.float32
    assert (torch.bfloat16, 256 * 256) in allocated
    assert not [a for a in allocated if a[0] == torch.float32 and a[1] >= 256]
