"""Content parts and media references in chat messages, through the real server.

Every refusal must be a 400 in OpenAI's shape whose ``param`` names the exact
field. Remote URLs here are IP literals or ``localhost``: checking them needs
no DNS, and the test pipeline never fetches, so nothing leaves this machine.
"""

from __future__ import annotations

import base64

import pytest
from serve_helpers import raw

WAV = base64.b64encode(b"RIFF\x24\x00\x00\x00WAVEfmt ").decode()
PNG = f"data:image/png;base64,{WAV}"  # (the bytes do not matter: no stage decodes them)


def ask(server, part, *, system: bool = False):
    """One chat request whose last message holds a text part and ``part``."""
    messages = [{"role": "system", "content": "be brief"}] if system else []
    messages.append({"role": "user", "content": [{"type": "text", "text": "listen"}, part]})
    return raw(
        "POST",
        f"{server.url}/v1/chat/completions",
        json_body={
            "model": "t-speech",
            "modalities": ["text", "audio"],
            "audio": {"voice": "alice", "format": "pcm16"},
            "messages": messages,
        },
    )


def refused(reply, param: str, message: str) -> None:
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param, error
    assert message in error["message"], error["message"]


P = "messages.0.content.1"


@pytest.mark.parametrize(
    ("part", "param", "message"),
    [
        ("just a string", P, "a content part must be an object"),
        ({"type": 3}, f"{P}.type", "needs a string 'type'"),
        ({"type": "file", "file": {}}, f"{P}.type", "unsupported content part type 'file'"),
        ({"type": "audio", "path": "/etc/passwd"}, f"{P}.path", "unknown field 'path'"),
        ({"type": "text", "text": ["a"]}, f"{P}.text", "must be a string, got list"),
        ({"type": "audio", "audio": {"url": "x"}}, f"{P}.audio", "must be a string, got dict"),
        ({"type": "image_url", "image_url": "http://x/a.png"}, f"{P}.image_url", "an object"),
        ({"type": "image_url", "image_url": {"url": ["a"]}}, f"{P}.image_url.url", "got list"),
        (
            {"type": "image_url", "image_url": {"path": "/etc/passwd"}},
            f"{P}.image_url.path",
            "unknown field 'path'; accepted: url, detail",
        ),
        ({"type": "audio_url", "audio_url": {}}, f"{P}.audio_url.url", "needs a 'url'"),
        (
            {"type": "image_url", "image_url": {"url": PNG, "detail": 9}},
            f"{P}.image_url.detail",
            "must be one of auto, low, high",
        ),
        (
            {"type": "input_audio", "input_audio": {"data": "/etc/passwd", "format": "wav"}},
            f"{P}.input_audio.data",
            "is not base64",
        ),
        (
            {"type": "input_audio", "input_audio": {"data": WAV, "format": "exe"}},
            f"{P}.input_audio.format",
            "must be one of wav, mp3, flac, ogg",
        ),
        ({"type": "input_audio", "input_audio": {"format": "wav"}}, f"{P}.input_audio.data", ""),
        (
            {"type": "audio_url", "audio_url": {"url": "/tmp/a\x00b.wav"}},
            f"{P}.audio_url.url",
            "the path contains a NUL byte",
        ),
        ({"type": "audio", "audio": ""}, f"{P}.audio", "the path is empty"),
        (
            {"type": "audio_url", "audio_url": {"url": "file://etc/passwd"}},
            f"{P}.audio_url.url",
            "file: URLs name no host",
        ),
        (
            {"type": "audio_url", "audio_url": {"url": "data:audio/wav,RIFF"}},
            f"{P}.audio_url.url",
            "data: URLs must be base64",
        ),
        (
            {"type": "audio_url", "audio_url": {"url": "data:audio/wav;base64,/etc/passwd"}},
            f"{P}.audio_url.url",
            "is not base64",
        ),
        (
            {"type": "image_url", "image_url": {"url": f"data:text/html;base64,{WAV}"}},
            f"{P}.image_url.url",
            "this image part holds 'text/html' data",
        ),
        (
            {"type": "audio_url", "audio_url": {"url": "data:audio/wav;base64"}},
            f"{P}.audio_url.url",
            "needs a ',' before its data",
        ),
        (
            {"type": "image_url", "image_url": {"url": "http://8.8.8.8/a.png"}},
            f"{P}.image_url.url",
            "this server does not fetch remote media; send the image inline",
        ),
        (
            {"type": "video_url", "video_url": {"url": "https://8.8.8.8/a.mp4"}},
            f"{P}.video_url.url",
            "ask the operator to set server.allow_remote_media",
        ),
    ],
)
def test_every_malformed_part_is_a_400_naming_its_field(speech_server, part, param, message):
    refused(ask(speech_server, part), param, message)


def test_the_param_counts_messages_and_parts(speech_server):
    part = {"type": "image_url", "image_url": {"url": {"nested": True}}}
    refused(
        ask(speech_server, part, system=True),
        "messages.1.content.1.image_url.url",
        "must be a string, got dict",
    )


@pytest.mark.parametrize(
    "part",
    [
        {"type": "input_audio", "input_audio": {"data": WAV, "format": "wav"}},
        {"type": "audio_url", "audio_url": {"url": f"data:audio/wav;base64,{WAV}"}},
        {"type": "audio_url", "audio_url": {"url": f"data:;base64,{WAV}"}},
        {"type": "image_url", "image_url": {"url": PNG, "detail": "low"}},
    ],
)
def test_well_formed_inline_media_is_accepted(speech_server, part):
    reply = ask(speech_server, part)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["audio"]["data"]


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://[::ffff:169.254.169.254]/latest/meta-data/",
        "http://127.0.0.1:8000/v1/models",
        "http://localhost/a.wav",
        "http://2130706433/a.wav",
        "http://10.0.0.7/a.wav",
        "http://[fe80::1]/a.wav",
        "http://0.0.0.0/a.wav",
    ],
)
def test_allowed_remote_media_is_still_refused_for_non_public_hosts(remote_media_server, url):
    reply = ask(remote_media_server, {"type": "audio_url", "audio_url": {"url": url}})
    refused(reply, f"{P}.audio_url.url", "remote media is fetched only from public addresses")


def test_allowed_remote_media_passes_for_a_public_address(remote_media_server):
    part = {"type": "audio_url", "audio_url": {"url": "https://8.8.8.8/a.wav"}}
    reply = ask(remote_media_server, part)
    assert reply.status_code == 200, reply.text
    refused(
        ask(remote_media_server, {"type": "audio_url", "audio_url": {"url": "gopher://8.8.8.8/"}}),
        f"{P}.audio_url.url",
        "unsupported URL scheme 'gopher'",
    )
