"""AllocationPeak counts what operators allocate, from creation to release."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from omni_core.kit.allocation_peak import AllocationPeak  # noqa: E402


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_new_storages_count_views_and_existing_ones_do_not(device):
    weight = torch.ones(1000, device=device)  # before the block: not counted
    with AllocationPeak() as peak:
        view = weight.view(10, 100).t()  # a view: no storage of its own
        scaled = weight * 2  # 4000 bytes
        weight.mul_(1)  # in place: nothing new
        assert peak.live == 4000
        twice = torch.cat((scaled, scaled))  # 8000 more: 12000 at once
        del scaled, twice
        assert peak.live == 0
        small = torch.zeros(10, device=device)  # 40 bytes, below the peak
    assert peak.bytes == 12000
    assert view.shape == (100, 10) and small.numel() == 10


def test_a_storage_lives_as_long_as_its_views():
    with AllocationPeak() as peak:
        made = torch.arange(100.0)  # 400 bytes
        kept = made.view(10, 10)[1:]
        del made
        assert peak.live == 400  # the view keeps the storage
        del kept
        assert peak.live == 0
