"""The parts of weight sharing, in one process: the sealed memfd, the authenticated
socket that hands it over, repacking a shared weight, and the parent's sweep."""

from __future__ import annotations

import fcntl
import os

import pytest
import torch
from torch import nn

from omni_core.engine import mapped
from omni_core.engine.cpu_linear import PackedLinear, packing_available
from omni_core.runtime.transports._auth import new_secret
from omni_core.runtime.weight_share import ShareError, host
from omni_core.runtime.weight_share.channel import WeightServer, fetch
from omni_core.runtime.weight_share.leftovers import leftovers, remove_leftovers


def tied_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(48, 48), nn.Tanh(), nn.Linear(48, 48))
    net[2].weight = net[0].weight  # tied: one tensor under two names
    net.register_buffer("rows", net[0].bias[:8])  # a view into another tensor's storage
    return net


def test_publish_moves_every_tensor_into_one_sealed_memfd():
    net = tied_model()
    x = torch.randn(3, 48)
    expected = net(x)
    manifest, fd, _ = host.publish(net)
    try:
        assert torch.equal(net(x), expected)
        assert net[0].weight is net[2].weight  # identity kept: ties stay tied
        assert net.rows.data_ptr() == net[0].bias.data_ptr()  # views stay views
        assert all(mapped.is_mapped(t) for _, t in host.named_tensors(net))
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        assert seals & fcntl.F_SEAL_GROW and seals & fcntl.F_SEAL_SHRINK
        with pytest.raises(PermissionError):
            os.write(fd, b"x")  # sealed: nobody writes the weights again
        assert os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:omni-weights")
        names = {e["name"] for e in manifest["tensors"]}
        assert {"0.weight", "2.weight", "rows"} <= names
        # One copy per storage: the tied weight and the view add no bytes.
        assert manifest["size"] < 2 * 48 * 48 * 4 + 4096
    finally:
        os.close(fd)


def test_attach_maps_the_same_values_read_only_without_a_copy():
    leader = tied_model()
    manifest, fd, _ = host.publish(leader)
    follower = tied_model(seed=1)  # other values: they must be replaced, not kept
    x = torch.randn(2, 48)
    host.attach(follower, manifest, os.dup(fd), "test")
    os.close(fd)
    assert torch.equal(follower(x), leader(x))
    assert follower[0].weight is follower[2].weight
    assert follower[0].weight.data_ptr() != leader[0].weight.data_ptr()  # its own mapping
    assert mapped.is_mapped(follower[0].weight)


def test_attach_refuses_another_architecture_and_names_the_tensor():
    manifest, fd, _ = host.publish(tied_model())
    other = nn.Sequential(nn.Linear(48, 40), nn.Tanh(), nn.Linear(40, 48))
    other.register_buffer("rows", torch.zeros(8))
    descriptor = os.dup(fd)
    os.close(fd)
    with pytest.raises(ValueError, match=r"0\.weight: leader float32\[48, 48\], here"):
        host.attach(other, manifest, descriptor, "test")
    with pytest.raises(OSError):
        os.fstat(descriptor)  # closed on failure too


@pytest.mark.skipif(not packing_available(), reason="this torch build cannot pack")
def test_repacking_a_shared_weight_keeps_it_shared():
    net = nn.Sequential(nn.Linear(64, 64))
    x = torch.randn(4, 64)
    private = PackedLinear(net[0])
    assert private.packed.data_ptr() == net[0].weight.data_ptr()  # its own tensor, no copy
    _, fd, _ = host.publish(net)
    os.close(fd)  # the mapping keeps the memory
    shared = PackedLinear(net[0])
    assert shared.packed.layout == torch.strided and mapped.is_mapped(shared.packed)
    assert torch.equal(shared(x), private(x))  # the same kernel reads the same bytes


@pytest.fixture
def served(short_tmp):
    secret = new_secret()
    manifest, fd, _ = host.publish(tied_model())
    address = str(short_tmp / "w.sock")

    def lookup(key: str):
        if key != "k":
            raise KeyError("published: k")
        return manifest, fd

    server = WeightServer(address, secret, lookup)
    yield address, secret, manifest
    server.close()
    os.close(fd)
    assert not os.path.exists(address)


def test_the_socket_hands_the_memfd_to_a_peer_that_knows_the_secret(served):
    address, secret, manifest = served
    answer, fd = fetch(address, secret, "k", "leader")
    try:
        assert answer == manifest
        assert os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:omni-weights")
    finally:
        os.close(fd)
    assert oct(os.stat(address).st_mode & 0o777) == "0o600"


def test_the_socket_refuses_a_wrong_secret_and_an_unknown_key(served):
    address, secret, _ = served
    with pytest.raises(ShareError, match="did not hand over 'k'"):
        fetch(address, new_secret(), "k", "leader")
    with pytest.raises(ShareError, match=r"no weights under 'nope' \(published: k\)"):
        fetch(address, secret, "nope", "leader")


def test_an_absent_leader_is_named(short_tmp):
    with pytest.raises(ShareError, match="cannot reach weight-sharing leader p@r0"):
        fetch(str(short_tmp / "none.sock"), new_secret(), "k", "p@r0")


def test_the_sweep_removes_only_that_process_files(tmp_path):
    (tmp_path / "torch_123_0").write_bytes(b"")
    (tmp_path / "torch_123_7").write_bytes(b"")
    (tmp_path / "torch_1234_0").write_bytes(b"")
    (tmp_path / "torch_123_link").symlink_to(tmp_path / "torch_1234_0")
    assert sorted(os.path.basename(p) for p in leftovers(123, str(tmp_path))) == [
        "torch_123_0",
        "torch_123_7",
    ]
    assert remove_leftovers(123, str(tmp_path)) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["torch_1234_0", "torch_123_link"]


def test_a_leader_loading_one_key_twice_maps_its_first_copy(short_tmp):
    from omni_core.runtime.weight_share import Role, activate, share_weights

    fills: list[int] = []

    def fill(module: nn.Module) -> None:
        fills.append(1)
        with torch.no_grad():
            module.weight.fill_(0.25)
            module.bias.fill_(1.0)

    activate(Role(kind="leader", process="p@r0", address=str(short_tmp / "w.sock")))
    try:
        first = share_weights("k", nn.Linear(8, 8), fill)
        second = share_weights("k", nn.Linear(8, 8), fill)
        assert fills == [1]  # filled once; the second load maps the published copy
        assert torch.equal(first.weight, second.weight) and mapped.is_mapped(second.weight)
        assert first.weight.data_ptr() != second.weight.data_ptr()  # its own mapping
        assert (second.weight == 0.25).all()
    finally:
        from omni_core.runtime.weight_share import current

        os.close(current().published["k"][1])
        activate(Role())


def test_outside_a_group_the_seam_only_fills():
    from omni_core.runtime.weight_share import share_weights

    module = share_weights("k", nn.Linear(4, 4), lambda m: m.weight.data.fill_(2.0))
    assert (module.weight == 2.0).all() and not mapped.is_mapped(module.weight)
