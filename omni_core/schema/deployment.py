"""Deployment-wide settings that are not stages: processes, placement, endpoints."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .sizes import parse_bytes


class ProcessConfig(BaseModel):
    """Replica policy for one logical process (keyed by process name).

    Member stages come from each stage's ``process`` field; this never repeats them.
    """

    model_config = ConfigDict(extra="forbid")

    num_replicas: int = 1
    replica_devices: list[int] | None = None

    @field_validator("replica_devices", mode="before")
    @classmethod
    def _parse_device_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return [int(part) for part in value.split(",") if part.strip()]
            except ValueError:
                raise ValueError(
                    f"replica_devices {value!r} is not a list of GPU ids; "
                    'write e.g. "0,1" or [0, 1]'
                ) from None
        return value

    @model_validator(mode="after")
    def _check(self) -> ProcessConfig:
        if self.num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {self.num_replicas}")
        if self.replica_devices is not None and any(d < 0 for d in self.replica_devices):
            raise ValueError(f"replica_devices has a negative GPU id: {self.replica_devices}")
        return self


class PlacementConfig(BaseModel):
    """Which placement policy plans the deployment, and its limits."""

    model_config = ConfigDict(extra="forbid")

    policy: str = "declared"
    memory_limit: float = Field(
        default=1.0, description="largest sum of memory fractions allowed on one GPU"
    )

    @model_validator(mode="after")
    def _check(self) -> PlacementConfig:
        if not 0 < self.memory_limit <= 1:
            raise ValueError(f"memory_limit must be in (0, 1], got {self.memory_limit}")
        return self


class ClusterConfig(BaseModel):
    """The GPU inventory to plan against, when it is not (or cannot be) detected."""

    model_config = ConfigDict(extra="forbid")

    gpus: int | None = None
    gpu_memory: int | None = None
    mps_available: bool | None = None

    @field_validator("gpu_memory", mode="before")
    @classmethod
    def _parse_memory(cls, value: Any) -> Any:
        return None if value is None else parse_bytes(value)

    @model_validator(mode="after")
    def _check(self) -> ClusterConfig:
        if self.gpus is not None and self.gpus < 0:
            raise ValueError(f"gpus must be >= 0, got {self.gpus}")
        return self


class EndpointsConfig(BaseModel):
    """Where per-deployment IPC endpoints (Unix sockets) live."""

    model_config = ConfigDict(extra="forbid")

    base_path: str = "/tmp/omni"
