"""Command-line flags -> patches.

Flags are ``--PATH VALUE`` or ``--PATH=VALUE``, where PATH starts at a stage
name or a top-level field. A few spellings are shorthands:
``--mem-fraction-static`` (broadcast to every engine stage), ``--gpus`` and
``--gpu-memory`` (the cluster inventory), ``--launcher`` (``runtime.launcher``),
``--log-dir`` (``runtime.log_dir``) and ``--ray-address`` (``ray.address``).
"""

from __future__ import annotations

from ..errors import ConfigError, UsageError
from .coerce import coerce, describe
from .origin import Layer, Origin, Patch, Rank, dotted
from .paths import PathError, PathSchema

BROADCAST = "mem_fraction_static"
ALIASES = {
    "gpus": ("cluster", "gpus"),
    "gpu_memory": ("cluster", "gpu_memory"),
    "ray_address": ("ray", "address"),
    "launcher": ("runtime", "launcher"),
    "log_dir": ("runtime", "log_dir"),
}


def split_flags(tokens: list[str]) -> list[tuple[str, str]]:
    """``["--a.b", "1", "--c=2"]`` -> ``[("a.b", "1"), ("c", "2")]``."""
    pairs: list[tuple[str, str]] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if not token.startswith("--") or token == "--":
            raise UsageError(
                f"unexpected argument {token!r}",
                hint="settings are written as --<stage>.<group>.<field> VALUE "
                "(the deploy file is the first positional argument)",
            )
        name, eq, value = token[2:].partition("=")
        if not eq:
            if index + 1 >= len(tokens) or tokens[index + 1].startswith("--"):
                raise UsageError(f"flag --{name} needs a value", hint=f"write --{name} VALUE")
            value = tokens[index + 1]
            index += 1
        pairs.append((name, value))
        index += 1
    return pairs


def flag_patches(
    pairs: list[tuple[str, str]], schema: PathSchema, counter: list[int]
) -> list[Patch]:
    patches: list[Patch] = []
    for name, text in pairs:
        label = f"--{name}"
        first, _, rest = name.partition(".")
        first = first.replace("-", "_")
        if first == BROADCAST and not rest:
            patches += _broadcast(text, schema, counter, label)
            continue
        if first in ALIASES and not rest and first not in schema.stages:
            path = ALIASES[first]
        else:
            try:
                path = schema.from_flag(".".join([first, rest]) if rest else first)
            except PathError as exc:
                raise PathError(exc.message, origin=label, hint=exc.hint) from None
        patches.append(_patch(path, text, schema, counter, Origin(label, Layer.CLI)))
    return patches


def _patch(path, text: str, schema: PathSchema, counter: list[int], origin: Origin) -> Patch:
    try:
        node = schema.node(path)
    except PathError as exc:
        raise PathError(exc.message, origin=str(origin), hint=exc.hint) from None
    if node.container:
        flag = schema.flag_spelling(path)
        whole = "stage" if len(path) == 2 and path[0] == "stages" else "group"
        raise PathError(
            f"{dotted(path)} names a whole {whole}, not one setting",
            origin=str(origin),
            hint=f"set one field: --{flag}.<field> VALUE",
        )
    try:
        value = coerce(text, node.annotation, from_text=True)
    except ValueError as exc:
        raise ConfigError(
            f"{dotted(path)}: {exc}",
            origin=str(origin),
            hint=f"give {dotted(path)} {describe(node.annotation)}",
        ) from None
    counter[0] += 1
    return Patch(node.path, value, origin, counter[0])


def _broadcast(text: str, schema: PathSchema, counter: list[int], label: str) -> list[Patch]:
    engines = [name for name, stage in schema.stages.items() if stage.is_engine]
    if not engines:
        raise ConfigError(
            f"this flag sets engine.mem_fraction_static on every engine stage, but "
            f"{schema.label} has no engine stage",
            origin=label,
            hint="remove the flag",
        )
    origin = Origin(label, Layer.CLI, Rank.BROADCAST)
    return [
        _patch(("stages", name, "engine", BROADCAST), text, schema, counter, origin)
        for name in engines
    ]
