"""The MPS daemons of a deployment: one per GPU the plan enables MPS on.

Each daemon gets its own pipe and log directory under the runtime directory,
so two deployments (or a daemon the operator runs) never share a control
pipe; the client processes on that GPU find it through
``CUDA_MPS_PIPE_DIRECTORY`` / ``CUDA_MPS_LOG_DIRECTORY`` (unless the user set
those, in which case the user's daemon is used and none is started). The
daemon is started before the GPU's first client process and asked to quit
after its last one stopped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from ..errors import OmniError
from ..plan.inventory import MPS_CONTROL

USER_PIPE = "CUDA_MPS_PIPE_DIRECTORY"
CONTROL_TIMEOUT = 15.0


class MpsError(OmniError):
    """An MPS daemon could not be started (the plan enabled MPS on its GPU)."""


@dataclass
class MpsDaemon:
    gpu: int
    runtime_dir: str
    binary: str = ""
    started: bool = False

    @property
    def pipe_dir(self) -> str:
        return os.path.join(self.runtime_dir, "mps", f"gpu{self.gpu}", "pipe")

    @property
    def log_dir(self) -> str:
        return os.path.join(self.runtime_dir, "mps", f"gpu{self.gpu}", "log")

    def client_env(self) -> dict[str, str]:
        return {"CUDA_MPS_PIPE_DIRECTORY": self.pipe_dir, "CUDA_MPS_LOG_DIRECTORY": self.log_dir}

    def _env(self) -> dict[str, str]:
        return {**os.environ, **self.client_env(), "CUDA_VISIBLE_DEVICES": str(self.gpu)}

    def start(self) -> None:
        binary = shutil.which(MPS_CONTROL)
        if binary is None:
            raise MpsError(
                f"the plan runs GPU {self.gpu} under MPS, but {MPS_CONTROL} is not on PATH",
                hint="install the NVIDIA MPS tools, or set mps = auto or off",
            )
        os.makedirs(self.pipe_dir, mode=0o700)
        os.makedirs(self.log_dir, mode=0o700)
        result = subprocess.run(
            [binary, "-d"],
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=CONTROL_TIMEOUT,
            check=False,
        )
        if result.returncode != 0:
            raise MpsError(
                f"{MPS_CONTROL} -d for GPU {self.gpu} exited with status {result.returncode}: "
                f"{(result.stderr or result.stdout).strip()}"
            )
        self.binary, self.started = binary, True

    def stop(self) -> None:
        if not self.started:
            return
        subprocess.run(
            [self.binary],
            input="quit\n",
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=CONTROL_TIMEOUT,
            check=False,
        )
        self.started = False


def daemons_for(enabled_gpus: list[int], runtime_dir: str) -> dict[int, MpsDaemon]:
    """A daemon per enabled GPU, unless the user points clients at their own daemon."""
    if os.environ.get(USER_PIPE):
        return {}
    return {gpu: MpsDaemon(gpu, runtime_dir) for gpu in sorted(enabled_gpus)}
