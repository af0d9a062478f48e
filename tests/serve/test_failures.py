"""Failures an operator can debug: through a real ``omni serve`` subprocess.

A stage that raises is a 500 carrying the request id only; the server's own
stderr has the id, the stage, the process and the traceback, once. A stage
that breaks the serving contract (a text delta that is not a str) is a 500
naming the stage, the field and what was expected, logged under the id too.
The processes' logs are printed at start-up and kept after stop, and
``omni logs`` prints them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from serve_helpers import OmniServe, raw

LAUNCH = (sys.executable, str(Path(__file__).parent / "omni_launch.py"))


def chat(url: str, **extra) -> tuple[int, str]:
    body = {"model": "t-chat", "messages": [{"role": "user", "content": "hi there"}], **extra}
    reply = raw("POST", f"{url}/v1/chat/completions", json_body=body)
    return reply.status_code, reply.text


def request_id(text: str) -> str:
    match = re.search(r"request id ([0-9a-f]+)", text)
    assert match, text
    return match.group(1)


def test_a_failing_stage_is_logged_with_its_traceback_and_its_logs_are_kept(short_tmp):
    tmp_path = short_tmp  # socket paths must stay short
    logs = tmp_path / "logs"
    served = OmniServe(tmp_path, ("--pipeline", "t-chat"), ("--log-dir", str(logs)), command=LAUNCH)
    try:
        status, text = chat(served.url, test_raise=True)
        assert status == 500, text
        rid = request_id(text)
        assert "Traceback" not in text and "ZeroDivisionError" not in text

        status, listed = chat(served.url, test_list=True)
        assert status == 500, listed
        lid = request_id(listed)
        assert "stage 'text'" in listed and "text delta of type list; expected str" in listed

        assert chat(served.url)[0] == 200  # the server still serves
    finally:
        assert served.stop() == 0, served.stderr()
    err = served.stderr()
    (line,) = [x for x in err.splitlines() if rid in x]
    assert "failed in stage 'think' (process p)" in line
    assert err.count("Traceback") == 1  # once, under the id
    tail = err[err.index(line) :]
    assert "ZeroDivisionError: division by zero" in tail  # the traceback's last line
    assert 'return {"reply": 1 / 0}' in tail
    (broken,) = [x for x in err.splitlines() if lid in x]
    assert "stage 'text' (process p)" in broken and "expected str" in broken

    # Printed at start-up and at stop, and still there after stop.
    (run,) = logs.iterdir()
    assert f"process logs in {run}: p.log" in err
    assert f"the process logs stay in {run}" in err
    assert (logs.stat().st_mode & 0o777) == 0o700 and (run.stat().st_mode & 0o777) == 0o700
    kept = (run / "p.log").read_text()
    assert f"request {rid} failed in stage think" in kept and "ZeroDivisionError" in kept
    assert not list((tmp_path / "run").iterdir())  # the runtime directory is gone

    flags = ("--endpoints.base_path", str(tmp_path / "run"), "--log-dir", str(logs))
    shown = omni("logs", "--pipeline", "t-chat", "p", *flags)
    assert shown.returncode == 0, shown.stderr
    assert f"==> {run / 'p.log'} <==" in shown.stdout and "ZeroDivisionError" in shown.stdout
    listed = omni("logs", "--pipeline", "t-chat", "--paths", *flags)
    assert listed.stdout.split() == [str(run / "p.log")]
    unknown = omni("logs", "--pipeline", "t-chat", "nope", *flags)
    assert unknown.returncode == 2 and "the processes are: p" in unknown.stderr
    other = omni("logs", "--pipeline", "t-chat", "--log-dir", str(logs))  # another deployment id
    assert other.returncode == 1 and "no logs of deployment t-chat-" in other.stderr
    assert "runs of t-chat there" in other.stderr


def omni(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*LAUNCH, *args], capture_output=True, text=True, timeout=60)
