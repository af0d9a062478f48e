"""The voices directory is as safe as the runtime directory, and voice races are never 500s.

What these guard against: another local user who can write to
``server.voices_dir`` (or owns it) planting links the server writes through
or files it reads at start (a FIFO that would block it); simultaneous
uploads and deletes of one name; a full or read-only disk; host paths in
responses. The refusals at start go through the real ``omni serve`` (the
test pipeline, no model); planted entries and races through a real MOSS-TTS
demo server; the full disk through the store itself, as a disk cannot be
filled safely here.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import OmniServe

from omni_core.errors import ConfigError
from omni_core.serve.voices import store as voice_store
from omni_core.serve.voices.routes import store_error
from omni_core.serve.voices.store import VoiceExists, VoiceStorageError, VoiceStore

ROOT = os.geteuid() == 0
HERE = Path(__file__).parent
LAUNCH = [sys.executable, str(HERE / "omni_launch.py")]
MOSS = HERE.parents[1] / "examples" / "moss_tts_demo.toml"
NOBODY = 65534


def refused_start(voices_dir: Path, base: Path) -> subprocess.CompletedProcess[str]:
    """``omni serve`` of the test pipeline with ``voices_dir``: it must stop at the check."""
    return subprocess.run(
        [
            *LAUNCH,
            *("serve", "--pipeline", "t-speech", "--port", "0"),
            *("--endpoints.base_path", str(base / "run")),
            *("--server.voices_dir", str(voices_dir)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _link(tmp: Path) -> tuple[Path, str]:
    target = tmp / "target"
    target.mkdir(mode=0o700)
    (tmp / "voices").symlink_to(target)
    return target, "is a symbolic link"


def _open_to_all(tmp: Path) -> tuple[Path, str]:
    path = tmp / "voices"
    path.mkdir(mode=0o700)
    path.chmod(0o777)
    return path, f"chmod 700 {path}"


def _another_users(tmp: Path) -> tuple[Path, str]:
    if not ROOT:
        pytest.skip("needs root to give a directory to another user")
    path = tmp / "voices"
    path.mkdir(mode=0o700)
    path.chmod(0o777)
    os.chown(path, NOBODY, NOBODY)
    return path, f"belongs to uid {NOBODY}"


def _a_file(tmp: Path) -> tuple[Path, str]:
    (tmp / "voices").write_text("")
    return tmp / "voices", "is not a directory"


@pytest.mark.parametrize("plant", [_link, _open_to_all, _another_users, _a_file])
def test_omni_serve_refuses_an_unsafe_voices_dir_with_exit_2(short_tmp, plant) -> None:
    target, says = plant(short_tmp)
    done = refused_start(short_tmp / "voices", short_tmp)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and str(short_tmp / "voices") in done.stderr
    assert "(set by --server.voices_dir)" in done.stderr and "fix:" in done.stderr
    assert "Traceback" not in done.stderr and "starting" not in done.stderr
    if target.is_dir():
        assert os.listdir(target) == []  # nothing written through the link or into it


@pytest.mark.skipif(not ROOT, reason="needs root to give a directory to another user")
def test_the_store_itself_refuses_a_directory_of_another_user(short_tmp) -> None:
    path = short_tmp / "voices"
    path.mkdir(mode=0o700)
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(ConfigError, match=f"belongs to uid {NOBODY}") as refused:
        VoiceStore.open(path, "p", "m")
    assert f"chown {os.geteuid()} {path}" in refused.value.hint
    assert os.listdir(path) == []


def test_a_missing_directory_is_created_private(short_tmp) -> None:
    store = VoiceStore.open(short_tmp / "new" / "voices", "p", "m")
    assert stat.S_IMODE(os.stat(store.root).st_mode) == 0o700
    assert store.voices == {} and store.problems == []


def test_leftovers_are_removed_without_following_links(short_tmp) -> None:
    outside = short_tmp / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    root = short_tmp / "voices"
    root.mkdir(mode=0o700)
    (root / ".tmp-link").symlink_to(outside)
    (root / ".trash-old").mkdir()
    (root / ".trash-old" / "inner").symlink_to(outside / "precious")
    (root / ".trash-old" / "deep").mkdir()
    (root / ".trash-old" / "deep" / "dir-link").symlink_to(outside)
    VoiceStore.open(root, "p", "m")
    assert os.listdir(root) == []
    assert (outside / "precious").read_text() == "keep me"


def add(store: VoiceStore, name: str) -> None:
    store.add(
        name,
        {"codes": np.arange(6).reshape(2, 3)},
        transcript=None,
        duration=1.5,
        reference=b"RIFF....",
        reference_format="wav",
    )


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS])
def test_a_full_or_read_only_disk_is_a_507_and_leaves_nothing_half_written(
    short_tmp, monkeypatch, code
) -> None:
    store = VoiceStore.open(short_tmp, "p", "m")
    write = voice_store._write_file
    written: list[str] = []

    def fills_up(dir_fd: int, name: str, data: bytes) -> None:  # the disk, not our code
        if written:
            write(dir_fd, name, data[: len(data) // 2])
            raise OSError(code, os.strerror(code))
        written.append(name)
        write(dir_fd, name, data)

    monkeypatch.setattr(voice_store, "_write_file", fills_up)
    with pytest.raises(VoiceStorageError) as refused:
        add(store, "ann")
    assert os.listdir(short_tmp) == [] and store.voices == {}
    answer = store_error(refused.value)
    assert answer.status == 507 and answer.body()["error"]["code"] == "insufficient_storage"
    assert os.strerror(code) in answer.message and str(short_tmp) not in answer.message
    monkeypatch.setattr(voice_store, "_write_file", write)
    add(store, "ann")  # room again: the same name is free
    assert sorted(os.listdir(short_tmp / "ann")) == ["prompt.npz", "reference.wav", "voice.json"]


def test_the_store_never_renames_over_an_entry_that_appeared_meanwhile(short_tmp) -> None:
    store = VoiceStore.open(short_tmp, "p", "m")
    # Another server on this directory, say. Empty: a plain rename would replace it.
    (short_tmp / "bob").mkdir()
    with pytest.raises(VoiceExists, match="voice 'bob' already exists"):
        add(store, "bob")
    assert os.listdir(short_tmp) == ["bob"] and os.listdir(short_tmp / "bob") == []
    assert store_error(VoiceExists("x")).status == 409


# -- a real server (MOSS-TTS's tiny demo) ---------------------------------------------


def clip(seconds: float = 1.5, freq: float = 200.0) -> bytes:
    soundfile = pytest.importorskip("soundfile")
    import io

    t = np.arange(int(24000 * seconds)) / 24000
    out = io.BytesIO()
    wave = 0.3 * np.sin(2 * np.pi * freq * t)
    soundfile.write(out, wave.astype(np.float32), 24000, format="WAV", subtype="PCM_16")
    return out.getvalue()


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    """A voices directory with links, a FIFO and (as root) a device where voice files go."""
    top = tmp_path_factory.mktemp("planted")
    root, outside = top / "voices", top / "outside"
    root.mkdir(mode=0o700)
    outside.mkdir()
    (outside / "voice.json").write_text(json.dumps({"format": 1, "name": "json-link"}))
    (outside / "precious").write_text("keep me")
    expected = {"fifo": "voice.json is a FIFO", "dir-link": "a symbolic link, not a voice"}
    (root / "fifo").mkdir()
    os.mkfifo(root / "fifo" / "voice.json")
    (root / "dir-link").symlink_to(outside)
    (root / "json-link").mkdir()
    (root / "json-link" / "voice.json").symlink_to(outside / "voice.json")
    expected["json-link"] = "voice.json is a symbolic link"
    (root / "prompt-fifo").mkdir()
    (root / "prompt-fifo" / "voice.json").write_text(
        json.dumps({"format": 1, "name": "prompt-fifo"})
    )
    os.mkfifo(root / "prompt-fifo" / "prompt.npz")
    expected["prompt-fifo"] = "prompt.npz is a FIFO"
    (root / "device").mkdir()
    try:  # /dev/zero: reading it would never end
        os.mknod(root / "device" / "voice.json", stat.S_IFCHR | 0o600, os.makedev(1, 5))
        expected["device"] = "voice.json is a character device"
    except OSError:  # not root, or a container that forbids it
        (root / "device").rmdir()
    (root / ".tmp-link").symlink_to(outside)
    (root / ".trash-old").mkdir()
    (root / ".trash-old" / "inner").symlink_to(outside / "precious")
    return root, outside, expected


@pytest.fixture(scope="module")
def moss(planted, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OmniServe]:
    pytest.importorskip("torch")
    pytest.importorskip("omni_moss_tts")
    root = planted[0]
    flags = ("--server.voices_dir", str(root), "--preprocessing.factory.max_frames", "20")
    server = OmniServe(tmp_path_factory.mktemp("moss"), MOSS, flags, timeout=120)
    try:
        yield server
    finally:
        server.stop()


def request(method: str, url: str, **kwargs) -> tuple[int, str]:
    httpx = pytest.importorskip("httpx2")
    reply = httpx.request(method, url, timeout=120, **kwargs)
    return reply.status_code, reply.text


def upload(server: OmniServe, name: str, audio: bytes) -> tuple[int, str]:
    files = {"file": ("voice.wav", audio, "audio/wav")}
    data = {"name": name, "consent": "true"}
    return request("POST", f"{server.url}/v1/audio/voices", data=data, files=files)


def delete(server: OmniServe, name: str) -> tuple[int, str]:
    return request("DELETE", f"{server.url}/v1/audio/voices/{name}")


def test_planted_links_fifos_and_devices_are_skipped_by_name_never_by_path(moss, planted) -> None:
    root, outside, expected = planted
    status, body = request("GET", f"{moss.url}/v1/audio/voices")
    assert status == 200 and str(root) not in body and str(outside) not in body
    skipped = {s["name"]: s["reason"] for s in json.loads(body)["skipped"]}
    assert set(skipped) == set(expected)
    for name, says in expected.items():
        assert says in skipped[name], skipped[name]
    assert f"voices: skipped {root}/fifo" in moss.stderr()  # the operator's log has the path
    assert not (root / ".tmp-link").exists() and not (root / ".trash-old").exists()
    assert sorted(os.listdir(outside)) == ["precious", "voice.json"]
    assert (outside / "precious").read_text() == "keep me"


def test_simultaneous_uploads_of_one_name_give_one_201_and_seven_409s(moss, planted) -> None:
    audio, start = clip(), threading.Barrier(8)

    def one(_: int) -> tuple[int, str]:
        start.wait()
        return upload(moss, "twin", audio)

    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(one, range(8)))
    statuses = sorted(status for status, _ in replies)
    assert statuses == [201] + [409] * 7, replies
    for status, body in replies:
        if status == 409:
            message = json.loads(body)["error"]["message"]
            assert "already exists" in message or "is being changed by another request" in message
        assert str(planted[0]) not in body
    assert sorted(os.listdir(planted[0] / "twin")) == ["prompt.npz", "reference.wav", "voice.json"]


def test_an_upload_and_delete_storm_on_one_name_gives_no_5xx(moss, planted) -> None:
    audio, stop_at = clip(), time.monotonic() + 4
    seen: list[tuple[str, int, str]] = []

    def uploader() -> None:
        while time.monotonic() < stop_at:
            seen.append(("upload", *upload(moss, "storm", audio)))

    def deleter() -> None:
        while time.monotonic() < stop_at:
            seen.append(("delete", *delete(moss, "storm")))

    workers = [threading.Thread(target=t) for t in [uploader] * 3 + [deleter] * 3]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert [s for s in seen if s[1] >= 500] == []
    assert {(kind, status) for kind, status, _ in seen} <= {
        ("upload", 201),
        ("upload", 409),
        ("delete", 200),
        ("delete", 404),
        ("delete", 409),
    }
    assert ("upload", 201) in {(kind, status) for kind, status, _ in seen}
    assert all(str(planted[0]) not in body for _, _, body in seen)
    assert [n for n in os.listdir(planted[0]) if n.startswith(".")] == []
    listing = request("GET", f"{moss.url}/v1/audio/voices")[1]
    on_disk = (planted[0] / "storm").is_dir()
    assert ("storm" in {v["name"] for v in json.loads(listing)["data"]}) == on_disk


def test_no_answer_of_the_voices_api_shows_a_host_path(moss, planted) -> None:
    root = str(planted[0])
    answers = [
        request("GET", f"{moss.url}/v1/audio/voices"),
        upload(moss, "bad name!", clip()),
        upload(moss, "twin", clip()),
        delete(moss, "nobody"),
        delete(moss, "fifo"),  # skipped at start: not a voice of this server
    ]
    assert [status for status, _ in answers] == [200, 400, 409, 404, 404]
    assert all(root not in body for _, body in answers)


def test_the_server_stops_on_sigterm_within_seconds(moss) -> None:
    began = time.monotonic()
    assert moss.stop() == 0
    assert time.monotonic() - began < 10, moss.stderr()
