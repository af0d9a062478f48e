"""Deployment-wide settings that are not stages: processes, placement, endpoints."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .sizes import parse_bytes


class ProcessConfig(BaseModel):
    """Replica policy for one logical process (keyed by process name).

    Member stages come from each stage's ``process`` field; this never repeats them.
    """

    model_config = ConfigDict(extra="forbid", defer_build=True)

    num_replicas: int = 1
    replica_devices: list[int] | None = None
    node: str | None = Field(
        default=None,
        description="cluster node the process runs on (multi-node plans; [cluster] nodes)",
    )

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

    model_config = ConfigDict(extra="forbid", defer_build=True)

    policy: str = "declared"
    memory_limit: float = Field(
        default=1.0, description="largest sum of memory fractions allowed on one GPU"
    )

    @model_validator(mode="after")
    def _check(self) -> PlacementConfig:
        if not 0 < self.memory_limit <= 1:
            raise ValueError(f"memory_limit must be in (0, 1], got {self.memory_limit}")
        return self


class NodeConfig(BaseModel):
    """One machine of a multi-node cluster, declared for planning on hardware you are not on.

    GPU ids count the cluster's GPUs in node order (the first node's first),
    so on one node they are that node's own ids; each process is told its
    node-local id.
    """

    model_config = ConfigDict(extra="forbid", defer_build=True)

    name: str
    gpus: int = 0
    gpu_memory: int | None = None
    cpus: float | None = None

    @field_validator("gpu_memory", mode="before")
    @classmethod
    def _parse_memory(cls, value: Any) -> Any:
        return None if value is None else parse_bytes(value)

    @model_validator(mode="after")
    def _check(self) -> NodeConfig:
        if not self.name or not self.name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(
                f"node name {self.name!r} must be letters, digits, '-' and '_' (it names "
                "actors and processes)"
            )
        if self.gpus < 0:
            raise ValueError(f"node {self.name!r}: gpus must be >= 0, got {self.gpus}")
        if self.cpus is not None and self.cpus <= 0:
            raise ValueError(f"node {self.name!r}: cpus must be > 0, got {self.cpus}")
        return self


class ClusterConfig(BaseModel):
    """The GPU inventory to plan against, when it is not (or cannot be) detected."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    gpus: int | None = None
    gpu_memory: int | None = None
    mps_available: bool | None = None
    nodes: list[NodeConfig] = Field(
        default=[],  # not default_factory=list: see stage.py
        description="machines of a multi-node cluster, for planning offline; "
        "the first is where omni serve runs",
    )

    @field_validator("gpu_memory", mode="before")
    @classmethod
    def _parse_memory(cls, value: Any) -> Any:
        return None if value is None else parse_bytes(value)

    @model_validator(mode="after")
    def _check(self) -> ClusterConfig:
        if self.gpus is not None and self.gpus < 0:
            raise ValueError(f"gpus must be >= 0, got {self.gpus}")
        names = [node.name for node in self.nodes]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"nodes: the name {twice[0]!r} is used twice; names must differ")
        if self.nodes and self.gpus is not None:
            raise ValueError(
                "gpus and nodes both describe the inventory; with nodes, give each node its gpus"
            )
        return self


class EndpointsConfig(BaseModel):
    """Where per-deployment IPC endpoints (Unix sockets) live."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    base_path: str | None = Field(
        default=None,
        description="private (0700) directory for runtime directories; default "
        "$XDG_RUNTIME_DIR/omni, else omni-<uid> in the temp directory",
    )


MIN_HEARTBEAT_TIMEOUT = 0.5
MAX_HEARTBEAT_TIMEOUT = 3600.0


class RuntimeConfig(BaseModel):
    """How the runtime launches, supervises and routes (read by the parent process)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    startup_timeout: float = Field(default=120.0, description="seconds a process may take to start")
    request_timeout: float = Field(default=600.0, description="seconds before a request is aborted")
    max_inflight: int | None = Field(
        default=None, description="admission limit; default from engine limits and replicas"
    )
    binding: Literal["least-loaded", "round-robin"] = "least-loaded"
    restart_attempts: int = Field(default=3, description="restarts of a failed process group")
    restart_backoff: float = Field(default=1.0, description="first back-off, doubled each try")
    grace_period: float = Field(default=10.0, description="seconds in-flight requests get at stop")
    heartbeat_timeout: float = Field(
        default=5.0,
        description="seconds a process may stay silent before it is declared unresponsive, "
        "its requests failed and it is restarted",
    )
    cpu_threads: int | None = Field(
        default=None,
        description="torch (OpenMP) threads per process; default: the host's cores shared "
        "out among the deployment's processes, at least 1 each",
    )
    log_dir: str | None = Field(
        default=None,
        description="where each run's process logs are kept (<log_dir>/<deployment id>-<start "
        "time>/<process>.log; private, 0700; the last 10 runs of a deployment are kept); "
        "default $XDG_STATE_HOME/omni/logs, else ~/.local/state/omni/logs",
    )
    transport: str = Field(default="auto", description="transport between processes")
    launcher: str = Field(
        default="local",
        description='how process groups are started: "local" (child processes of omni '
        'serve) or "ray" (actors on a Ray cluster; pip install omni-core[ray])',
    )
    cross_node_transport: str = Field(
        default="tcp",
        description="transport of every edge between processes on different nodes",
    )
    edge_transports: dict[str, str] = Field(
        default_factory=dict, description='per edge, e.g. "tts_engine->vocoder" = "socket"'
    )

    @model_validator(mode="after")
    def _check(self) -> RuntimeConfig:
        for name in ("startup_timeout", "request_timeout", "grace_period"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not MIN_HEARTBEAT_TIMEOUT <= self.heartbeat_timeout <= MAX_HEARTBEAT_TIMEOUT:
            raise ValueError(
                f"heartbeat_timeout must be in {MIN_HEARTBEAT_TIMEOUT:g}-"
                f"{MAX_HEARTBEAT_TIMEOUT:g} seconds, got {self.heartbeat_timeout:g} (below "
                f"{MIN_HEARTBEAT_TIMEOUT:g} s ordinary scheduling delays on a busy machine "
                "would restart healthy processes)"
            )
        if self.restart_attempts < 0:
            raise ValueError(f"restart_attempts must be >= 0, got {self.restart_attempts}")
        if self.restart_backoff < 0:
            raise ValueError(f"restart_backoff must be >= 0, got {self.restart_backoff}")
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ValueError(f"cpu_threads must be >= 1, got {self.cpu_threads}")
        if self.max_inflight is not None and self.max_inflight < 1:
            raise ValueError(f"max_inflight must be >= 1, got {self.max_inflight}")
        for edge in self.edge_transports:
            if edge.count("->") != 1:
                raise ValueError(f'edge_transports key {edge!r} must be "SOURCE->TARGET"')
        return self


class RayConfig(BaseModel):
    """The Ray cluster ``runtime.launcher = "ray"`` runs on, and how the plan is placed there."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    address: str | None = Field(
        default=None,
        description="cluster to join (ray://... or HOST:PORT); default $RAY_ADDRESS, "
        "else a local cluster when start_local is set",
    )
    start_local: bool = Field(
        default=False, description="start a one-node Ray cluster when no address is given"
    )
    strategy: Literal["pack", "spread"] = Field(
        default="pack",
        description="pack processes onto as few nodes as fit, or spread them across nodes",
    )
    namespace: str = Field(default="omni", description="Ray namespace of the actors")
    cpus_per_process: float = Field(
        default=1.0, description="CPUs each process group reserves in its bundle"
    )
    connect_timeout: float = Field(
        default=60.0, description="seconds to join the cluster and place the placement group"
    )

    @model_validator(mode="after")
    def _check(self) -> RayConfig:
        if self.cpus_per_process <= 0:
            raise ValueError(f"cpus_per_process must be > 0, got {self.cpus_per_process}")
        if self.connect_timeout <= 0:
            raise ValueError(f"connect_timeout must be > 0, got {self.connect_timeout}")
        return self


class ServerConfig(BaseModel):
    """The HTTP server of ``omni serve``."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = Field(default=None, description="prefer the OMNI_API_KEY variable")
    max_body_bytes: int = 32 * 1024 * 1024
    media_dirs: list[str] = Field(
        default=[],  # not default_factory=list: see stage.py
        description="directories local media paths may be read from",
    )
    allow_remote_media: bool = Field(
        default=False,
        description="accept http(s) media URLs in chat messages (public addresses only)",
    )
    remote_media_max_bytes: int = Field(
        default=32 * 1024 * 1024, description="largest remote media file fetched"
    )
    remote_media_timeout: float = Field(
        default=30.0, description="seconds to resolve, connect and fetch one remote media file"
    )
    header_timeout: float = Field(
        default=10.0, description="seconds a client has to send a request's headers"
    )
    body_timeout: float = Field(
        default=60.0, description="seconds a client has to send a request's whole body"
    )
    ws_send_timeout: float = Field(
        default=10.0,
        description="seconds a WebSocket client may leave audio unread before it is disconnected",
    )
    max_input_chars: int = Field(
        default=4096,
        description="characters in each text field of a speech request (input, instructions, "
        "ref_text); OpenAI's speech API allows 4096",
    )
    max_chat_text_chars: int = Field(
        default=131072,
        description="characters of text in all the messages of one chat request together",
    )
    # list first: a command-line '["a", "b"]' is a list, a plain "a" a list of one
    served_model_name: list[str] | str | None = Field(
        default=None,
        description="the model name(s) clients send as model: one name or a list of aliases "
        "(the first is the one /v1/models shows); unset: the checkpoint's name",
    )
    openai_compat: bool = Field(
        default=False,
        description="the OpenAI preset: OpenAI's model names for what the pipeline serves "
        "(tts-1, tts-1-hd, gpt-4o-mini-tts; gpt-4o-audio-preview, gpt-4o-mini-audio-preview) "
        "are aliases of the served model, OpenAI's voice names map onto the model's voices "
        "in order (voice_aliases entries win), and /v1/audio/speech defaults to mp3",
    )
    voices_dir: str | None = Field(
        default=None,
        description="directory of uploaded voices (POST /v1/audio/voices); unset: uploads off. "
        "It must be a real directory of the server's user that group and others cannot "
        "write to (created 0700 if missing); links below it are never followed",
    )
    voice_aliases: dict[str, str] = Field(
        default={},  # not default_factory=dict: see stage.py
        description='names clients send mapped to the server\'s voices, e.g. alloy = "vivian"',
    )
    playground: bool = Field(
        default=True,
        description="serve the browser playground at /playground, linked from /; false: 404",
    )

    @field_validator("max_body_bytes", "remote_media_max_bytes", mode="before")
    @classmethod
    def _parse_body(cls, value: Any) -> Any:
        return parse_bytes(value)

    @model_validator(mode="after")
    def _check(self) -> ServerConfig:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0-65535, got {self.port}")
        for name in ("max_input_chars", "max_chat_text_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 character, got {getattr(self, name)}")
        for name in ("max_body_bytes", "remote_media_max_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 byte, got {getattr(self, name)}")
        for name in (
            "remote_media_timeout",
            "header_timeout",
            "body_timeout",
            "ws_send_timeout",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        if self.voices_dir is not None:
            unsafe = unsafe_voices_dir(str(Path(self.voices_dir).expanduser()))
            if unsafe is not None:
                raise ValueError(f"{unsafe[0]}; fix: {unsafe[1]}")
        names = self.served_model_names
        if self.served_model_name is not None and not names:
            raise ValueError(
                "served_model_name is empty; give a name, a list of names, or unset it"
            )
        for name in names:
            if not name.strip() or name != name.strip():
                raise ValueError(
                    f"served_model_name {name!r} must be a non-empty name "
                    "without surrounding spaces"
                )
        for alias, target in self.voice_aliases.items():
            if not alias or not target or alias == target:
                raise ValueError(
                    f"voice_aliases: {alias!r} -> {target!r} must map a name to another name"
                )
        return self

    @property
    def served_model_names(self) -> list[str]:
        """``served_model_name`` as a list (a single name is a list of one; unset: empty)."""
        name = self.served_model_name
        if name is None:
            return []
        return [name] if isinstance(name, str) else list(name)


def unsafe_voices_dir(path: str, info: os.stat_result | None = None) -> tuple[str, str] | None:
    """What makes ``path`` unfit to hold uploaded voices, and its fix; None if it is fit.

    Why: the server writes and later loads voices there. Whoever else can
    write to the directory (another user owning it, or a group/other write
    bit) could plant a link the server writes through, or a voice it loads;
    a link in place of the directory hands the whole store to the link's
    owner. ``info`` is the ``lstat`` (or an open descriptor's ``fstat``) to
    judge; without it the path is ``lstat``'ed, and a missing one is fit
    (the server creates it, mode 0700).
    """
    if info is None:
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return None
    other = "or point server.voices_dir at a directory of the server's user"
    if stat.S_ISLNK(info.st_mode):
        return (
            f"voices_dir {path} is a symbolic link (to {os.readlink(path)}); omni never "
            "follows links for stored voices",
            "point server.voices_dir at a real directory of the server's user, not a link",
        )
    if not stat.S_ISDIR(info.st_mode):
        return f"voices_dir {path} exists and is not a directory", f"remove it, {other}"
    uid = os.geteuid()
    if info.st_uid != uid:
        return (
            f"voices_dir {path} belongs to uid {info.st_uid}, not to the server's user "
            f"(uid {uid}); its owner could swap stored voices for links or planted files",
            f"chown {uid} {path} && chmod 700 {path}, {other}",
        )
    if info.st_mode & 0o022:
        return (
            f"voices_dir {path} has mode {stat.S_IMODE(info.st_mode):04o}; a group or other "
            "write bit lets other users swap stored voices for links or planted files",
            f"chmod 700 {path}, {other}",
        )
    return None
