"""Small pipelines of simple stages, for runtime tests (a plugin module).

Registered in-process by the tests and, by module name, in the child
processes the runtime spawns. Every stage runs on the CPU.
"""

from __future__ import annotations

import os
import time
from typing import Any

import anyio

from omni_core import PipelineConfig, StageConfig, hookimpl

HERE = "omni_test_pipelines"


class Append:
    """Adds ``tag`` (and the pid that ran it) to the request's trail."""

    def __init__(self, tag: str, delay: float = 0.0):
        self.tag, self.delay = tag, delay

    async def run(self, request):
        data = request.data or {}
        if data.get("fail_at") == self.tag:
            raise ValueError(f"asked to fail at {self.tag}")
        delay = float(data.get("delay", {}).get(self.tag, self.delay))
        if delay:
            await anyio.sleep(delay)
        compute = float(data.get("compute", {}).get(self.tag, 0.0))
        if compute:  # long work off the event loop, as the engine's steps run
            await anyio.to_thread.run_sync(time.sleep, compute)
        return {**data, "trail": [*data.get("trail", []), f"{self.tag}:{os.getpid()}"]}


def create_append(tag: str, delay: float = 0.0) -> Append:
    return Append(tag, delay)


class Producer:
    """Streams ``n`` chunks downstream, then returns how many it sent.

    With ``forever`` it streams until cancelled (then writes ``"cancelled"`` to
    the file ``marker``), marking chunk ``stop_after`` as the consumer's last.
    """

    async def run(self, request):
        data = request.data
        if data.get("forever"):
            try:
                for i in range(10**9):
                    await request.emit({"index": i, "last": i == data.get("stop_after")})
                    await anyio.sleep(0.01)
            except anyio.get_cancelled_exc_class():
                with open(data["marker"], "w") as marker:
                    marker.write("cancelled")
                raise
        for target in data.get("skip", []):
            await request.skip(target)
        n = int(data.get("n", 3))
        for i in range(n):
            await request.emit({"index": i})
        return {"sent": n}


def create_producer() -> Producer:
    return Producer()


class Doubler:
    """Consumes a stream; emits each chunk doubled to the client; returns the count."""

    async def run(self, request):
        count = 0
        async for chunk in request.stream:
            await request.emit(chunk["index"] * 2)
            count += 1
            if chunk.get("last"):
                break  # done early: what the upstream still makes is not needed
        return {"received": count}


def create_doubler() -> Doubler:
    return Doubler()


class Counter:
    """Consumes a stream and returns how many chunks it had."""

    async def run(self, request):
        return {"received": len([chunk async for chunk in request.stream])}


def create_counter() -> Counter:
    return Counter()


def route_media(data: dict[str, Any]) -> list[str]:
    return [
        *(["images"] if data.get("images") else []),
        *(["audio"] if data.get("audio") else []),
        "join",
    ]


def route_bad(data: dict[str, Any]) -> list[str]:
    return ["nowhere"]


def merge_parts(parts: dict[str, Any]) -> dict[str, Any]:
    return {"sources": sorted(parts), "trails": {k: v["trail"] for k, v in parts.items()}}


def _stage(name: str, tag: str | None = None, **kw: Any) -> StageConfig:
    kw.setdefault("process", "p")
    return StageConfig(
        name=name,
        factory_path=f"{HERE}:create_append",
        author_kwargs={"tag": tag or name},
        **kw,
    )


def _pipeline(
    class_name: str, name: str, stages: list[StageConfig], entry: str
) -> type[PipelineConfig]:
    """A pipeline class named ``class_name`` in this module, so that it pickles."""

    def default_stages(cls) -> list[StageConfig]:
        return [s.model_copy(deep=True) for s in stages]

    return type(
        class_name,
        (PipelineConfig,),
        {
            "__module__": __name__,
            "pipeline_name": name,
            "entry_stage": entry,
            "description": f"test pipeline {name}",
            "default_stages": classmethod(default_stages),
            "__annotations__": {},
        },
    )


LinearPipeline = _pipeline(
    "LinearPipeline",
    "t-linear",
    [_stage("a", next="b"), _stage("b", next="c"), _stage("c", terminal=True)],
    "a",
)
TwoProcessPipeline = _pipeline(
    "TwoProcessPipeline",
    "t-two-process",
    [_stage("a", next="b", process="first"), _stage("b", terminal=True, process="second")],
    "a",
)
FanInPipeline = _pipeline(
    "FanInPipeline",
    "t-fan-in",
    [
        _stage("pre", next=["images", "audio", "join"], route_fn=f"{HERE}:route_media"),
        _stage("images", next="join", process="enc"),
        _stage("audio", next="join", process="enc"),
        StageConfig(
            name="join",
            factory_path=f"{HERE}:create_append",
            author_kwargs={"tag": "join"},
            wait_for=["pre", "images", "audio"],
            merge_fn=f"{HERE}:merge_parts",
            terminal=True,
            process="p",
        ),
    ],
    "pre",
)
StreamPipeline = _pipeline(
    "StreamPipeline",
    "t-stream",
    [
        StageConfig(
            name="producer",
            factory_path=f"{HERE}:create_producer",
            next="doubler",
            stream_to=["doubler"],
            process="p",
        ),
        StageConfig(
            name="doubler", factory_path=f"{HERE}:create_doubler", terminal=True, process="q"
        ),
    ],
    "producer",
)
StreamTwoWaysPipeline = _pipeline(
    "StreamTwoWaysPipeline",
    "t-stream-two-ways",
    [
        StageConfig(
            name="producer",
            factory_path=f"{HERE}:create_producer",
            next=["doubler", "speaker"],
            stream_to=["doubler", "speaker"],
            process="p",
        ),
        StageConfig(
            name="doubler", factory_path=f"{HERE}:create_doubler", terminal=True, process="q"
        ),
        StageConfig(
            name="speaker", factory_path=f"{HERE}:create_counter", next="echo", process="q"
        ),
        _stage("echo", terminal=True, process="q"),
    ],
    "producer",
)
TwoTerminalPipeline = _pipeline(
    "TwoTerminalPipeline",
    "t-two-terminals",
    [
        _stage("a", next=["left", "right"]),
        _stage("left", terminal=True),
        _stage("right", terminal=True, process="r"),
    ],
    "a",
)
ReplicaPipeline = _pipeline(
    "ReplicaPipeline",
    "t-replicas",
    [
        _stage("front", next="mid", process="front"),
        _stage("mid", next="back", process="work"),
        _stage("back", terminal=True, process="work"),
    ],
    "front",
)
BadRoutePipeline = _pipeline(
    "BadRoutePipeline",
    "t-bad-route",
    [
        _stage("a", next=["b", "c"], route_fn=f"{HERE}:route_bad"),
        _stage("b", terminal=True),
        _stage("c", terminal=True),
    ],
    "a",
)

PIPELINES = [
    LinearPipeline,
    TwoProcessPipeline,
    FanInPipeline,
    StreamPipeline,
    StreamTwoWaysPipeline,
    TwoTerminalPipeline,
    ReplicaPipeline,
    BadRoutePipeline,
]


@hookimpl
def omni_register_pipelines() -> list[type[PipelineConfig]]:
    return list(PIPELINES)


class Broken:
    async def run(self, request):  # pragma: no cover - never built
        return None


def create_broken(message: str = "no weights here") -> Broken:
    raise RuntimeError(message)


def create_sleepy(seconds: float = 60.0) -> Broken:
    import time

    time.sleep(seconds)
    return Broken()


class EnvReporter:
    async def run(self, request):
        return {name: os.environ.get(name) for name in request.data["names"]}


def create_env_reporter() -> EnvReporter:
    return EnvReporter()


BrokenPipeline = _pipeline(
    "BrokenPipeline",
    "t-broken",
    [
        _stage("ok", next="bad", process="good"),
        StageConfig(name="bad", factory_path=f"{HERE}:create_broken", terminal=True, process="bad"),
    ],
    "ok",
)
SlowStartPipeline = _pipeline(
    "SlowStartPipeline",
    "t-slow-start",
    [StageConfig(name="slow", factory_path=f"{HERE}:create_sleepy", terminal=True, process="p")],
    "slow",
)
EnvPipeline = _pipeline(
    "EnvPipeline",
    "t-env",
    [
        StageConfig(
            name="env",
            factory_path=f"{HERE}:create_env_reporter",
            terminal=True,
            process="p",
            env={"OMNI_TEST_DEFAULT": "from-stage", "OMNI_TEST_USER": "stage"},
        )
    ],
    "env",
)
PIPELINES += [BrokenPipeline, SlowStartPipeline, EnvPipeline]


# -- chaos: streams and a fan-in across three processes; any stage fails or dawdles ------
# front (a) -> streamer (a) ~> sink (b, terminal); front -> side (c) -> join (b, terminal);
# front -> join: join waits for front and side.


async def _act(request: Any, stage: str) -> None:
    """Fail or pause as the request's ``plan`` says for ``stage``."""
    plan = (request.data or {}).get("plan", {}).get(stage, {})
    if plan.get("delay"):
        await anyio.sleep(plan["delay"])
    if plan.get("fail"):
        raise ValueError(f"asked to fail in {stage}")


class ChaosFront:
    async def run(self, request):
        await _act(request, "front")
        return dict(request.data)


class ChaosStreamer:
    """Streams ``chunks`` chunks (a pause between them), failing after ``fail_after``."""

    async def run(self, request):
        plan = request.data.get("plan", {}).get("streamer", {})
        for index in range(int(plan.get("chunks", 4))):
            if plan.get("fail_after") == index:
                raise ValueError("asked to fail mid-stream")
            await request.emit({"index": index, "last": index == plan.get("stop_after")})
            await anyio.sleep(plan.get("pause", 0.0))
        return dict(request.data)


class ChaosSink:
    """Reads the stream (stopping early at a ``last`` chunk), emits each chunk to the client."""

    async def run(self, request):
        count = 0
        async for chunk in request.stream:
            count += 1
            await request.emit(chunk["index"])
            if chunk.get("last"):
                break
        await _act(request, "sink")
        return {"received": count}


class ChaosSide:
    async def run(self, request):
        await _act(request, "side")
        return {"side": True}


def create_chaos_front() -> ChaosFront:
    return ChaosFront()


def create_chaos_streamer() -> ChaosStreamer:
    return ChaosStreamer()


def create_chaos_sink() -> ChaosSink:
    return ChaosSink()


def create_chaos_side() -> ChaosSide:
    return ChaosSide()


def merge_chaos(parts: dict[str, Any]) -> dict[str, Any]:
    return {"parts": sorted(parts)}


class ChaosJoin:
    async def run(self, request):
        await _act(request, "join")
        return request.data


def create_chaos_join() -> ChaosJoin:
    return ChaosJoin()


def _chaos(name: str, process: str, **kw: Any) -> StageConfig:
    return StageConfig(name=name, factory_path=f"{HERE}:create_chaos_{name}", process=process, **kw)


ChaosPipeline = _pipeline(
    "ChaosPipeline",
    "t-chaos",
    [
        _chaos("front", "a", next=["streamer", "side", "join"]),
        _chaos("streamer", "a", next="sink", stream_to=["sink"]),
        _chaos("sink", "b", terminal=True),
        _chaos("side", "c", next="join"),
        _chaos(
            "join", "b", wait_for=["front", "side"], merge_fn=f"{HERE}:merge_chaos", terminal=True
        ),
    ],
    "front",
)
PIPELINES.append(ChaosPipeline)
