"""RepeatLimiter: a flood of one error becomes its first traceback and a count per interval."""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterator

import pytest

from omni_core.serve.common.log_limits import RepeatLimiter, limit_repeats

COUNT = re.compile(r"\[(\d+) more like this suppressed in the last [\d.]+ s\]")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A private logger writing to a string, as the server's stderr would show it."""
    logger = logging.getLogger("omni.test.log_limits")
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        yield logger, out
    finally:
        logger.removeHandler(handler)
        for f in list(logger.filters):
            logger.removeFilter(f)


def accept_failure(logger: logging.Logger, fd: int) -> None:
    """What asyncio logs when accept() runs out of descriptors (one call site, like asyncio's)."""
    try:
        raise OSError(24, "Too many open files")
    except OSError:
        logger.error(
            "socket.accept() out of system resource\nsocket: <TransportSocket fd=%d at 0x%x>",
            fd,
            id(object()),
            exc_info=True,
        )


def suppressed(text: str) -> int:
    return sum(int(n) for n in COUNT.findall(text))


def test_ten_thousand_identical_errors_in_one_interval_are_one_traceback_and_one_count(logged):
    logger, out = logged
    clock = Clock()
    limiter = RepeatLimiter(interval=10.0, clock=clock)
    logger.addFilter(limiter)
    for i in range(10_000):
        clock.now = i * 0.0005  # 5 s of errors, as fast as an accept loop makes them
        accept_failure(logger, fd=3 + i % 7)
    assert out.getvalue().count("Traceback") == 1
    assert "OSError: [Errno 24] Too many open files" in out.getvalue()
    assert COUNT.search(out.getvalue()) is None  # the interval is still open

    clock.now = 10.5
    limiter.flush()  # what the server does every interval
    text = out.getvalue()
    assert suppressed(text) == 9_999
    assert text.count("Traceback") == 1 and len(text.splitlines()) < 20
    assert text.splitlines()[-1].startswith("socket.accept() out of system resource [9999 more")


def test_a_storm_that_lasts_writes_one_line_per_interval_and_accounts_for_every_error(logged):
    logger, out = logged
    clock = Clock()
    logger.addFilter(RepeatLimiter(interval=10.0, clock=clock))
    for i in range(10_000):
        clock.now = i * 0.01  # 100 s
        accept_failure(logger, fd=3)
    lines = out.getvalue().splitlines()
    summaries = [line for line in lines if COUNT.search(line)]
    assert out.getvalue().count("Traceback") == 1
    assert 9 <= len(summaries) <= 10  # one per 10 s after the first
    assert all("Traceback" not in line and "fd=" not in line for line in summaries)
    # every error is either written or counted: 1 whole, the summaries, what they counted
    assert 1 + len(summaries) + suppressed(out.getvalue()) + pending(logger) == 10_000


def pending(logger: logging.Logger) -> int:
    limiter = next(f for f in logger.filters if isinstance(f, RepeatLimiter))
    return sum(seen.suppressed for seen in limiter._seen.values())


def test_other_errors_still_get_their_own_first_traceback(logged):
    logger, out = logged
    logger.addFilter(RepeatLimiter(interval=10.0, clock=Clock()))
    for fd in range(100):
        accept_failure(logger, fd)
    for _ in range(100):
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except ConnectionResetError:
            logger.error("Fatal error on transport", exc_info=True)
    logger.warning("Invalid HTTP request received.")
    logger.warning("Invalid HTTP request received.")
    text = out.getvalue()
    assert text.count("Traceback") == 2
    assert text.count("OSError: [Errno 24]") == 1
    assert text.count("ConnectionResetError: [Errno 104]") == 1
    assert text.count("Invalid HTTP request received.") == 1


def test_a_kind_quiet_for_an_interval_is_written_whole_again(logged):
    logger, out = logged
    clock = Clock()
    limiter = RepeatLimiter(interval=10.0, clock=clock)
    logger.addFilter(limiter)
    accept_failure(logger, 3)
    clock.now = 11.0
    limiter.flush()  # nothing to count: the kind is forgotten
    accept_failure(logger, 3)
    assert out.getvalue().count("Traceback") == 2
    assert COUNT.search(out.getvalue()) is None


def test_limit_repeats_counts_what_is_left_and_takes_its_filter_away(logged):
    logger, out = logged
    with limit_repeats([logger.name], interval=60.0):
        for fd in range(500):
            accept_failure(logger, fd)
        assert out.getvalue().count("Traceback") == 1
    assert suppressed(out.getvalue()) == 499  # written when the server stops
    assert logger.filters == []
    accept_failure(logger, 3)
    assert out.getvalue().count("Traceback") == 2


def test_a_stream_cut_mid_body_is_one_warning_and_its_traceback_is_dropped(logged, caplog):
    """A raw audio stream whose request fails after the first bytes: the client must see a
    cut connection (an exception to the server), the log one line, not uvicorn's traceback."""
    import anyio

    from omni_core.serve.common.bodies import OwnedStreamingResponse, StreamCut
    from omni_core.serve.common.errors import APIError

    async def body():
        yield b"RIFF"
        raise APIError(503, "process pipeline was killed by SIGKILL")

    closed: list[bool] = []

    async def on_close() -> None:
        closed.append(True)

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    async def receive() -> dict:
        await anyio.sleep_forever()
        return {}

    scope = {"type": "http", "method": "POST", "path": "/v1/audio/speech", "asgi": {}}
    response = OwnedStreamingResponse(body(), on_close, media_type="audio/wav")
    with (
        caplog.at_level(logging.WARNING, logger="omni.serve"),
        pytest.raises(StreamCut) as caught,
    ):
        anyio.run(response, scope, receive, send)
    assert closed == [True]
    assert [m.get("more_body") for m in sent if m["type"] == "http.response.body"] == [True]
    (line,) = [r.getMessage() for r in caplog.records if r.name == "omni.serve"]
    assert "failed after its response started (503 process pipeline was killed" in line
    assert "the connection was cut" in line
    # uvicorn's "Exception in ASGI application" record of it is dropped, others are not
    logger, out = logged
    logger.addFilter(RepeatLimiter())
    try:
        raise caught.value
    except StreamCut:
        logger.exception("Exception in ASGI application")
    try:
        raise ValueError("a real bug")
    except ValueError:
        logger.exception("Exception in ASGI application")
    assert out.getvalue().count("Traceback") == 1 and "a real bug" in out.getvalue()
