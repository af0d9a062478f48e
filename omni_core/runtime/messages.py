"""What crosses between the coordinator and the stage processes.

One small dataclass, pickled as a skeleton by the transports, whose ``data``
may hold tensors, arrays and bytes that cross without being pickled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# kinds sent to a stage
DELIVER = "deliver"  # the input of a stage (or one source's part of a fan-in)
CHUNK = "chunk"  # one incremental chunk on a streaming edge
END = "end"  # the end of a streaming edge
ABORT = "abort"  # cancel the request everywhere
# kinds sent to the coordinator
OUTPUT = "output"  # a terminal stage's final result
OUTPUT_CHUNK = "output_chunk"  # a terminal stage's incremental output
FAILED = "failed"  # the request failed in a stage
SKIPPED = "skipped"  # a routing decision skipped these stages
# A process is alive, sent from its event loop every heartbeat interval (so a blocked
# loop falls silent); data: per stage, its queue depth and its runs so far:
# {"queue": {stage: {"running": n, "waiting": m}}, "runs": {stage: {"count": k, "seconds": s}}}.
HEARTBEAT = "heartbeat"


@dataclass
class Envelope:
    kind: str
    request_id: str
    target: str = ""  # logical stage name; "" for the coordinator
    source: str = ""  # logical stage (or "client")
    data: Any = None
    params: dict[str, Any] = field(default_factory=dict)
    binding: dict[str, int] = field(default_factory=dict)  # logical process -> replica
    skipped: frozenset[str] = frozenset()
    error: str = ""
    client_error: bool = False  # FAILED: the request itself was invalid (HTTP 400)
    process_lost: bool = False  # FAILED: a stage it needed could not be reached (HTTP 503)
    # FAILED: the process the stage ran in and the exception's traceback, for the
    # server's log (never for the client: it can hold paths and data).
    process: str = ""
    detail: str = ""
