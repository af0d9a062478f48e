"""omni_core.kit.weights: strict safetensors loading, every mismatch named with its file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import save_file  # noqa: E402

from omni_core.kit.weights import (  # noqa: E402
    Checkpoint,
    CheckpointError,
    checkpoint_files,
    load_state,
)


def tiny() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.LayerNorm(3))


def sharded(root: Path, tensors: dict[str, dict[str, torch.Tensor]], extra=None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for shard, state in tensors.items():
        save_file(state, str(root / shard))
        weight_map.update(dict.fromkeys(state, shard))
    weight_map.update(extra or {})
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return root


def test_a_stage_reads_only_its_prefix_and_strips_it(tmp_path):
    source = tiny()
    state = {f"talker.{k}": v.clone() + 1 for k, v in source.state_dict().items()}
    other = {"thinker.w": torch.ones(1)}
    root = sharded(tmp_path, {"a.safetensors": state, "b.safetensors": other})
    checkpoint = Checkpoint.open(root)
    assert checkpoint.shards_for(("talker.",)) == ["a.safetensors"]
    target = tiny()
    assert checkpoint.load_into(target, ("talker.",), "talker.", "talker") == 4
    assert torch.equal(target[0].weight, state["talker.0.weight"])


def test_every_kind_of_mismatch_is_named_with_its_file(tmp_path):
    state = {k: v.clone() for k, v in tiny().state_dict().items()}
    state.pop("1.bias")
    state["0.bias"] = torch.zeros(5)
    state["extra"] = torch.zeros(1)
    root = sharded(tmp_path, {"s.safetensors": state}, {"ghost": "s.safetensors"})
    with pytest.raises(CheckpointError) as caught:
        Checkpoint.open(root).load_into(tiny(), what="demo")
    message = str(caught.value)
    assert message.startswith(f"demo ({root}): the checkpoint does not match")
    assert "the index lists but the shard lacks: ghost (index says s.safetensors)" in message
    assert "unexpected tensor(s) extra (s.safetensors)" in message
    assert "wrong shape for 0.bias: checkpoint (5,), model (3,)" in message
    assert "missing tensor(s) 0.bias, 1.bias" in message  # 0.bias: its shape was wrong
    with pytest.raises(CheckpointError, match="the index places tensor ghost"):
        checkpoint_files(root)


def test_whole_files_load_by_name_and_a_name_in_two_files_is_refused(tmp_path):
    state = tiny().state_dict()
    save_file(dict(state), str(tmp_path / "model.safetensors"))
    target = tiny()
    load_state(target, checkpoint_files(tmp_path), "demo")
    assert torch.equal(target[1].weight, state["1.weight"])
    save_file({"0.weight": state["0.weight"]}, str(tmp_path / "again.safetensors"))
    files = [tmp_path / "model.safetensors", tmp_path / "again.safetensors"]
    with pytest.raises(CheckpointError, match=r"'0\.weight' appears twice"):
        load_state(tiny(), files, "demo")


def test_a_directory_without_weights_or_with_a_missing_shard_says_so(tmp_path):
    with pytest.raises(CheckpointError, match="load_format='dummy'"):
        Checkpoint.open(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "model-00002.safetensors"}})
    )
    with pytest.raises(CheckpointError, match=r"shard file\(s\) missing: model-00002"):
        Checkpoint.open(tmp_path)


def test_fill_shared_loads_a_directory_strictly_or_calls_the_familys_dummy_fill(tmp_path):
    from omni_core.kit.weights import fill_shared

    state = tiny().state_dict()
    save_file(dict(state), str(tmp_path / "model.safetensors"))
    seen = []
    loaded = fill_shared("k-auto", tiny(), "auto", tmp_path, seen.append)
    assert torch.equal(loaded[1].weight, state["1.weight"]) and not seen
    dummy = fill_shared("k-dummy", tiny(), "dummy", tmp_path / "absent", seen.append)
    assert seen == [dummy]  # dummy weights read no file
    save_file({"0.weight": state["0.weight"]}, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"1\.weight"):
        fill_shared("k-partial", tiny(), "auto", tmp_path, seen.append)
