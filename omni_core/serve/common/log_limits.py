"""Repeated log records: the first with its traceback, then a count at most once an interval.

Why: some failures repeat as fast as clients can cause them. Out of file
descriptors, CPython 3.11's accept loop reports "socket.accept() out of
system resource" with a traceback for every connection it tries (up to
uvicorn's backlog of 2048 a turn), again each second until descriptors come
back: 200 connections to a server under ``ulimit -n 96`` wrote 178,000
tracebacks (72 MB) in seconds, burying every other line and filling the
disk. Connection resets and disconnects repeat the same way. The operator
needs one traceback and how often it happened, not every copy.

:class:`RepeatLimiter` is a :class:`logging.Filter` on the loggers such
records come through (:data:`NOISY_LOGGERS`). Records are of one kind when
they share logger, level, the first line of the message (numbers and
addresses masked) and the exception's type and the line that raised it. The
first record of a kind passes whole. Others of that kind within ``interval``
seconds are counted and dropped; the first one after that passes as a single
line, without its traceback, saying how many were dropped, and starts the
next interval. :meth:`RepeatLimiter.flush` writes the count of an interval
that no later record closed; :func:`limit_repeats` calls it every interval
and at the end.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import anyio

NOISY_LOGGERS = ("asyncio", "uvicorn.error")
INTERVAL = 10.0
MAX_KINDS = 512  # kinds are few (they are code sites); the bound only caps memory
SUMMARY = "omni_repeat_summary"  # set on the limiter's own records, which always pass
_VARIABLE = re.compile(r"0x[0-9a-fA-F]+|\d+")

Kind = tuple[str, int, str, str, str]


class AlreadyLogged(Exception):
    """An error whose raiser logged it in one line: a traceback of it would add only noise.

    A streamed response that fails after its first bytes has to reach the
    server as an exception (that is how the connection gets cut, so the
    client sees an incomplete body), and uvicorn logs every such exception
    with its traceback; :class:`RepeatLimiter` drops those records.
    """


def kind_of(record: logging.LogRecord) -> Kind:
    """What makes two records "the same error": not their addresses, ports or file numbers."""
    exc_type, where = "", ""
    if record.exc_info and record.exc_info[0] is not None:
        exc_type = record.exc_info[0].__qualname__
        tb = record.exc_info[2]
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        if tb is not None:
            where = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
    return (record.name, record.levelno, _VARIABLE.sub("#", _headline(record)), exc_type, where)


def _headline(record: logging.LogRecord) -> str:
    try:
        message = record.getMessage()
    except Exception:  # a bad format string is logging's to report, not ours
        message = str(record.msg)
    return message.strip().split("\n", 1)[0]


@dataclass
class _Seen:
    since: float  # when the current interval of this kind began
    logger: str
    level: int
    headline: str
    suppressed: int = 0


class RepeatLimiter(logging.Filter):
    """Let a kind of record through once per ``interval`` seconds, counting the rest."""

    def __init__(self, interval: float = INTERVAL, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.interval, self.clock = interval, clock
        self._seen: dict[Kind, _Seen] = {}
        self._lock = threading.Lock()  # loggers are called from any thread

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, SUMMARY, False):
            return True
        if record.exc_info and isinstance(record.exc_info[1], AlreadyLogged):
            return False
        key, now = kind_of(record), self.clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is None or (now - seen.since >= self.interval and not seen.suppressed):
                self._remember(key, _Seen(now, record.name, record.levelno, _headline(record)))
                return True
            if now - seen.since < self.interval:
                seen.suppressed += 1
                return False
            count, span = seen.suppressed, now - seen.since
            seen.since, seen.suppressed = now, 0
        record.msg, record.args = _summary(_headline(record), count, span), None
        record.exc_info = record.exc_text = record.stack_info = None
        return True

    def flush(self, *, everything: bool = False) -> None:
        """Log the counts of intervals that ended (all of them if ``everything``)."""
        now = self.clock()
        due: list[tuple[_Seen, int, float]] = []
        with self._lock:
            for key, seen in list(self._seen.items()):
                ended = now - seen.since >= self.interval
                if seen.suppressed and (ended or everything):
                    due.append((seen, seen.suppressed, now - seen.since))
                    seen.since, seen.suppressed = now, 0
                elif ended and not seen.suppressed:
                    del self._seen[key]  # quiet for a whole interval: forget it
        for seen, count, span in due:  # outside the lock: the records pass filter() again
            logging.getLogger(seen.logger).log(
                seen.level, "%s", _summary(seen.headline, count, span), extra={SUMMARY: True}
            )

    async def flush_every_interval(self) -> None:
        while True:
            await anyio.sleep(self.interval)
            self.flush()

    def _remember(self, key: Kind, seen: _Seen) -> None:
        self._seen.pop(key, None)
        if len(self._seen) >= MAX_KINDS:
            del self._seen[next(iter(self._seen))]  # the oldest; its count, if any, is lost
        self._seen[key] = seen


def _summary(headline: str, count: int, span: float) -> str:
    return f"{headline} [{count} more like this suppressed in the last {span:.1f} s]"


@contextlib.contextmanager
def limit_repeats(
    loggers: Iterable[str] = NOISY_LOGGERS, interval: float = INTERVAL
) -> Iterator[RepeatLimiter]:
    """A :class:`RepeatLimiter` on ``loggers`` while the block runs; the counts left are logged.

    The caller runs :meth:`RepeatLimiter.flush_every_interval` beside its work
    (uvicorn's serve loop) so that the count of a burst that stopped is not
    held back until the next record of its kind.
    """
    limiter = RepeatLimiter(interval)
    targets = [logging.getLogger(name) for name in loggers]
    for logger in targets:
        logger.addFilter(limiter)
    try:
        yield limiter
    finally:
        limiter.flush(everything=True)
        for logger in targets:
            logger.removeFilter(limiter)
