"""A real server for the tests: the runtime's children, uvicorn on a free port, in a thread.

The tests talk to it over HTTP with the official ``openai`` client. The test
pipelines come from :mod:`omni_test_speech`, registered on a private plugin
manager and handed to the children by module name.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from live_servers import running_server  # noqa: E402


@pytest.fixture(scope="session")
def media_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("media")
    (path / "clip.wav").write_bytes(b"RIFF")
    return path


@pytest.fixture(scope="session")
def speech_server(tmp_path_factory: pytest.TempPathFactory, media_dir: Path):
    """t-speech, auth off, a 4 KiB body limit, media allowed from ``media_dir``."""
    flags = ["--server.max_body_bytes", "4096", "--server.media_dirs", f'["{media_dir}"]']
    yield from running_server("t-speech", flags, tmp_path_factory.mktemp("speech"))


@pytest.fixture(scope="session")
def chat_server(tmp_path_factory: pytest.TempPathFactory):
    yield from running_server("t-chat", [], tmp_path_factory.mktemp("chat"))


@pytest.fixture(scope="session")
def remote_media_server(tmp_path_factory: pytest.TempPathFactory):
    """t-speech whose operator allows remote media URLs (public addresses only)."""
    flags = ["--server.allow_remote_media", "true"]
    yield from running_server("t-speech", flags, tmp_path_factory.mktemp("remote"))


@pytest.fixture(scope="session")
def deadline_server(tmp_path_factory: pytest.TempPathFactory):
    """t-speech giving clients 1 s for a request's headers and 1 s for its body."""
    flags = ["--server.header_timeout", "1", "--server.body_timeout", "1"]
    yield from running_server("t-speech", flags, tmp_path_factory.mktemp("deadline"))


@pytest.fixture(scope="session")
def guarded_server(tmp_path_factory: pytest.TempPathFactory):
    """t-speech with an API key and room for one request at a time."""
    yield from running_server(
        "t-speech",
        ["--runtime.max_inflight", "1"],
        tmp_path_factory.mktemp("guarded"),
        api_key="sekret",
    )
