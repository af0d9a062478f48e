"""Server VAD: where the user's speech starts and stops, from the audio as it arrives.

The detector is WebRTC's (``webrtcvad-wheels``: Google's GMM voice detector,
a small C extension with no model file and no torch), so the API process
stays light and a 30 ms frame costs microseconds. The session runs it in a
worker thread, so detection never waits behind anything on the event loop,
let alone the model, which lives in other processes.

Frames of 30 ms at 16 kHz (the session's 24 kHz PCM resampled). Speech
starts after :data:`START_FRAMES` voiced frames in a row; its start is
reported ``prefix_padding_ms`` before the first of them (the audio kept for
the turn starts there). It stops once ``silence_duration_ms`` pass without
a voiced frame; its end is the end of the last voiced frame. The Realtime
API's ``threshold`` (0..1) picks WebRTC's aggressiveness (0..3): a higher
threshold needs louder, clearer speech.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .formats import SESSION_RATE, resample

if TYPE_CHECKING:  # config asks this module whether detection can run (missing)
    from .config import TurnDetection

VAD_RATE = 16000
FRAME_MS = 30
FRAME_SAMPLES = VAD_RATE * FRAME_MS // 1000
START_FRAMES = 3  # 90 ms of speech before a turn is said to start

log = logging.getLogger(__name__)


@functools.cache
def missing() -> str | None:
    """Why server VAD cannot run in this server, or None when it can.

    The detector comes with the ``audio`` extra. A server installed without
    it still holds realtime sessions: they start with turn detection off (as
    ``session.created`` says) and end turns by ``input_audio_buffer.commit``,
    and a client that asks for ``server_vad`` is told why not, instead of the
    session failing at its first audio.
    """
    try:
        import webrtcvad  # noqa: F401
    except ImportError as exc:
        reason = (
            "server_vad needs WebRTC's voice detector (the webrtcvad-wheels package), "
            f"which this server lacks ({exc}): install it on the server with "
            "pip install 'omni-core[audio]', or set turn_detection to null and end "
            "each turn with input_audio_buffer.commit"
        )
        log.warning("realtime sessions start without turn detection: %s", reason)
        return reason
    return None


@dataclass(frozen=True)
class VadEvent:
    kind: str  # "started" or "stopped"
    ms: int  # audio_start_ms or audio_end_ms, from the start of the session's input audio


def aggressiveness(threshold: float) -> int:
    return min(3, int(threshold * 4))


class ServerVad:
    """Feed PCM16 at 24 kHz; get the speech starts and stops it completes."""

    def __init__(self, detection: TurnDetection):
        import webrtcvad

        self.detection = detection
        self._vad: Any = webrtcvad.Vad(aggressiveness(detection.threshold))
        self._pending = b""  # 24 kHz PCM not yet a whole frame
        self._frames = 0  # frames judged so far (time = frames * FRAME_MS)
        self._run = 0  # voiced frames in a row
        self._silent_ms = 0
        self.speaking = False
        self._last_voiced_end = 0

    def feed(self, pcm: bytes) -> list[VadEvent]:
        import numpy as np

        data = self._pending + pcm
        per_frame = FRAME_SAMPLES * SESSION_RATE // VAD_RATE * 2  # 24 kHz bytes per frame
        whole = len(data) - len(data) % per_frame
        self._pending = data[whole:]
        if not whole:
            return []
        samples = resample(np.frombuffer(data[:whole], dtype="<i2"), SESSION_RATE, VAD_RATE)
        frames = samples.astype("<i2").tobytes()
        events: list[VadEvent] = []
        step = FRAME_SAMPLES * 2
        for offset in range(0, len(frames) - step + 1, step):
            voiced = self._vad.is_speech(frames[offset : offset + step], VAD_RATE)
            events += self._judge(voiced)
        return events

    def _judge(self, voiced: bool) -> list[VadEvent]:
        start_ms = self._frames * FRAME_MS
        self._frames += 1
        if voiced:
            self._run += 1
            self._silent_ms = 0
            self._last_voiced_end = start_ms + FRAME_MS
            if not self.speaking and self._run >= START_FRAMES:
                self.speaking = True
                first = start_ms - (START_FRAMES - 1) * FRAME_MS
                return [VadEvent("started", max(0, first - self.detection.prefix_padding_ms))]
            return []
        self._run = 0
        if self.speaking:
            self._silent_ms += FRAME_MS
            if self._silent_ms >= self.detection.silence_duration_ms:
                self.speaking = False
                self._silent_ms = 0
                return [VadEvent("stopped", self._last_voiced_end)]
        return []
