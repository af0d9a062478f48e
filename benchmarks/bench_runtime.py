"""Coordinator overhead per hop, and requests per second of a trivial pipeline.

Run: ``python benchmarks/bench_runtime.py`` (about half a minute; CPU only; ``--smoke``: a few
requests, concurrency 1 and 8).

Per-hop overhead: a request with a small payload (a dict of two ints) goes
through a linear pipeline of pass-through stages, one request at a time.
Its latency is ``submit -> entry -> ... -> terminal -> coordinator``; the
pipelines have 1 and ``--hops + 1`` stages, so the difference of their
latency quantiles divided by ``--hops`` is the cost of one stage-to-stage
hop. "one process": every stage in one child (payloads pass as Python
objects). "across processes": stages alternate between two children, so
every hop crosses a process boundary through the default transport.
The 1-stage baseline itself (parent -> child -> parent) is printed too.

Throughput: a two-stage pipeline (``a -> b``, one stage per process) driven
through ``Runtime.dispatch`` by 1, 8 and 64 concurrent clients for a fixed
number of requests each; with ``--http``, also through the HTTP server
(``POST /v1/chat/completions``, a minimal keep-alive client on the same event
loop, so the figure includes the client's cost).

The pipelines are a plugin module (this file, imported as ``bench_runtime``)
registered in-process and handed to the children by module name.
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import statistics
import tempfile
import time
from typing import Any

from omni_core import PipelineConfig, StageConfig, hookimpl
from omni_core.sigterm import run_script

HERE = "bench_runtime"
PIPELINES: list[type[PipelineConfig]] = []


class PassThrough:
    async def run(self, request: Any) -> Any:
        return request.data


class Reply:
    async def run(self, request: Any) -> str:
        return "ok"


def create(reply: bool = False) -> Any:
    return Reply() if reply else PassThrough()


def _linear(name: str, processes: list[str], **attrs: Any) -> type[PipelineConfig]:
    """A pipeline class ``name`` in this module whose stage i runs in ``processes[i]``."""
    count = len(processes)

    def default_stages(cls: type) -> list[StageConfig]:
        return [
            StageConfig(
                name=f"s{i}",
                factory_path=f"{HERE}:create",
                process=process,
                **({"next": f"s{i + 1}"} if i + 1 < count else {"terminal": True}),
                **({"author_kwargs": {"reply": True}} if i + 1 == count and attrs else {}),
            )
            for i, process in enumerate(processes)
        ]

    cls = type(
        name.replace("-", "_"),
        (PipelineConfig,),
        {
            "__module__": HERE,
            "pipeline_name": name,
            "entry_stage": "s0",
            "default_placement_policy": "cpu",
            "default_stages": classmethod(default_stages),
            "__annotations__": {},
            **attrs,
        },
    )
    globals()[cls.__name__] = cls  # so that the children can unpickle it by name
    PIPELINES.append(cls)
    return cls


MAX_HOPS = 8
_linear("b-one", ["p"])
_linear("b-same", ["p"] * (MAX_HOPS + 1))
_linear("b-cross", ["p", "q"] * (MAX_HOPS // 2) + ["p"])
_linear("b-two", ["p", "q"])
_linear("b-http", ["p", "q"], api=("chat",), text_stage="s1")


@hookimpl
def omni_register_pipelines() -> list[type[PipelineConfig]]:
    return list(PIPELINES)


# -- measurement --------------------------------------------------------------
def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def runtime_for(pipeline: str, plugins: Any, base: str) -> Any:
    from omni_core.config import load_deployment
    from omni_core.plan.planner import plan_deployment
    from omni_core.runtime import Runtime

    flags = ["--endpoints.base_path", base, "--runtime.max_inflight", "4096"]
    resolution = load_deployment(None, flags, pipeline=pipeline, plugins=plugins)
    plan = plan_deployment(resolution.config, plugins=plugins)
    return Runtime(plan, resolution.config, plugins=plugins, plugin_modules=[HERE])


async def latencies(runtime: Any, count: int, warmup: int) -> list[float]:
    payload = {"a": 1, "b": 2}
    for _ in range(warmup):
        await runtime.run(payload)
    out = []
    for _ in range(count):
        started = time.perf_counter()
        await runtime.run(payload)
        out.append(time.perf_counter() - started)
    return out


async def throughput(runtime: Any, concurrency: int, per_client: int) -> float:
    import anyio

    async def client() -> None:
        for _ in range(per_client):
            await runtime.run({"a": 1})

    await latencies(runtime, 0, 50)
    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(client)
    return concurrency * per_client / (time.perf_counter() - started)


CHAT_BODY = b'{"messages": [{"role": "user", "content": "hi"}]}'
CHAT_REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
    b"Content-Length: " + str(len(CHAT_BODY)).encode() + b"\r\n\r\n" + CHAT_BODY
)


async def http_client(host: str, port: int, count: int) -> None:
    """A minimal keep-alive HTTP/1.1 client: the openai client would dominate the figure."""
    import asyncio

    reader, writer = await asyncio.open_connection(host, port)
    try:
        for _ in range(count):
            writer.write(CHAT_REQUEST)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"unexpected answer: {head[:80]!r}")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
    finally:
        writer.close()


async def http_throughput(plugins: Any, base: str, args: argparse.Namespace) -> None:
    import anyio

    from omni_core.serve.common.app import create_app
    from omni_core.serve.server import bind, make_server, serve_runtime

    runtime = runtime_for("b-http", plugins, base)
    print(
        "\nrequests per second over HTTP (POST /v1/chat/completions, same pipeline shape; "
        "client and server share this process's event loop)"
    )
    async with runtime:

        class Resolution:
            config = runtime.config
            pipeline_cls = type(runtime.config)

        server = make_server(create_app(runtime, Resolution), "", 0, grace=1)
        sock = bind("127.0.0.1", 0)
        port = sock.getsockname()[1]
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve_runtime, server, [sock])
            while not server.started:
                await anyio.sleep(0.01)
            await http_client("127.0.0.1", port, 50)
            for concurrency in (1, 8, 64):
                per_client = max(10, args.per_client // 2 // max(1, concurrency // 8))
                started = time.perf_counter()
                async with anyio.create_task_group() as clients:
                    for _ in range(concurrency):
                        clients.start_soon(http_client, "127.0.0.1", port, per_client)
                rate = concurrency * per_client / (time.perf_counter() - started)
                print(f"  concurrency {concurrency:3}: {rate:8.0f} req/s")
            server.should_exit = True


async def main(args: argparse.Namespace) -> None:
    from omni_core.plugins import OmniPlugins

    plugins = OmniPlugins(env={})
    plugins.register(importlib.import_module(HERE), HERE)
    base = tempfile.mkdtemp(prefix="omni-bench-")
    hops = MAX_HOPS
    print(
        f"per-hop overhead, small payload, {args.requests} sequential requests "
        f"(after {args.warmup} warm-up), {hops} hops vs 1 stage"
    )
    results = {}
    levels = (1, 8) if args.smoke else (1, 8, 64)
    for pipeline in ("b-one", "b-same", "b-cross"):
        async with runtime_for(pipeline, plugins, base) as runtime:
            results[pipeline] = await latencies(runtime, args.requests, args.warmup)
    one = results["b-one"]
    print(
        f"  1-stage round trip (parent -> child -> parent): "
        f"p50 {quantile(one, 0.5) * 1e6:7.0f} us  p99 {quantile(one, 0.99) * 1e6:7.0f} us"
    )
    for pipeline, label in (("b-same", "one process"), ("b-cross", "across processes")):
        values = results[pipeline]
        p50 = (quantile(values, 0.5) - quantile(one, 0.5)) / hops
        p99 = (quantile(values, 0.99) - quantile(one, 0.99)) / hops
        print(
            f"  per hop, {label:17}: p50 {p50 * 1e6:7.1f} us  p99 {p99 * 1e6:7.1f} us   "
            f"(request p50 {quantile(values, 0.5) * 1e6:.0f} us, "
            f"mean {statistics.fmean(values) * 1e6:.0f} us)"
        )

    print(
        f"\nrequests per second, two-stage pipeline (a -> b, one process each), "
        f"{args.per_client} requests per client"
    )
    async with runtime_for("b-two", plugins, base) as runtime:
        for concurrency in levels:
            per_client = max(10, args.per_client // max(1, concurrency // 8))
            rate = await throughput(runtime, concurrency, per_client)
            print(f"  concurrency {concurrency:3}: {rate:8.0f} req/s")
    if args.http:
        await http_throughput(plugins, base, args)
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--per-client", type=int, default=400)
    parser.add_argument("--http", action="store_true", help="also measure through the server")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, one repeat: checks the script runs (make test)",
    )
    import anyio

    arguments = parser.parse_args()
    if arguments.smoke:
        arguments.requests, arguments.warmup, arguments.per_client = 20, 5, 10
    run_script(lambda: anyio.run(main, arguments))
