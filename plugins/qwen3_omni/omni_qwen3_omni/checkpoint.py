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
named, with its shard, before any request runs (the kit's strict loader,
:class:`omni_core.kit.weights.Checkpoint`).
"""

from __future__ import annotations

from collections.abc import Iterable

from omni_core.kit.weights import (  # Checkpoint: this plugin's name for it too
    Checkpoint,
    CheckpointError,
    describe,
)

# Which stage reads which tensors. The thinker's decoder and head stay together.
OWNERS: dict[str, tuple[str, ...]] = {
    "audio_encoder": ("thinker.audio_tower.",),
    "image_encoder": ("thinker.visual.",),
    "thinker": ("thinker.model.", "thinker.lm_head."),
    "talker_ar": ("talker.",),
    "code2wav": ("code2wav.",),
}


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
            parts.append(f"tensor(s) no stage reads: {describe(sorted(orphans))}")
        if doubles:
            parts.append(f"tensor(s) two stages would read: {describe(sorted(doubles))}")
        raise CheckpointError(f"{checkpoint.directory}: " + "; ".join(parts))
    return taken
