"""Memory estimates from a config, in the shape every speech plugin's ``memory.py`` takes.

Torch-free: answered in the parent for the ``auto`` placement policy. The
arithmetic (parameter counts, KV bytes) is :mod:`omni_core.plan.estimates`';
this module holds the shapes around it that each plugin wrote again: sizing
from a local ``config.json`` or a known architecture (:func:`config_shapes`),
a weights-only stage such as a vocoder or an encoder (:func:`weights_only`),
and one estimator per stage name (:func:`by_stage`)::

    def estimate(pipeline):
        (talker,), source = config_shapes(pipeline.model_path, "My-TTS 1B",
                                          [(("talker_config",), TALKER)])
        return by_stage(pipeline, {
            "tts_engine": lambda s: engine_estimate(s, params(talker), talker,
                                                    source=source, overhead_bytes=GiB),
            "vocoder": lambda s: weights_only(s, CODEC_PARAMS, overhead=GiB,
                                              label="codec", default_dtype="float32"),
        })
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..placement import MemoryEstimate
from ..plan.estimates import factory_dtype, read_local_config, shape_from_config, weights_bytes

Estimator = Callable[[Any], "MemoryEstimate | None"]


def section(config: Mapping[str, Any] | None, *path: str) -> Mapping[str, Any] | None:
    """``config[path[0]][path[1]]...`` when every step is a mapping, else None."""
    for key in path:
        if not isinstance(config, Mapping):
            return None
        config = config.get(key)
    return config if isinstance(config, Mapping) else None


def max_positions(config: Mapping[str, Any] | None, *path: str, default: int) -> int:
    """``max_position_embeddings`` of the config section at ``path``, else ``default``."""
    value = (section(config, *path) or {}).get("max_position_embeddings")
    usable = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return value if usable else default


def config_shapes(
    model_path: str,
    architecture: str,
    shapes: Sequence[tuple[Sequence[str], Mapping[str, int]]],
    read: Callable[[str], Mapping[str, Any] | None] = read_local_config,
) -> tuple[list[dict[str, int]], str]:
    """Each (section path, defaults) read from a local ``config.json``, and where from.

    A hub id, or a directory without ``config.json``, gives the defaults, and
    ``architecture`` (the known release they describe) as the source. ``read``:
    how the plugin finds a config without downloading (its
    ``ModelSource.local_config``, which knows its presets: a ``tiny`` demo must
    not be estimated at the release's size).
    """
    config = read(model_path)
    source = f"{model_path}/config.json" if config else architecture
    return [
        shape_from_config(section(config, *path), defaults) for path, defaults in shapes
    ], source


def weights_only(
    stage: Any, params: int, *, overhead: int, label: str, default_dtype: str = "bfloat16"
) -> MemoryEstimate:
    """A stage that holds weights and no KV cache (a vocoder, an encoder), in its factory.dtype."""
    dtype = factory_dtype(stage, default_dtype)
    return MemoryEstimate(weights_bytes(params, dtype), 0, overhead, f"{label}, {dtype}")


def by_stage(pipeline: Any, estimators: Mapping[str, Estimator]) -> dict[str, MemoryEstimate]:
    """The estimate of each stage that has an estimator (by stage name) and answers one."""
    estimates: dict[str, MemoryEstimate] = {}
    for stage in pipeline.stages:
        estimator = estimators.get(stage.name)
        answer = estimator(stage) if estimator is not None else None
        if answer is not None:
            estimates[stage.name] = answer
    return estimates
