"""What every deployment command shares: ``DEPLOY [--PATH VALUE]...`` and ``--pipeline``.

Click cannot declare dotted flags that depend on the pipeline, so a
deployment command takes its own options (``--json``, ``--show`` …) through
typer and everything else as raw tokens, which :func:`load_deployment`
parses with the path language.
"""

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any

import typer

from ..config import Resolution, load_deployment
from ..config.flag_source import ALIASES, BROADCAST
from ..config.paths import TOP_LEVEL_NAMES
from ..errors import UsageError, did_you_mean

CONTEXT = {
    "ignore_unknown_options": True,
    "allow_extra_args": True,
    "help_option_names": ["-h", "--help"],
}
DEMO = "examples/qwen3_tts_demo.toml"  # the built-in default: tiny, random weights, CPU
ARGS_HELP = (
    "The deploy file (TOML), then settings as --<stage>.<group>.<field> VALUE or "
    "--<top-level field> VALUE (e.g. --vocoder.factory.max_batch_size 32, --mps on, "
    "--mem-fraction-static 0.7, --gpus 2 --gpu-memory 80GiB, --launcher ray "
    "--ray-address HOST:6379)."
)


def split_positionals(tokens: list[str], count: int) -> tuple[list[str], list[str]]:
    """The leading non-flag tokens (at most ``count``) and the rest."""
    positionals: list[str] = []
    while tokens and len(positionals) < count and not tokens[0].startswith("--"):
        positionals.append(tokens.pop(0))
    return positionals, tokens


def resolve_from_cli(
    tokens: list[str] | None, pipeline: str | None, command: str = "plan"
) -> Resolution:
    positionals, flags = split_positionals(list(tokens or []), 1)
    deploy = positionals[0] if positionals else None
    if deploy is None and pipeline is None:
        raise UsageError(
            "nothing to deploy: give a deploy file or --pipeline NAME",
            hint=f"e.g. omni {command} {DEMO} (the repository's built-in demo: a tiny "
            f"model with random weights on the CPU, no download), or omni {command} "
            "--pipeline qwen3-tts --model-path Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice",
        )
    return load_deployment(deploy, flags, pipeline=pipeline)


def refuse_misspelt_options(tokens: list[str], options: list[str]) -> None:
    """A flag that is no setting but nearly one of the command's own options: did you mean.

    Settings flags cannot be declared to the parser (they depend on the
    pipeline), so an unknown ``--x`` reaches the settings parser, whose error
    would list stages and fields; ``--prot 9000`` wants ``--port``.
    """
    settings = {name.replace("_", "-") for name in (*TOP_LEVEL_NAMES, *ALIASES, BROADCAST)}
    for token in tokens:
        if not token.startswith("--") or token == "--":
            continue
        name = token[2:].partition("=")[0]
        if "." in name or name.replace("_", "-") in settings:
            continue
        close = did_you_mean(f"--{name}", options)
        if close is not None:
            raise UsageError(f"no such option: --{name}", hint=f"did you mean {close}?")


def deployment_command(app: typer.Typer, name: str, help: str | None = None):
    """Register ``func(resolution, **options)`` as a command taking a deployment.

    The command gets the deploy-file positional, ``--pipeline`` and the dotted
    flags; ``func`` receives the resolved deployment and its own typer options.
    """

    def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
        hints = typing.get_type_hints(func)
        own = [
            p.replace(annotation=hints.get(p.name, p.annotation))
            for p in inspect.signature(func).parameters.values()
            if p.name != "resolution"
        ]

        names = ["--pipeline", "--help"] + [
            decl
            for p in own
            for decl in getattr(p.default, "param_decls", None) or ()
            if decl.startswith("--")
        ]

        @functools.wraps(func)
        def command(args: list[str] | None = None, pipeline: str | None = None, **options):
            refuse_misspelt_options(list(args or []), names)
            return func(resolve_from_cli(args, pipeline, name), **options)

        shared = [
            inspect.Parameter(
                "args",
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=typer.Argument(None, metavar="DEPLOY [--PATH VALUE]...", help=ARGS_HELP),
                annotation=list[str] | None,
            ),
            inspect.Parameter(
                "pipeline",
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=typer.Option(
                    None,
                    "--pipeline",
                    help="Pipeline name (or alias); outranks the deploy file's `pipeline`.",
                ),
                annotation=str | None,
            ),
        ]
        command.__signature__ = inspect.Signature([*shared, *own])
        command.__annotations__ = {p.name: p.annotation for p in [*shared, *own]}
        del command.__wrapped__
        app.command(name, help=help or func.__doc__, context_settings=CONTEXT)(command)
        return func

    return decorator
