"""Runs benchmark scripts for the smoke tests, each in a fork of one interpreter that has
imported torch and nothing else (as omni's stage processes are forks of its fork server).

Why: a benchmark's ``--smoke`` run is seconds, and 1.2-1.5 s of each went to importing
torch, for some 30 runs in every ``make test``. A fork that has torch already is the
script's own process from there on: ``sys.argv``, ``sys.path[0]``, the working directory,
``__main__`` and the exit status are the script's, as under ``python SCRIPT``.

Protocol (one request at a time, one JSON object a line): the parent writes
``{"argv": [...], "cwd": ..., "stdout": path, "stderr": path}``; this process forks,
writes ``{"pid": N}``, waits, then writes ``{"returncode": N}`` (``-signal`` when a
signal ended it). It exits when its input closes.

Started by ``conftest.py`` with the environment of a smoke run (pytest blocked first on
``PYTHONPATH``): this file must not import pytest, and imports nothing of omni.
"""

from __future__ import annotations

import json
import os
import runpy
import sys

import torch  # noqa: F401 - what every fork starts with


def run_script(request: dict) -> None:
    """In the fork: become ``python ARGV...`` and exit as the script does (never returns)."""
    argv = request["argv"]
    os.chdir(request["cwd"])
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
    # an exception or SystemExit leaves as it would leave `python SCRIPT`: the
    # interpreter prints it, runs atexit's handlers and exits with its status
    runpy.run_path(argv[0], run_name="__main__")
    sys.exit(0)


def main() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            run_script(request)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    main()
