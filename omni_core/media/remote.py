"""Remote media (http/https URLs): only to public addresses, and fetched under bounds.

A server that fetches URLs for its clients is a proxy into its own network:
``http://169.254.169.254/`` is the cloud's metadata service, ``http://10.0.0.5/``
an internal admin page, ``http://localhost:6379/`` a database. So remote media
is off unless the operator sets ``server.allow_remote_media``, and then:

- only ``http`` and ``https``, with a host, no user:password and a valid port;
- the host is resolved and *every* address must be public: loopback, private,
  link-local, multicast, reserved, unspecified and shared ranges are refused,
  also when wrapped in IPv6 (``::ffff:a.b.c.d``, 6to4, NAT64);
- :func:`fetch_remote_media` resolves and checks again at fetch time and
  connects to the checked address itself (so a DNS answer that changes between
  the check and the fetch cannot redirect it), follows no redirects, and stops
  at ``max_bytes`` and ``timeout``.

``allow_loopback`` exists for tests that fetch from a server on 127.0.0.1;
nothing in the configuration can set it.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from .errors import MediaError

SCHEMES = {"http": 80, "https": 443}
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
# Most specific first: the reason given is the first that applies.
REFUSED_FLAGS = ("loopback", "link_local", "multicast", "unspecified", "reserved", "private")


@dataclass(frozen=True)
class RemoteURL:
    """A syntactically acceptable http(s) URL, split into what the fetch needs."""

    url: str
    scheme: str
    host: str
    port: int
    target: str  # path and query, as sent in the request line

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == SCHEMES[self.scheme] else f"{host}:{self.port}"


def parse_remote_url(url: str, field: str) -> RemoteURL:
    """``url`` split, or MediaError saying what is wrong with it."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise MediaError(field, f"{field}: {url!r} is not a valid URL: {exc}") from None
    if parts.scheme not in SCHEMES:
        raise MediaError(field, f"{field}: remote media must be http:// or https://, got {url!r}")
    if not parts.hostname:
        raise MediaError(field, f"{field}: {url!r} names no host")
    if parts.username is not None or parts.password is not None:
        raise MediaError(field, f"{field}: URLs with a user name or password are not accepted")
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in url):
        raise MediaError(field, f"{field}: the URL contains spaces or control characters")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return RemoteURL(url, parts.scheme, parts.hostname, port or SCHEMES[parts.scheme], target)


def refusal(address: Address) -> str | None:
    """Why ``address`` may not be fetched from, or None when it is public."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is None and any(address in net for net in NAT64):
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None:
            inner = refusal(embedded)
            return f"{inner} ({embedded} inside {address})" if inner else None
        if address.is_site_local:
            return "site-local"
    for flag in REFUSED_FLAGS:
        if getattr(address, f"is_{flag}"):
            return flag.replace("_", "-")
    if not address.is_global:
        return "not globally routable"
    return None


async def resolve_public(
    remote: RemoteURL, field: str, *, allow_loopback: bool = False
) -> list[Address]:
    """Every address ``remote.host`` resolves to; MediaError unless all are public."""
    import anyio

    try:
        infos = await anyio.getaddrinfo(remote.host, remote.port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise MediaError(
            field, f"{field}: cannot resolve host {remote.host!r}: {exc.strerror or exc}"
        ) from None
    addresses: list[Address] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        reason = refusal(address)
        if reason and not (allow_loopback and address.is_loopback):
            raise MediaError(
                field,
                f"{field}: host {remote.host!r} resolves to {address}, a {reason} address; "
                "remote media is fetched only from public addresses",
            )
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise MediaError(field, f"{field}: host {remote.host!r} has no address")
    return addresses


async def check_remote_url(url: str, field: str) -> RemoteURL:
    """``url`` parsed and its host checked (what the server does before admitting a request)."""
    remote = parse_remote_url(url, field)
    await resolve_public(remote, field)
    return remote


async def fetch_remote_media(
    url: str, field: str, *, max_bytes: int, timeout: float, allow_loopback: bool = False
) -> bytes:
    """The body of ``url`` (HTTP 200 only), at most ``max_bytes``, within ``timeout`` seconds."""
    import anyio

    remote = parse_remote_url(url, field)
    try:
        with anyio.fail_after(timeout):
            addresses = await resolve_public(remote, field, allow_loopback=allow_loopback)
            stream = await _connect(remote, addresses, field)
            async with stream:
                return await exchange(stream, remote, field, max_bytes)
    except TimeoutError:
        raise MediaError(
            field,
            f"{field}: {url} was not fetched within {timeout:g} s",
            hint="the operator can raise server.remote_media_timeout",
        ) from None


async def _connect(remote: RemoteURL, addresses: list[Address], field: str) -> Any:
    import anyio

    failure: OSError | None = None
    for address in addresses:  # the checked addresses, never a fresh lookup
        try:
            return await anyio.connect_tcp(
                str(address),
                remote.port,
                tls=remote.scheme == "https",
                tls_hostname=remote.host if remote.scheme == "https" else None,
            )
        except OSError as exc:
            failure = exc
    raise MediaError(field, f"{field}: cannot connect to {remote.host_header}: {failure}")


async def exchange(stream: Any, remote: RemoteURL, field: str, max_bytes: int) -> bytes:
    """Send a GET for ``remote`` on an open byte stream and read the bounded answer."""
    import h11

    conn = h11.Connection(h11.CLIENT)
    request = h11.Request(
        method="GET",
        target=remote.target,
        headers=[
            ("Host", remote.host_header),
            ("User-Agent", "omni"),
            ("Accept", "*/*"),
            ("Connection", "close"),
        ],
    )
    await stream.send(conn.send(request) + (conn.send(h11.EndOfMessage()) or b""))
    return await read_response(stream, conn, remote.url, field, max_bytes)


async def read_response(stream: Any, conn: Any, url: str, field: str, max_bytes: int) -> bytes:
    """The body of a 200 answer read from ``stream`` through h11, refused beyond ``max_bytes``."""
    import anyio
    import h11

    body = bytearray()
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise MediaError(field, f"{field}: {url} answered invalid HTTP: {exc}") from None
        if event is h11.NEED_DATA:
            try:
                conn.receive_data(await stream.receive(65536))
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                conn.receive_data(b"")
        elif isinstance(event, h11.Response):
            _check_status(event, url, field, max_bytes)
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > max_bytes:
                raise MediaError(field, _too_large(url, field, max_bytes))
        elif isinstance(event, h11.EndOfMessage):
            return bytes(body)
        elif isinstance(event, h11.ConnectionClosed):
            raise MediaError(field, f"{field}: {url} closed the connection before the end")


def _check_status(response: Any, url: str, field: str, max_bytes: int) -> None:
    status = response.status_code
    if 300 <= status < 400:
        raise MediaError(
            field, f"{field}: {url} redirects (HTTP {status}); redirects are not followed"
        )
    if status != 200:
        raise MediaError(field, f"{field}: {url} answered HTTP {status}")
    for name, value in response.headers:
        if name == b"content-length" and value.isdigit() and int(value) > max_bytes:
            raise MediaError(field, _too_large(url, field, max_bytes))


def _too_large(url: str, field: str, max_bytes: int) -> str:
    return (
        f"{field}: {url} is larger than the limit of {max_bytes} bytes "
        "(server.remote_media_max_bytes)"
    )
