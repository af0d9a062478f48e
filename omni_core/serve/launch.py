"""What ``omni serve`` and ``omni run`` share: plan, build the Runtime, show progress, own signals.

Neither starlette nor uvicorn is imported here, so ``omni run`` works without
the server's dependencies.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

from ..sigterm import signal_handlers_kept

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup

T = TypeVar("T")


def build_runtime(resolution: Any, *, on_progress: Any = None, detect: bool = True) -> Any:
    """Plan the resolved deployment on this machine and wrap it in a (not yet started) Runtime."""
    from ..config.checks import check_engine_packages, fetch_sources
    from ..plan import inventory_for, plan_deployment
    from ..plugins import get_plugins
    from ..runtime import Runtime

    fetch_sources(resolution)  # a hub id that cannot be had: exit 2 here, not in every child
    check_engine_packages(resolution)  # engine.backend = "sglang" without SGLang: exit 2 here
    config = resolution.config
    plugins = get_plugins()
    inventory = inventory_for(config, plugins, detect=detect)
    plan = plan_deployment(config, inventory, plugins)
    return Runtime(
        plan,
        config,
        plugins=plugins,
        plugin_modules=plugins.in_process_modules(),
        on_progress=on_progress or print_progress,
    )


def say(text: str) -> None:
    print(f"omni: {text}", file=sys.stderr, flush=True)


def print_progress(event: str, process: str, detail: dict[str, Any]) -> None:
    """One line per start-up and supervision event of a process."""
    if event == "loading":
        say(f"{process}: loading ({', '.join(detail.get('stages', []))})")
    elif event == "ready":
        stages = ", ".join(
            f"{name} {seconds:.2f} s" for name, seconds in detail.get("stages", {}).items()
        )
        say(f"{process}: ready in {detail.get('seconds', 0):.2f} s ({stages})")
    elif event in ("died", "unresponsive"):
        say(f"{process}: {detail.get('reason')}; restarting its group")
    elif event == "restart-failed":
        say(f"{process}: restart attempt {detail.get('attempt')} failed: {detail.get('error')}")
    elif event == "restarted":
        say(f"{process}: restarted (attempt {detail.get('attempt')})")
    elif event == "failed":
        say(f"{process}: gave up: {detail.get('reason')}")
    else:
        say(f"{process}: {event} {detail}")


class Signals:
    """What the first SIGINT/SIGTERM does: ``on_signal(count)`` if set, else cancel the work."""

    def __init__(self) -> None:
        self.on_signal: Callable[[int], None] | None = None
        self.count = 0
        self.received: str | None = None


async def run_until_signal(work: Callable[[Signals], Awaitable[T]]) -> tuple[T | None, Signals]:
    """Run ``work``; SIGINT/SIGTERM either call its handler (graceful) or cancel it.

    Cancelling is safe at any point: the Runtime shields the stopping of its
    children and removes its directory however it is left.
    """
    signals = Signals()
    result: list[T] = []
    # kept: asyncio leaves SIG_DFL behind when it stops receiving, not what was there
    # before, and a host that embeds this (a test run, a script) would then die on the spot
    with (
        signal_handlers_kept(),
        anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as received,
    ):
        try:
            await _watch_and_work(work, signals, received, result)
        except BaseExceptionGroup as group:
            raise _sole(group) from None
    return (result[0] if result else None), signals


async def _watch_and_work(work: Any, signals: Signals, received: Any, result: list[Any]) -> None:
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            async for signum in received:
                signals.count += 1
                signals.received = signal.Signals(signum).name
                if signals.on_signal is not None:
                    signals.on_signal(signals.count)
                else:
                    say(f"received {signals.received}: stopping")
                    tg.cancel_scope.cancel()

        async def main() -> None:
            result.append(await work(signals))
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        tg.start_soon(main)


def _sole(group: BaseExceptionGroup) -> BaseException:
    """The one error inside a task group's exception group (the CLI prints OmniErrors)."""
    errors = list(group.exceptions)
    while len(errors) == 1 and isinstance(errors[0], BaseExceptionGroup):
        errors = list(errors[0].exceptions)
    return errors[0] if len(errors) == 1 else group
