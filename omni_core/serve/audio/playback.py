"""One request's audio as a client that plays it on arrival would hear it.

The API hands audio to clients in chunks as the pipeline makes it. A client
that starts playing at the first chunk keeps playing only while the audio it
already holds lasts: a chunk that arrives after that ran out is an *underrun*
(the playback buffer ran dry, and the listener heard a gap). Counting them
tells an operator whether the deployment keeps up with real time, which
latency averages hide: a request can start fast and still stutter.

The model is deliberately simple and clock-driven, so that it can be tested
exactly: the buffer holds the audio delivered so far minus the wall time
played since the first chunk; after a stall playback resumes with the chunk
that ended it, so one stall counts once, not once for every later chunk.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Arrival:
    """What one audio chunk's arrival says about the request's playback."""

    first_audio: float | None  # seconds from the request's start, for its first chunk only
    interval: float | None  # seconds since the previous chunk; None for the first
    underrun: bool  # the audio delivered before it had already played out


@dataclass
class Playback:
    """The playback clock of one request; times are ``time.perf_counter()`` seconds."""

    started: float  # when the request arrived
    audio_seconds: float = 0.0  # audio delivered so far
    underruns: int = 0
    first_at: float | None = None
    last_at: float | None = None
    dry_at: float = 0.0  # when the audio delivered so far runs out, if nothing else comes

    def chunk(self, seconds: float, now: float) -> Arrival:
        """Account for a chunk of ``seconds`` of audio handed to the client at ``now``."""
        first = self.last_at is None
        interval = None if self.last_at is None else now - self.last_at
        underrun = not first and now > self.dry_at
        if underrun:
            self.underruns += 1
        self.dry_at = max(self.dry_at, now) + seconds
        if first:
            self.first_at = now
        self.last_at = now
        self.audio_seconds += seconds
        return Arrival(now - self.started if first else None, interval, underrun)

    @property
    def real_time_factor(self) -> float | None:
        """Wall time from the request's start to its last chunk per second of audio.

        Below 1 the deployment makes audio faster than it plays; None before
        any audio arrived.
        """
        if self.last_at is None or self.audio_seconds <= 0:
            return None
        return (self.last_at - self.started) / self.audio_seconds
