"""GPU detection through a fake NVML module, and the [cluster] overrides."""

from __future__ import annotations

from types import SimpleNamespace

from omni_core.plan import apply_cluster, detect_inventory, resolve_inventory
from omni_core.plan.model import GpuInventory
from omni_core.schema import ClusterConfig

GiB = 1024**3


class FakeNvml:
    """The part of pynvml that detection calls, over a list of (name, uuid, total, free)."""

    def __init__(self, gpus, *, fail_init=None, fail_at=None):
        self.gpus = gpus
        self.fail_init = fail_init
        self.fail_at = fail_at
        self.shutdown = False

    def nvmlInit(self):
        if self.fail_init:
            raise self.fail_init

    def nvmlShutdown(self):
        self.shutdown = True

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        if index == self.fail_at:
            raise RuntimeError("GPU is lost")
        return index

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(total=self.gpus[handle][2], free=self.gpus[handle][3])

    def nvmlDeviceGetUUID(self, handle):
        return self.gpus[handle][1].encode()  # old bindings return bytes

    def nvmlDeviceGetName(self, handle):
        return self.gpus[handle][0]


TWO = [
    ("NVIDIA H100", "GPU-aaaa", 80 * GiB, 79 * GiB),
    ("NVIDIA H100", "GPU-bbbb", 80 * GiB, 10 * GiB),
]


def test_detects_gpus_and_mps_binary():
    nvml = FakeNvml(TWO)
    inventory = detect_inventory(nvml, which=lambda name: f"/usr/bin/{name}", env={})
    assert inventory.source == "nvml"
    assert inventory.count == 2
    assert inventory.devices[1].uuid == "GPU-bbbb"
    assert inventory.devices[1].free_bytes == 10 * GiB
    assert inventory.mps_available is True
    assert nvml.shutdown
    assert inventory.describe() == "2 GPUs (ids 0-1, 80GiB each; from nvml)"


def test_mps_binary_absent():
    inventory = detect_inventory(FakeNvml(TWO), which=lambda name: None, env={})
    assert inventory.mps_available is False


def test_no_driver_is_unknown():
    nvml = FakeNvml(TWO, fail_init=RuntimeError("NVML Shared Library Not Found"))
    inventory = detect_inventory(nvml, which=lambda name: "/x", env={})
    assert inventory.count is None
    assert inventory.source == "unknown"
    assert inventory.mps_available is None
    assert "NVML did not answer: NVML Shared Library Not Found" in inventory.notes[0]


def test_failure_while_listing_is_unknown_and_shuts_down():
    nvml = FakeNvml(TWO, fail_at=1)
    inventory = detect_inventory(nvml, which=lambda name: None, env={})
    assert inventory.count is None
    assert "GPU is lost" in inventory.notes[0]
    assert nvml.shutdown


def test_cuda_visible_devices_by_index_and_uuid():
    by_index = detect_inventory(
        FakeNvml(TWO), which=lambda n: None, env={"CUDA_VISIBLE_DEVICES": "1"}
    )
    assert [(d.index, d.uuid) for d in by_index.devices] == [(0, "GPU-bbbb")]
    assert "shows 1 of 2 GPUs" in by_index.notes[0]
    by_uuid = detect_inventory(
        FakeNvml(TWO), which=lambda n: None, env={"CUDA_VISIBLE_DEVICES": "GPU-bb,GPU-aa"}
    )
    assert [d.uuid for d in by_uuid.devices] == ["GPU-bbbb", "GPU-aaaa"]
    stops = detect_inventory(
        FakeNvml(TWO), which=lambda n: None, env={"CUDA_VISIBLE_DEVICES": "0,7,1"}
    )
    assert stops.count == 1


def test_this_machine_answers_cleanly():
    """nvidia-ml-py is installed here but no driver answers: unknown, no exception."""
    inventory = detect_inventory()
    assert inventory.count is None or inventory.count >= 0


def test_cluster_overrides_detection():
    detected = detect_inventory(FakeNvml(TWO), which=lambda n: None, env={})
    planned = apply_cluster(
        detected, ClusterConfig(gpus=4, gpu_memory="141GiB", mps_available=True)
    )
    assert planned.count == 4
    assert planned.source == "nvml+config"
    assert planned.devices[0].uuid == "GPU-aaaa"
    assert {d.memory_bytes for d in planned.devices} == {141 * GiB}
    assert planned.mps_available is True


def test_cluster_alone_and_unchanged():
    unknown = GpuInventory.unknown()
    assert apply_cluster(unknown, ClusterConfig()) is unknown
    declared = resolve_inventory(ClusterConfig(gpus=2, gpu_memory="80GB"), nvml=FakeNvml([]))
    assert declared.count == 2 and declared.devices[1].memory_bytes == 80 * 1000**3
