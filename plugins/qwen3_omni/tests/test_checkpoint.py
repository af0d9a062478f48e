"""Stage-scoped loading of a sharded checkpoint: each stage reads its own tensors only."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import save_file  # noqa: E402
from torch import nn  # noqa: E402

from omni_qwen3_omni.checkpoint import (  # noqa: E402
    OWNERS,
    Checkpoint,
    CheckpointError,
    check_coverage,
)


class TinyThinker(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.Linear(3, 2, bias=False)
        self.lm_head = nn.Linear(2, 5, bias=False)


def _write(root: Path, shards: dict[str, dict[str, torch.Tensor]]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for shard, tensors in shards.items():
        save_file(tensors, str(root / shard))
        weight_map.update(dict.fromkeys(tensors, shard))
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return root


def _release_like(tmp_path: Path, **thinker_overrides: torch.Tensor) -> Path:
    thinker = {
        "thinker.model.weight": torch.arange(6.0).reshape(2, 3),
        "thinker.lm_head.weight": torch.ones(5, 2),
        **thinker_overrides,
    }
    return _write(
        tmp_path / "ckpt",
        {
            "model-00001-of-00003.safetensors": thinker,
            "model-00002-of-00003.safetensors": {"thinker.audio_tower.conv.weight": torch.ones(4)},
            "model-00003-of-00003.safetensors": {
                "talker.codec_head.weight": torch.ones(2, 2),
                "code2wav.pre.weight": torch.ones(3),
            },
        },
    )


def test_a_stage_reads_only_the_shards_that_hold_its_tensors(tmp_path):
    root = _release_like(tmp_path)
    # Make the talker's shard unreadable garbage: the thinker must not touch it.
    (root / "model-00003-of-00003.safetensors").write_bytes(b"\0" * 64)
    checkpoint = Checkpoint.open(root)
    assert checkpoint.shards_for(OWNERS["thinker"]) == ["model-00001-of-00003.safetensors"]
    module = TinyThinker()
    count = checkpoint.load_into(module, OWNERS["thinker"], "thinker.", "stage 'thinker'")
    assert count == 2
    assert torch.equal(module.model.weight, torch.arange(6.0).reshape(2, 3))


def test_wrong_shapes_missing_and_unexpected_tensors_are_named(tmp_path):
    root = _release_like(
        tmp_path,
        **{"thinker.lm_head.weight": torch.ones(4, 2), "thinker.model.extra": torch.ones(1)},
    )
    checkpoint = Checkpoint.open(root)
    module = TinyThinker()
    with pytest.raises(CheckpointError) as caught:
        checkpoint.load_into(module, OWNERS["thinker"], "thinker.", "stage 'thinker'")
    message = str(caught.value)
    assert "thinker.lm_head.weight: checkpoint (4, 2), model (5, 2)" in message
    assert "unexpected tensor(s) thinker.model.extra" in message
    assert "missing tensor(s) thinker.lm_head.weight" in message


def test_coverage_gives_every_tensor_one_owner_and_refuses_orphans(tmp_path):
    root = _release_like(tmp_path)
    checkpoint = Checkpoint.open(root)
    every_stage = check_coverage(checkpoint, OWNERS)
    taken = sorted(name for names in every_stage.values() for name in names)
    assert taken == sorted(checkpoint.weight_map)  # each exactly once across the stages
    text_only = check_coverage(checkpoint, ["audio_encoder", "image_encoder", "thinker"])
    assert "talker_ar" not in text_only  # the text variant does not read the talker
    orphan = _write(tmp_path / "orphan", {"a.safetensors": {"thinker.mystery.w": torch.ones(1)}})
    with pytest.raises(CheckpointError, match=r"no stage reads: thinker\.mystery\.w"):
        check_coverage(Checkpoint.open(orphan), OWNERS)


def test_an_index_naming_a_missing_shard_is_refused(tmp_path):
    root = _release_like(tmp_path)
    (root / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"shard file\(s\) missing: model-00002"):
        Checkpoint.open(root)


def test_parts_are_built_in_their_dtype_layer_by_layer_and_keep_float32_tables() -> None:
    # Cast only after the whole build, the 30B-A3B thinker needed its float32 size on an
    # H200 (122 GB) before the cast to bf16 and ran out of memory in the GPU check.
    from omni_qwen3_omni.loading import construct
    from omni_qwen3_tts.layers import register_rope

    seen: dict[str, torch.dtype] = {}

    class Probe(nn.Module):
        def __init__(self):
            super().__init__()
            self.first = nn.Linear(4, 4)
            seen["first, while the second is built"] = self.first.weight.dtype
            other = threading.Thread(target=lambda: seen.update(other=nn.Linear(2, 2).weight.dtype))
            other.start()
            other.join()
            self.second = nn.Linear(4, 4)
            self.scale = nn.Parameter(torch.ones(4))
            self.ids = nn.Parameter(torch.zeros(2, dtype=torch.long), requires_grad=False)
            register_rope(self, 8, 10000.0)

    probe = construct(Probe, torch.device("cpu"), torch.bfloat16)
    assert seen == {"first, while the second is built": torch.bfloat16, "other": torch.float32}
    assert {p.dtype for n, p in probe.named_parameters() if n != "ids"} == {torch.bfloat16}
    assert probe.ids.dtype == torch.long and probe.inv_freq.dtype == torch.float32
    assert not any(p.requires_grad for p in probe.parameters())
    assert nn.Linear(2, 2).weight.dtype == torch.float32  # nothing stays switched on
