"""``omni serve DEPLOY``: plan, launch, serve the OpenAI-compatible API, stop cleanly.
``omni run DEPLOY --text … -o out.wav`` / ``--prompt …``: one request, same runtime, no server.

Order matters for a clean life cycle. ``serve`` binds its port before any
model loads (a taken port fails in milliseconds), starts the runtime showing
each process's progress, then serves. On SIGINT/SIGTERM it stops admitting
(``/health`` answers 503 "stopping"), lets uvicorn finish open responses for
the grace period, then stops the runtime (grace for what is left, TERM/KILL
to the children, runtime directory removed; the process logs are kept, and
their directory is printed at start and at stop). A second signal forces.
A signal during start-up cancels it; the runtime tears down what started.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer

from ..errors import OmniError, RequestError, UsageError
from ._app import app
from .deployment import deployment_command

SPEECH_FORMATS = {".wav": "wav", ".pcm": "pcm", ".flac": "flac"}


@deployment_command(app, "serve")
def serve_command(
    resolution,
    host: str | None = typer.Option(None, "--host", help="Address to bind (server.host)."),
    port: int | None = typer.Option(
        None, "--port", help="Port to bind; 0 picks a free one (server.port)."
    ),
    api_key: str | None = typer.Option(
        None,
        "--api-key",
        envvar="OMNI_API_KEY",
        help="Require 'Authorization: Bearer KEY' on every route but /health (server.api_key).",
    ),
) -> None:
    """Serve DEPLOY over HTTP (/v1/audio/speech, /v1/chat/completions, /v1/models, …)."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise OmniError(
            f"omni serve needs the server packages: {exc}",
            hint="pip install 'starlette>=0.37' 'uvicorn>=0.30'",
        ) from None
    import anyio

    from ..serve.launch import run_until_signal
    from ..serve.server import bind
    from ..serve.service import Serving

    server = resolution.config.server
    Serving.of(resolution.pipeline_cls)  # a pipeline that cannot be served fails before loading
    host = host or server.host
    port = server.port if port is None else port
    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be in 0-65535, got {port}")
    key = api_key or server.api_key
    _log_to_stderr()
    sock = bind(host, port)
    try:
        anyio.run(run_until_signal, lambda signals: _serve(resolution, sock, key, signals))
    finally:
        sock.close()


async def _serve(resolution: Any, sock: Any, key: str | None, signals: Any) -> None:
    import anyio

    from ..serve.common.app import create_app
    from ..serve.common.log_limits import limit_repeats
    from ..serve.launch import build_runtime, say
    from ..serve.server import make_server, serve_runtime
    from ..serve.service import public_model_name

    config = resolution.config
    pipeline = resolution.pipeline_cls.pipeline_name
    grace = config.runtime.grace_period
    runtime = build_runtime(resolution)
    say(f"starting {pipeline}: {len(runtime.children)} process(es)")
    if config.model_path:  # clients see only the name; the operator gets the path
        model = (config.server.served_model_names or [public_model_name(config.model_path)])[0]
        say(f"model {config.model_path} (clients see {model!r})")
    say(f"runtime directory {runtime.plan.endpoints.runtime_dir}")
    for note in runtime.plan.notes:  # what `omni plan` notes, said before anything starts
        say(f"note: {note}")
    say(f"process logs in {runtime.log_dir}: {_log_names(runtime)}")
    # HTTP listens from the first moment: while the processes load, /health answers
    # "starting" (503, each process's state) and requests a 503 that says so.
    server = make_server(
        create_app(runtime, resolution, api_key=key),
        "",
        0,
        grace=grace,
        header_timeout=config.server.header_timeout,
        body_timeout=config.server.body_timeout,
    )

    def on_signal(count: int) -> None:
        runtime.coordinator.accepting = False
        server.should_exit = True
        if count == 1:
            say(f"received {signals.received}: stopping (grace {grace:g} s; again to force)")
        else:
            server.force_exit = True

    def started(urls: list[str]) -> None:
        api = ", ".join(resolution.pipeline_cls.api)
        print(
            f"omni: serving {pipeline} on {urls[0]} (api: {api}; "
            f"auth: {'on' if key else 'off'}); loading the processes",
            flush=True,
        )

    http_done = anyio.Event()
    failure: BaseException | None = None

    async def http() -> None:
        try:
            await serve_runtime(server, [sock], on_started=started)
        finally:
            http_done.set()

    # Repeated log records (an accept loop out of file descriptors) are counted, not
    # printed, until the loop ends: retries asyncio scheduled during a flood can still fire
    # while the processes stop, after the HTTP server (and its own limiter) is gone.
    with limit_repeats() as limiter:
        async with anyio.create_task_group() as tg:
            tg.start_soon(http)
            tg.start_soon(limiter.flush_every_interval)
            try:
                # While the processes load a signal cancels the start (on_signal is unset);
                # once they are up, it stops the server gracefully.
                async with runtime:
                    # on stdout, after the address line: what scripts wait for
                    print(f"omni: ready: every process of {pipeline} is up", flush=True)
                    signals.on_signal = on_signal
                    await http_done.wait()
                    signals.on_signal = None  # from here a signal cancels the grace period
                    say("server stopped; stopping the processes")
            except BaseException as exc:  # the load failed or was cancelled: stop listening
                failure = exc
                server.should_exit = True
                await http_done.wait()
            tg.cancel_scope.cancel()  # the limiter's flushing task
    if failure is not None:
        raise failure
    say(f"stopped; the process logs stay in {runtime.log_dir} (omni logs DEPLOY shows them)")


def _log_to_stderr() -> None:
    """``omni.*`` records (INFO and up: a failed request's traceback, a refused
    handshake) on stderr, one line each (plus a traceback), beside ``say``'s lines."""
    import logging
    import sys

    logger = logging.getLogger("omni")
    if not any(getattr(h, "omni_serve", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))
        handler.omni_serve = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def _log_names(runtime: Any) -> str:
    return ", ".join(os.path.basename(child.log_path) for child in runtime.children.values())


@deployment_command(app, "run")
def run_command(
    resolution,
    text: str | None = typer.Option(None, "--text", help="Text to speak (speech pipelines)."),
    prompt: str | None = typer.Option(None, "--prompt", help="User message (chat pipelines)."),
    output: Path | None = typer.Option(
        None, "-o", "--output", help="Audio file to write (.wav, .pcm or .flac)."
    ),
    voice: str | None = typer.Option(None, "--voice", help="Voice name."),
) -> None:
    """Run one request through DEPLOY's runtime without a server; write audio, print text."""
    from ..serve.common.errors import APIError
    from ..serve.service import Serving

    serving = Serving.of(resolution.pipeline_cls)
    if (text is None) == (prompt is None):
        raise UsageError("give exactly one of --text (speech) or --prompt (chat)")
    fmt = None
    if output is not None:
        fmt = SPEECH_FORMATS.get(output.suffix.lower())
        if fmt is None:
            raise UsageError(
                f"cannot tell the audio format of {str(output)!r}",
                hint="end the file name in .wav, .pcm or .flac",
            )
    if text is not None:
        if "speech" not in serving.api:
            raise UsageError(f"pipeline {serving.pipeline!r} does not serve speech; use --prompt")
        if output is None:
            raise UsageError("--text needs -o FILE for the audio")
        api, data = "speech", _body("speech", input=text, voice=voice, response_format=fmt)
    else:
        if "chat" not in serving.api:
            raise UsageError(f"pipeline {serving.pipeline!r} does not serve chat; use --text")
        if output is not None and not serving.audio_stage:
            raise UsageError(f"pipeline {serving.pipeline!r} produces no audio; drop -o")
        modalities = [
            *(["text"] if serving.text_stage else []),
            *(["audio"] if output is not None else []),
        ]
        if not modalities:
            raise UsageError(f"pipeline {serving.pipeline!r} produces only audio; add -o FILE")
        data = _body(
            "chat",
            messages=[{"role": "user", "content": prompt}],
            modalities=modalities,
            audio={"voice": voice} if voice else None,
        )
        api = "chat"
    import anyio

    from ..serve.launch import run_until_signal

    try:
        outcome, _ = anyio.run(
            run_until_signal, lambda s: _run_one(resolution, api, data, output, fmt)
        )
    except APIError as exc:
        if exc.status == 400:
            raise RequestError(exc.message) from None
        raise OmniError(exc.message) from None
    if outcome is None:
        raise typer.Exit(130)


def _body(api: str, **fields: Any) -> dict[str, Any]:
    """The request as the server would validate it, so that run and serve agree."""
    from pydantic import ValidationError

    from ..serve.common.protocol import ChatRequest, SpeechRequest

    model = SpeechRequest if api == "speech" else ChatRequest
    try:
        body = model.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise UsageError(f"invalid request: {problems}") from None
    return body.payload() if isinstance(body, ChatRequest) else body.model_dump(mode="json")


async def _run_one(
    resolution: Any, api: str, data: dict[str, Any], output: Path | None, fmt: str | None
) -> bool:
    import sys
    import time

    from ..serve.audio.encoders import check_format, encode_whole
    from ..serve.launch import build_runtime, say
    from ..serve.service import Service

    if fmt:
        check_format(fmt)
    runtime = build_runtime(resolution)
    async with runtime:
        service = Service.of(runtime, resolution.pipeline_cls, resolution.config)
        started = time.perf_counter()
        handle = await service.admit(data, {"api": api})
        pcm = bytearray()
        wrote_text = False
        try:
            async for piece in service.pieces(handle):
                if piece.kind == "audio":
                    pcm += piece.data
                elif piece.kind == "text":
                    sys.stdout.write(piece.data)
                    sys.stdout.flush()
                    wrote_text = True
        finally:
            await service.finish(handle, "interrupted")
        if wrote_text:
            sys.stdout.write("\n")
        elapsed = time.perf_counter() - started
    if output is not None:
        rate = service.serving.sample_rate or 0
        if not pcm:
            raise OmniError(f"pipeline {service.serving.pipeline!r} produced no audio")
        output.write_bytes(encode_whole(bytes(pcm), fmt or "wav", rate))
        seconds = len(pcm) / 2 / rate
        say(f"wrote {output} ({seconds:.2f} s of audio at {rate} Hz) in {elapsed:.2f} s")
    return True
