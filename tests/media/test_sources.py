"""Reading what a media reference names: data: URLs, checked local files, remote URLs if allowed.

Only 127.0.0.1 is ever contacted: the remote tests run a small HTTP server of
their own on it and pass the test-only ``allow_loopback``.
"""

from __future__ import annotations

import base64
import os
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from omni_core.media import (
    MediaError,
    MediaFetch,
    read_base64,
    read_media,
    read_media_sync,
    sources,
)

pytestmark = pytest.mark.anyio

FIELD = "messages.0.content.0.image_url.url"
FETCH = MediaFetch()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def data_url(raw: bytes, head: str = "image/png;base64") -> str:
    return f"data:{head},{base64.b64encode(raw).decode()}"


# data: URLs and base64 -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("head", "mediatype"),
    [
        ("image/png;base64", "image/png"),
        ("IMAGE/PNG;BASE64", "image/png"),
        ("image;base64", "image"),  # as the Qwen examples write it
        ("audio/wav;name=a.wav;base64", "audio/wav"),
        (";base64", None),
        ("base64", None),
    ],
)
async def test_a_data_url_gives_its_bytes_and_declared_type(head, mediatype):
    raw = bytes(range(256))
    assert await read_media(data_url(raw, head), FIELD, FETCH) == (raw, mediatype)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("data:image/png;base64", "needs a ','"),
        ("data:image/png,hello", "must be base64"),
        ("data:image/png;base64,", "is empty"),
        ("data:image/png;base64,aGVsbG8", "is not base64"),  # unpadded
        ("data:image/png;base64,aGVs\nbG8=", "is not base64"),
        ("data:image/png;base64,aGVs%3D===", "is not base64"),
        ("data:image/png;base64,aGVsbG8é", "is not base64"),
    ],
)
async def test_bad_data_urls_are_refused_naming_the_field(url, message):
    with pytest.raises(MediaError, match=message) as caught:
        await read_media(url, FIELD, FETCH)
    assert caught.value.field == FIELD and caught.value.message.startswith(FIELD)


async def test_a_data_url_over_the_limit_is_refused_before_decoding(monkeypatch):
    url = data_url(b"x" * 12)

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded before the size was checked")

    assert (await read_media(url, FIELD, MediaFetch(max_bytes=12)))[0] == b"x" * 12
    monkeypatch.setattr(sources.base64, "b64decode", no_decoding)
    with pytest.raises(MediaError, match="holds 12 bytes; the limit is 11 bytes"):
        await read_media(url, FIELD, MediaFetch(max_bytes=11))


@pytest.mark.parametrize("size", [10, 11, 12])
def test_read_base64_counts_padding_exactly(size):
    text = base64.b64encode(b"a" * size).decode()
    assert read_base64(text, "input_audio.data", size) == b"a" * size
    with pytest.raises(MediaError, match=f"holds {size} bytes; the limit is {size - 1}"):
        read_base64(text, "input_audio.data", size - 1)


def test_read_base64_refuses_what_is_not_base64_text():
    with pytest.raises(MediaError, match="expected base64 text, got bytes"):
        read_base64(b"aGVsbG8=", "f", 100)  # type: ignore[arg-type]
    with pytest.raises(MediaError, match="is not base64"):
        read_base64("aGVs bG8=", "f", 100)
    with pytest.raises(MediaError, match="is empty"):
        read_base64("", "f", 100)


# local files ---------------------------------------------------------------------------


async def test_an_absolute_path_and_a_file_url_are_read(tmp_path):
    image = tmp_path / "photo.jpg"
    image.write_bytes(b"\xff\xd8\xff" + b"j" * 100)
    assert await read_media(str(image), FIELD, FETCH) == (image.read_bytes(), None)
    assert await read_media(f"file://{image}", FIELD, FETCH) == (image.read_bytes(), None)


async def test_a_file_url_is_read_literally_as_the_server_resolved_it(tmp_path):
    # the server percent-decodes the client's URL once and passes the resolved path on
    (tmp_path / "a%41.png").write_bytes(b"checked")
    (tmp_path / "aA.png").write_bytes(b"never checked")
    assert (await read_media(f"file://{tmp_path}/a%41.png", FIELD, FETCH))[0] == b"checked"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("photo.jpg", "must be absolute"),
        ("./photo.jpg", "must be absolute"),
        ("file://localhost/tmp/photo.jpg", "must be file:///absolute/path"),
        ("file:/tmp/photo.jpg", "must be file:///absolute/path"),
        ("file://photo.jpg", "must be file:///absolute/path"),
        ("/tmp/a\0b.jpg", "must be absolute"),
        ("ftp://example.com/a.png", "unsupported URL scheme 'ftp'"),
        ("s3://bucket/a.png", "unsupported URL scheme 's3'"),
    ],
)
async def test_references_a_stage_cannot_have_been_given_are_refused(value, message):
    with pytest.raises(MediaError, match=message) as caught:
        await read_media(value, FIELD, FETCH)
    assert caught.value.field == FIELD


async def test_a_missing_file_is_refused_without_echoing_the_servers_path(tmp_path):
    missing = tmp_path / "secret-layout" / "gone.png"
    with pytest.raises(MediaError, match="no longer exists") as caught:
        await read_media(str(missing), FIELD, FETCH)
    assert "secret-layout" not in caught.value.message


async def test_a_directory_is_not_a_regular_file(tmp_path):
    with pytest.raises(MediaError, match="not a regular file"):
        await read_media(str(tmp_path), FIELD, FETCH)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "swapped.png"
    os.mkfifo(fifo)  # no writer: a plain open() would wait forever
    outcome: list[BaseException] = []

    def attempt() -> None:
        try:
            read_media_sync(str(fifo), FIELD, FETCH)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(timeout=5)
    assert not thread.is_alive(), "reading a FIFO blocked"
    assert isinstance(outcome[0], MediaError) and "not a regular file" in outcome[0].message


def test_a_file_over_the_limit_is_refused_by_its_size_before_reading(tmp_path):
    huge = tmp_path / "huge.png"
    with open(huge, "wb") as f:
        f.truncate(1 << 40)  # sparse: a TiB that takes no disk and must not be read
    started = time.monotonic()
    with pytest.raises(MediaError, match="is 1099511627776 bytes; the limit is 1000 bytes"):
        read_media_sync(str(huge), FIELD, MediaFetch(max_bytes=1000))
    assert time.monotonic() - started < 5  # reading a TiB, even of holes, takes minutes
    exact = tmp_path / "exact.png"
    exact.write_bytes(b"e" * 1000)
    assert read_media_sync(str(exact), FIELD, MediaFetch(max_bytes=1000))[0] == b"e" * 1000


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_a_file_longer_than_its_stated_size_stops_at_the_limit():
    # /proc files state a size of 0 and then yield more: like a file growing after fstat
    assert os.stat("/proc/self/status").st_size == 0
    with pytest.raises(MediaError, match="grew while being read; the limit is 10 bytes"):
        read_media_sync("/proc/self/status", FIELD, MediaFetch(max_bytes=10))


# remote URLs ---------------------------------------------------------------------------


@asynccontextmanager
async def local_server(body: bytes) -> AsyncIterator[tuple[int, list[int]]]:
    """An HTTP server on 127.0.0.1 answering every request with ``body``."""
    connections: list[int] = []
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)

    async def serve(stream: anyio.abc.SocketStream) -> None:
        connections.append(1)
        async with stream:
            request = b""
            with anyio.move_on_after(5):
                while b"\r\n\r\n" not in request:
                    request += await stream.receive()
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            await stream.send(head + body)

    async with anyio.create_task_group() as group:
        group.start_soon(listener.serve, serve)
        try:
            yield port, connections
        finally:
            group.cancel_scope.cancel()


async def test_remote_media_is_refused_unless_allowed_and_nothing_is_contacted():
    async with local_server(b"image") as (port, connections):
        url = f"http://127.0.0.1:{port}/a.png"
        with pytest.raises(MediaError, match="does not fetch remote media") as caught:
            await read_media(url, FIELD, MediaFetch(allow_loopback=True))
        assert caught.value.hint == "the operator can set server.allow_remote_media"
        with pytest.raises(MediaError, match="does not fetch remote media"):
            await read_media(url.replace("http", "HTTPS", 1), FIELD, FETCH)
        await anyio.sleep(0.1)
        assert connections == []


async def test_allowed_remote_media_is_still_refused_on_a_private_address():
    async with local_server(b"image") as (port, connections):
        with pytest.raises(MediaError, match="a loopback address"):
            await read_media(f"http://127.0.0.1:{port}/a.png", FIELD, MediaFetch(allow_remote=True))
        assert connections == []


async def test_allowed_remote_media_is_fetched_under_the_byte_limit():
    body = bytes(range(256)) * 4
    fetch = MediaFetch(allow_remote=True, allow_loopback=True, max_bytes=len(body))
    async with local_server(body) as (port, _):
        url = f"http://127.0.0.1:{port}/a.png"
        assert await read_media(url, FIELD, fetch) == (body, None)
        small = MediaFetch(allow_remote=True, allow_loopback=True, max_bytes=len(body) - 1)
        with pytest.raises(MediaError, match="larger than the limit"):
            await read_media(url, FIELD, small)
        # the sync variant, from a worker thread, runs its own event loop for the fetch
        assert await anyio.to_thread.run_sync(read_media_sync, url, FIELD, fetch) == (body, None)


# the rest ------------------------------------------------------------------------------


async def test_a_reference_that_is_not_a_string_is_refused():
    with pytest.raises(MediaError, match="expected a URL or path, got dict"):
        await read_media({"url": "x"}, FIELD, FETCH)  # type: ignore[arg-type]


def test_fetch_settings_are_validated():
    with pytest.raises(ValueError, match="max_bytes >= 1"):
        MediaFetch(max_bytes=0)
    with pytest.raises(ValueError, match="timeout > 0"):
        MediaFetch(timeout=0)


async def test_a_data_url_image_reaches_the_decoder_whole():
    image_module = pytest.importorskip("PIL.Image")
    import io

    import numpy as np

    from omni_core.media import ImageLimits, decode_image

    pixels = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    out = io.BytesIO()
    image_module.fromarray(pixels).save(out, "PNG")
    raw, mediatype = await read_media(data_url(out.getvalue()), FIELD, FETCH)
    assert mediatype == "image/png"
    np.testing.assert_array_equal(decode_image(raw, FIELD, ImageLimits()), pixels)
