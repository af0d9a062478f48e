"""Strict safetensors loading: every tensor lands, by name or under a prefix, or is named.

Imported only by stage factories, in stage processes (torch and safetensors
are imported inside the functions that need them, so this module itself is
cheap, but it is no plan-time module). Loading is strict by design: every
tensor a stage reads must land in a parameter or buffer of the same name and
shape, and every parameter must be filled. A missing, unexpected or
wrongly-shaped tensor, or one an index places in a shard that lacks it, is
an error that names it and its file: a silently skipped tensor makes a model
that runs and talks nonsense.

A :class:`Checkpoint` is a directory's tensor names and the file holding
each (one ``model.safetensors`` or the shards of its index). A stage reads
its own part with :meth:`Checkpoint.load_into` (``prefixes`` it owns,
``strip`` to map checkpoint names onto its module's), opening only the
shards that hold them; :func:`load_state` reads whole files into a module;
:func:`fill_shared` fills a module from a directory's files or with a
family's seeded dummy weights, through the weight-sharing seam.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class CheckpointError(ValueError):
    """A checkpoint that does not match the architecture its config describes."""


def read_json(path: Path, required: bool = True) -> dict[str, Any]:
    """A JSON file as a dict; {} for an absent optional one, a clear error otherwise."""
    if not path.is_file():
        if required:
            raise FileNotFoundError(f"{path} is missing")
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: invalid JSON ({exc})") from exc


def describe(names: Sequence[str], limit: int = 8) -> str:
    """The first ``limit`` names, and how many there are in all when there are more."""
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


@dataclass(frozen=True)
class Checkpoint:
    """The tensor names of a checkpoint directory and the file that holds each."""

    directory: Path
    weight_map: dict[str, str]

    @classmethod
    def open(cls, directory: str | Path, stem: str = "model") -> Checkpoint:
        """``<stem>.safetensors.index.json`` (its shards must exist) or ``<stem>.safetensors``."""
        root = Path(directory)
        index = root / f"{stem}.safetensors.index.json"
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
        single = root / f"{stem}.safetensors"
        if single.is_file():
            return cls(root, dict.fromkeys(_keys(single), single.name))
        raise CheckpointError(
            f"{root}: no {stem}.safetensors or {stem}.safetensors.index.json "
            "(use load_format='dummy' to run without weights)"
        )

    @classmethod
    def of_files(cls, files: Iterable[Path], what: str) -> Checkpoint:
        """Every tensor of ``files`` (one directory); a name in two files is refused."""
        files = list(files)
        weight_map: dict[str, str] = {}
        for file in files:
            for name in _keys(file):
                if name in weight_map:
                    raise CheckpointError(f"{what}: tensor {name!r} appears twice ({file})")
                weight_map[name] = file.name
        return cls(files[0].parent if files else Path("."), weight_map)

    @property
    def files(self) -> list[Path]:
        return [self.directory / shard for shard in sorted(set(self.weight_map.values()))]

    def names(self, prefixes: Iterable[str]) -> list[str]:
        prefixes = tuple(prefixes)
        return sorted(n for n in self.weight_map if n.startswith(prefixes))

    def shards_for(self, prefixes: Iterable[str]) -> list[str]:
        return sorted({self.weight_map[n] for n in self.names(prefixes)})

    def absent(self) -> list[str]:
        """Tensors the index places in a shard that does not hold them."""
        by_shard: dict[str, set[str]] = {}
        for name, shard in self.weight_map.items():
            by_shard.setdefault(shard, set()).add(name)
        absent = []
        for shard, names in sorted(by_shard.items()):
            absent += sorted(
                f"{n} (index says {shard})" for n in names - set(_keys(self.directory / shard))
            )
        return absent

    def load_into(
        self, module: Any, prefixes: tuple[str, ...] = ("",), strip: str = "", what: str = ""
    ) -> int:
        """Fill ``module``'s state from the tensors under ``prefixes``; return how many.

        A tensor ``strip + key`` fills state key ``key``. Only the shards that
        hold such tensors are opened, and only those tensors are read. Every
        state key must be filled, every tensor under ``prefixes`` must land,
        shapes must agree; otherwise CheckpointError names the offenders.
        """
        filled, problems = self.fill(module, prefixes, strip)
        if problems:
            raise mismatch(f"{what or 'checkpoint'} ({self.directory})", problems)
        return filled

    def fill(
        self, module: Any, prefixes: tuple[str, ...] = ("",), strip: str = ""
    ) -> tuple[int, list[str]]:
        """:meth:`load_into` without the raise: how many tensors landed, and the problems."""
        import torch
        from safetensors import safe_open

        expected = module.state_dict()
        by_shard: dict[str, list[str]] = {}
        for name in self.names(prefixes):
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
                        elif key not in expected:
                            unexpected.append(f"{name} ({shard})")
                        elif (shape := tuple(handle.get_slice(name).get_shape())) != tuple(
                            expected[key].shape
                        ):
                            wrong.append(
                                f"{name}: checkpoint {shape}, model {tuple(expected[key].shape)}"
                            )
                        else:
                            expected[key].copy_(handle.get_tensor(name))
                            filled.add(key)
        missing = sorted(f"{strip}{k}" for k in set(expected) - filled)
        problems = []
        if absent:
            problems.append(f"tensor(s) the index lists but the shard lacks: {describe(absent)}")
        if unexpected:
            problems.append(f"unexpected tensor(s) {describe(sorted(unexpected))}")
        if wrong:
            problems.append(f"wrong shape for {describe(wrong)}")
        if missing:
            problems.append(f"missing tensor(s) {describe(missing)}")
        return len(filled), problems


def mismatch(what: str, problems: Sequence[str]) -> CheckpointError:
    """The error for a checkpoint whose tensors do not fit the module built from its config."""
    return CheckpointError(
        f"{what}: the checkpoint does not match the architecture of its config: "
        + "; ".join(problems)
    )


def checkpoint_files(directory: Path, stem: str = "model") -> list[Path]:
    """The safetensors files of ``directory``, each tensor its index lists checked present."""
    checkpoint = Checkpoint.open(directory, stem)
    absent = checkpoint.absent()
    if absent:
        raise CheckpointError(
            f"{directory}: the index places tensor {absent[0]} but the shard does not "
            f"contain it ({len(absent)} such tensor(s))"
        )
    return checkpoint.files


def load_state(module: Any, files: Iterable[Path], what: str) -> None:
    """Copy every tensor of ``files`` into ``module`` by name; refuse any mismatch."""
    _, problems = Checkpoint.of_files(files, what).fill(module)
    if problems:
        raise mismatch(what, problems)


def fill_shared(
    key: str, module: Any, load_format: str, directory: Path, dummy: Callable[[Any], Any]
) -> Any:
    """Fill ``module``: ``dummy(module)`` (the family's seeded weights) for ``load_format =
    "dummy"``, else every tensor of ``directory``'s safetensors files by name, strictly;
    or map the weights a leader published under ``key`` (omni_core's weight-sharing seam:
    replicas on one device load once). Returns ``module``."""
    from ..runtime.weight_share import share_weights

    def fill(target: Any) -> None:
        if load_format == "dummy":
            dummy(target)
        else:
            load_state(target, checkpoint_files(directory), str(directory))

    return share_weights(key, module, fill)


def _keys(file: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as handle:
        return list(handle.keys())
