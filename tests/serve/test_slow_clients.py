"""Slow clients: a request's headers and body each have a deadline (1 s each on this server).

Raw sockets, all to 127.0.0.1: half-sent request lines, headers followed by
half a body, a client dribbling bytes to look busy, and a kept-alive
connection that starts a second request and stalls. Every loop is bounded by
a count and a clock.
"""

from __future__ import annotations

import selectors
import socket
import time

SLACK = 3.0  # seconds beyond a deadline before the test calls it held for good


def connect(server) -> socket.socket:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    assert host == "127.0.0.1"
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.setblocking(False)
    return sock


def until_closed(socks: list[socket.socket], limit: float) -> dict[socket.socket, tuple]:
    """For each socket: (seconds until the server closed it, bytes it sent first) or None."""
    started = time.monotonic()
    outcome: dict[socket.socket, tuple] = {}
    received = {sock: b"" for sock in socks}
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ)
        while len(outcome) < len(socks) and time.monotonic() - started < limit:
            for key, _ in selector.select(timeout=0.1):
                sock = key.fileobj
                try:
                    data = sock.recv(65536)
                except ConnectionResetError:
                    data = b""
                if data:
                    received[sock] += data
                    continue
                outcome[sock] = (time.monotonic() - started, received[sock])
                selector.unregister(sock)
    return {sock: outcome.get(sock) for sock in socks}


def test_a_hundred_half_sent_requests_are_all_dropped(deadline_server):
    partial_head = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: appl"
    partial_body = (
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        b'{"input": '
    )
    heads = [connect(deadline_server) for _ in range(60)]
    bodies = [connect(deadline_server) for _ in range(40)]
    try:
        for sock in heads:
            sock.sendall(partial_head)
        for sock in bodies:
            sock.sendall(partial_body)
        outcome = until_closed(heads + bodies, 1 + SLACK)
        assert all(outcome[s] is not None for s in heads + bodies), "connections still held"
        for sock in heads:
            seconds, data = outcome[sock]
            assert data == b"" and seconds > 0.8  # dropped at the header deadline, not before
        for sock in bodies:
            seconds, data = outcome[sock]
            assert data.startswith(b"HTTP/1.1 408 "), data[:80]
            assert b"not received within 1 s (10 bytes arrived)" in data
            assert seconds > 0.8
    finally:
        for sock in heads + bodies:
            sock.close()
    state = deadline_server.server.server_state
    deadline = time.monotonic() + 2
    while state.connections and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not state.connections  # the server holds none of them either
    # and it still serves
    assert deadline_server.client().models.list().data[0].id == "t-speech"
    speech = deadline_server.client().audio.speech.create(
        model="t-speech", input="still here", voice="alice"
    )
    assert speech.content[:4] == b"RIFF"


def test_the_header_deadline_holds_against_a_client_that_keeps_sending(deadline_server):
    sock = connect(deadline_server)
    started = time.monotonic()
    closed_after = None
    try:
        for byte in b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100:
            if time.monotonic() - started > 1 + SLACK:
                break
            try:
                sock.send(bytes([byte]))
                if sock.recv(1) == b"":
                    closed_after = time.monotonic() - started
                    break
            except BlockingIOError:
                pass
            except (BrokenPipeError, ConnectionResetError):
                closed_after = time.monotonic() - started
                break
            time.sleep(0.1)
    finally:
        sock.close()
    assert closed_after is not None and closed_after < 1 + SLACK


def test_a_kept_alive_connection_gets_the_deadline_for_its_next_request(deadline_server):
    sock = connect(deadline_server)
    sock.setblocking(True)
    try:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        first = b""
        while b"t-speech" not in first and len(first) < 65536:
            first += sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 12")  # the second request stalls
        sock.setblocking(False)
        (outcome,) = until_closed([sock], 1 + SLACK).values()
        assert outcome is not None and outcome[1] == b""
    finally:
        sock.close()


def test_a_body_no_handler_reads_is_still_bounded(deadline_server):
    """/v1/models answers without reading a body; the connection then may not idle on it."""
    sock = connect(deadline_server)
    sock.setblocking(True)
    sock.settimeout(5)
    started = time.monotonic()
    try:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n")
        reply = b""
        while b"t-speech" not in reply and len(reply) < 65536:
            reply += sock.recv(65536)
        assert reply.startswith(b"HTTP/1.1 200 ")
        sock.setblocking(False)
        closed = False
        for _ in range(40):  # a byte every 0.2 s: never idle long enough for keep-alive's 5 s
            try:
                sock.send(b"x")
                closed = sock.recv(1) == b""
            except BlockingIOError:
                pass
            except (BrokenPipeError, ConnectionResetError):
                closed = True
            if closed:
                break
            time.sleep(0.2)
        assert closed, "the half-sent body held the connection"
        assert time.monotonic() - started < 1 + SLACK + 1
    finally:
        sock.close()
