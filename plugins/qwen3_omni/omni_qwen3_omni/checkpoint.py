"""Reading the released checkpoint one stage at a time.

The release is ~66 GB in 15 shards, with every tensor named under one of
``thinker.``, ``talker.`` and ``code2wav.``. Stages run in different
processes (and GPUs), so each must read only its own tensors: the index
(``model.safetensors.index.json``) says which shard holds each name, a stage
opens just those shards, and safetensors reads only the requested tensors'
bytes from each. :data:`OWNERS` says which stage owns which prefix;
:func:`check_coverage` proves that the prefixes of a deployment's stages take
every tensor of the checkpoint exactly once, so nothing is silently ignored
or read twice. A tensor that is missing, unexpected or of the wrong shape is
named, with its shard, before any request runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Which stage reads which tensors. The thinker's decoder and head stay together.
OWNERS: dict[str, tuple[str, ...]] = {
    "audio_encoder": ("thinker.audio_tower.",),
    "image_encoder": ("thinker.visual.",),
    "thinker": ("thinker.model.", "thinker.lm_head."),
    "talker_ar": ("talker.",),
    "code2wav": ("code2wav.",),
}


class CheckpointError(ValueError):
    """A checkpoint that does not match the architecture its config describes."""


def _describe(names: list[str], limit: int = 6) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


@dataclass(frozen=True)
class Checkpoint:
    """The tensor names of a checkpoint directory and the file that holds each."""

    directory: Path
    weight_map: dict[str, str]

    @classmethod
    def open(cls, directory: str | Path) -> Checkpoint:
        root = Path(directory)
        index = root / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
            except json.JSONDecodeError as exc:
                raise CheckpointError(f"{index}: invalid JSON ({exc})") from None
            if not isinstance(weight_map, dict) or not weight_map:
                raise CheckpointError(f"{index}: no weight_map")
            missing = sorted({s for s in weight_map.values() if not (root / s).is_file()})
            if missing:
                raise CheckpointError(f"{index}: shard file(s) missing: {', '.join(missing)}")
            return cls(root, {str(k): str(v) for k, v in weight_map.items()})
        single = root / "model.safetensors"
        if single.is_file():
            from safetensors import safe_open

            with safe_open(str(single), framework="pt") as handle:
                return cls(root, dict.fromkeys(handle.keys(), single.name))
        raise CheckpointError(
            f"{root}: no model.safetensors or model.safetensors.index.json "
            "(use load_format = 'dummy' to run without weights)"
        )

    def names(self, prefixes: Iterable[str]) -> list[str]:
        prefixes = tuple(prefixes)
        return sorted(n for n in self.weight_map if n.startswith(prefixes))

    def shards_for(self, prefixes: Iterable[str]) -> list[str]:
        return sorted({self.weight_map[n] for n in self.names(prefixes)})

    def load_into(self, module: Any, prefixes: tuple[str, ...], strip: str, what: str) -> int:
        """Fill ``module``'s state from the tensors under ``prefixes``; return how many.

        A tensor ``strip + key`` fills state key ``key``. Only the shards that
        hold such tensors are opened, and only those tensors are read. Every
        state key must be filled, every tensor under ``prefixes`` must land,
        shapes must agree; otherwise CheckpointError names the offenders.
        """
        import torch
        from safetensors import safe_open

        expected = module.state_dict()
        names = self.names(prefixes)
        by_shard: dict[str, list[str]] = {}
        for name in names:
            by_shard.setdefault(self.weight_map[name], []).append(name)
        filled: set[str] = set()
        unexpected, wrong, absent = [], [], []
        with torch.no_grad():
            for shard, shard_names in sorted(by_shard.items()):
                with safe_open(str(self.directory / shard), framework="pt") as handle:
                    present = set(handle.keys())
                    for name in shard_names:
                        key = name.removeprefix(strip)
                        if name not in present:
                            absent.append(f"{name} (index says {shard})")
                            continue
                        if key not in expected:
                            unexpected.append(f"{name} ({shard})")
                            continue
                        target = expected[key]
                        shape = tuple(handle.get_slice(name).get_shape())
                        if shape != tuple(target.shape):
                            wrong.append(f"{name}: checkpoint {shape}, model {tuple(target.shape)}")
                            continue
                        target.copy_(handle.get_tensor(name))
                        filled.add(key)
        missing = sorted(f"{strip}{k}" for k in set(expected) - filled)
        problems = []
        if absent:
            problems.append(f"tensor(s) the index lists but the shard lacks: {_describe(absent)}")
        if unexpected:
            problems.append(f"unexpected tensor(s) {_describe(sorted(unexpected))}")
        if wrong:
            problems.append(f"wrong shape for {_describe(wrong)}")
        if missing:
            problems.append(f"missing tensor(s) {_describe(missing)}")
        if problems:
            raise CheckpointError(
                f"{what} ({self.directory}): the checkpoint does not match the architecture "
                "of its config: " + "; ".join(problems)
            )
        return len(filled)


def check_coverage(checkpoint: Checkpoint, stages: Iterable[str]) -> dict[str, list[str]]:
    """Which tensors each of ``stages`` reads; refuse tensors no stage of any variant owns.

    A tensor under a prefix owned by a stage that this deployment does not
    run (the talker's, in the text-only variant) is fine: that variant does
    not speak. A tensor under no known prefix, or under two, is an error:
    it would be silently ignored, or read twice.
    """
    taken: dict[str, list[str]] = {stage: [] for stage in stages}
    orphans, doubles = [], []
    for name in checkpoint.weight_map:
        owners = [s for s, prefixes in OWNERS.items() if name.startswith(prefixes)]
        if not owners:
            orphans.append(name)
        elif len(owners) > 1:
            doubles.append(name)
        elif owners[0] in taken:
            taken[owners[0]].append(name)
    if orphans or doubles:
        parts = []
        if orphans:
            parts.append(f"tensor(s) no stage reads: {_describe(sorted(orphans))}")
        if doubles:
            parts.append(f"tensor(s) two stages would read: {_describe(sorted(doubles))}")
        raise CheckpointError(f"{checkpoint.directory}: " + "; ".join(parts))
    return taken
