"""Remote media: which addresses are refused, and a fetch that stops at its size and time limits.

Only 127.0.0.1 is ever contacted: the fetch tests run a small HTTP server of
their own on it and pass the test-only ``allow_loopback``; every other
address here is an IP literal (or ``localhost``), which resolves without DNS.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import pytest

from omni_core.media import MediaError
from omni_core.media.remote import (
    check_remote_url,
    fetch_remote_media,
    parse_remote_url,
    refusal,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "link-local"),  # the cloud metadata service
        ("fe80::1", "link-local"),
        ("fc00::1", "private"),
        ("fec0::1", "site-local"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("240.0.0.1", "reserved"),
        ("100.64.0.1", "not globally routable"),  # carrier-grade NAT
        ("::ffff:169.254.169.254", "link-local (169.254.169.254 inside"),
        ("::ffff:127.0.0.1", "loopback (127.0.0.1 inside"),
        ("64:ff9b::a9fe:a9fe", "link-local (169.254.169.254 inside"),  # NAT64
        ("2002:a9fe:a9fe::1", "link-local (169.254.169.254 inside"),  # 6to4
        ("2001::1", "private"),  # Teredo
    ],
)
def test_non_public_addresses_are_refused(address, reason):
    found = refusal(ipaddress.ip_address(address))
    assert found is not None and found.startswith(reason.split(" (")[0]), found
    if "inside" in reason:
        assert reason in found


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700::1111", "::ffff:8.8.8.8"])
def test_public_addresses_pass(address):
    assert refusal(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://8.8.8.8/a.wav", "must be http:// or https://"),
        ("http:///a.wav", "names no host"),
        ("http://user:secret@8.8.8.8/a.wav", "user name or password"),
        ("http://8.8.8.8:99999/a.wav", "is not a valid URL"),
        ("http://[::1/a.wav", "is not a valid URL"),
        ("http://8.8.8.8/a b.wav", "spaces or control characters"),
    ],
)
def test_malformed_urls_are_refused(url, message):
    with pytest.raises(MediaError, match=message) as caught:
        parse_remote_url(url, "f")
    assert caught.value.field == "f"


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/a.wav",
        "http://localhost:8000/a.wav",
        "http://2130706433/a.wav",  # 127.0.0.1 written as one number
        "http://0x7f.1/a.wav",
        "http://[::ffff:169.254.169.254]/latest/meta-data/",
        "https://169.254.169.254/",
        "http://10.0.0.1/",
    ],
)
async def test_hosts_are_resolved_and_every_address_checked(url):
    with pytest.raises(MediaError, match="remote media is fetched only from public addresses"):
        await check_remote_url(url, "f")


async def test_a_public_literal_passes_the_check_without_any_traffic():
    remote = await check_remote_url("https://8.8.8.8:8443/a.wav?x=1", "f")
    assert (remote.host, remote.port, remote.target) == ("8.8.8.8", 8443, "/a.wav?x=1")
    assert remote.host_header == "8.8.8.8:8443"


Handler = Callable[[anyio.abc.SocketStream], object]


@asynccontextmanager
async def local_server(handler: Handler) -> AsyncIterator[tuple[int, list[int]]]:
    """An HTTP server on 127.0.0.1 answering every connection with ``handler``."""
    connections: list[int] = []
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)

    async def serve(stream: anyio.abc.SocketStream) -> None:
        connections.append(1)
        async with stream:
            request = b""
            with anyio.move_on_after(5):
                while b"\r\n\r\n" not in request and len(request) < 65536:
                    request += await stream.receive()
            await handler(stream)

    async with anyio.create_task_group() as group:
        group.start_soon(listener.serve, serve)
        try:
            yield port, connections
        finally:
            group.cancel_scope.cancel()


def answer(head: bytes, body: bytes = b"", *, repeat: int = 1, stall: float = 0) -> Handler:
    async def handle(stream: anyio.abc.SocketStream) -> None:
        await stream.send(head)
        for _ in range(repeat):
            await stream.send(body)
        if stall:
            await anyio.sleep(stall)

    return handle


async def fetch(port: int, *, max_bytes: int = 1000, timeout: float = 5, **kw) -> bytes:
    return await fetch_remote_media(
        f"http://127.0.0.1:{port}/clip.wav",
        "messages.0.content.0.audio_url.url",
        max_bytes=max_bytes,
        timeout=timeout,
        **kw,
    )


async def test_a_small_file_is_fetched_whole():
    body = bytes(range(256)) * 3
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 768\r\n\r\n"
    async with local_server(answer(head, body)) as (port, _):
        assert await fetch(port, allow_loopback=True) == body


async def test_loopback_is_refused_before_connecting_without_the_test_flag():
    async with local_server(answer(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")) as (
        port,
        connections,
    ):
        with pytest.raises(MediaError, match=r"resolves to 127\.0\.0\.1, a loopback address"):
            await fetch(port)
        await anyio.sleep(0.1)
        assert connections == []


async def test_a_declared_length_over_the_limit_is_refused_before_the_body():
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n"
    async with local_server(answer(head, stall=10)) as (port, _):
        started = time.monotonic()
        with pytest.raises(MediaError, match="larger than the limit of 1000 bytes"):
            await fetch(port, allow_loopback=True)
        assert time.monotonic() - started < 5  # not the server's 10 s stall


async def test_an_undeclared_length_stops_at_the_limit():
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunk = b"100\r\n" + b"x" * 256 + b"\r\n"
    async with local_server(answer(head, chunk, repeat=10_000)) as (port, _):
        with pytest.raises(MediaError, match="larger than the limit of 1000 bytes"):
            await fetch(port, allow_loopback=True)


async def test_a_server_that_stalls_is_given_up_on_at_the_timeout():
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n"
    async with local_server(answer(head, b"x" * 10, stall=30)) as (port, _):
        started = time.monotonic()
        with pytest.raises(MediaError, match=r"was not fetched within 0\.5 s"):
            await fetch(port, timeout=0.5, allow_loopback=True)
        assert time.monotonic() - started < 5  # not the server's 30 s stall


@pytest.mark.parametrize(
    ("head", "message"),
    [
        (b"HTTP/1.1 302 Found\r\nLocation: http://169.254.169.254/\r\n\r\n", "redirects are not"),
        (b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", "answered HTTP 404"),
        (b"NOT HTTP AT ALL\r\n\r\n", "answered invalid HTTP"),
    ],
)
async def test_anything_but_a_plain_200_is_refused(head, message):
    async with local_server(answer(head)) as (port, _):
        with pytest.raises(MediaError, match=message):
            await fetch(port, allow_loopback=True)
