"""A real server for the tests: the runtime's children, uvicorn on a free port, in a thread.

The tests talk to it over HTTP with the official ``openai`` client. The test
pipelines come from :mod:`omni_test_speech`, registered on a private plugin
manager and handed to the children by module name.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import omni_test_speech as ts  # noqa: E402

from omni_core.config import load_deployment  # noqa: E402
from omni_core.plan.planner import plan_deployment  # noqa: E402
from omni_core.plugins import OmniPlugins  # noqa: E402
from omni_core.runtime import Runtime  # noqa: E402
from omni_core.serve.app import create_app  # noqa: E402
from omni_core.serve.server import bind, make_server, serve_runtime  # noqa: E402


class LiveServer:
    """``omni serve`` minus the command line: runtime + app + uvicorn on its own event loop."""

    def __init__(self, pipeline: str, flags: list[str], base: Path, api_key: str | None = None):
        self.plugins = OmniPlugins(env={})
        self.plugins.register(ts, ts.HERE)
        self.resolution = load_deployment(
            None,
            ["--endpoints.base_path", str(base), *flags],
            pipeline=pipeline,
            plugins=self.plugins,
        )
        self.api_key = api_key
        self.url = ""
        self.runtime: Any = None
        self.server: Any = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"server-{pipeline}", daemon=True)

    def start(self) -> LiveServer:
        self._thread.start()
        if not self._ready.wait(60):
            raise TimeoutError("the test server did not start in 60 s")
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        try:
            anyio.run(self._main)
        except BaseException as exc:
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        config = self.resolution.config
        plan = plan_deployment(config, plugins=self.plugins)
        self.runtime = Runtime(plan, config, plugins=self.plugins, plugin_modules=[ts.HERE])
        async with self.runtime:
            app = create_app(self.runtime, self.resolution, api_key=self.api_key)
            self.server = make_server(
                app,
                "",
                0,
                grace=1,
                header_timeout=config.server.header_timeout,
                body_timeout=config.server.body_timeout,
            )

            def started(urls: list[str]) -> None:
                self.url = urls[0]
                self._ready.set()

            await serve_runtime(self.server, [bind("127.0.0.1", 0)], on_started=started)

    def stop(self) -> None:
        if self.server is not None:
            self.server.should_exit = True
        self._thread.join(30)

    def client(self, api_key: str | None = "unused") -> Any:
        from openai import OpenAI

        return OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=30)


@pytest.fixture(scope="session")
def media_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("media")
    (path / "clip.wav").write_bytes(b"RIFF")
    return path


def _live(pipeline: str, flags: list[str], tmp: Path, **kw: Any) -> Iterator[LiveServer]:
    server = LiveServer(pipeline, flags, tmp, **kw).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def speech_server(tmp_path_factory: pytest.TempPathFactory, media_dir: Path):
    """t-speech, auth off, a 4 KiB body limit, media allowed from ``media_dir``."""
    flags = ["--server.max_body_bytes", "4096", "--server.media_dirs", f'["{media_dir}"]']
    yield from _live("t-speech", flags, tmp_path_factory.mktemp("speech"))


@pytest.fixture(scope="session")
def chat_server(tmp_path_factory: pytest.TempPathFactory):
    yield from _live("t-chat", [], tmp_path_factory.mktemp("chat"))


@pytest.fixture(scope="session")
def remote_media_server(tmp_path_factory: pytest.TempPathFactory):
    """t-speech whose operator allows remote media URLs (public addresses only)."""
    flags = ["--server.allow_remote_media", "true"]
    yield from _live("t-speech", flags, tmp_path_factory.mktemp("remote"))


@pytest.fixture(scope="session")
def deadline_server(tmp_path_factory: pytest.TempPathFactory):
    """t-speech giving clients 1 s for a request's headers and 1 s for its body."""
    flags = ["--server.header_timeout", "1", "--server.body_timeout", "1"]
    yield from _live("t-speech", flags, tmp_path_factory.mktemp("deadline"))


@pytest.fixture(scope="session")
def guarded_server(tmp_path_factory: pytest.TempPathFactory):
    """t-speech with an API key and room for one request at a time."""
    yield from _live(
        "t-speech",
        ["--runtime.max_inflight", "1"],
        tmp_path_factory.mktemp("guarded"),
        api_key="sekret",
    )
