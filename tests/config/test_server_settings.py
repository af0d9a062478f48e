"""The server's security settings: defaults, how they are written, and what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from omni_core.errors import ConfigError
from omni_core.schema.deployment import ServerConfig

NEW_FIELDS = (
    "allow_remote_media",
    "remote_media_max_bytes",
    "remote_media_timeout",
    "header_timeout",
    "body_timeout",
    "ws_send_timeout",
    "max_input_chars",
    "max_chat_text_chars",
)


def test_the_defaults_keep_remote_media_off_and_every_client_on_a_clock(resolve):
    server = resolve(None, pipeline="qwen3-tts").config.server
    assert server.allow_remote_media is False
    assert server.remote_media_max_bytes == 32 * 1024 * 1024
    assert server.remote_media_timeout == 30.0
    assert (server.header_timeout, server.body_timeout) == (10.0, 60.0)
    assert (server.max_input_chars, server.max_chat_text_chars) == (4096, 131072)


def test_every_new_setting_is_documented_in_the_schema_and_the_readme():
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    for name in NEW_FIELDS:
        assert ServerConfig.model_fields[name].description, name
        assert f"server.{name}" in readme, name


def test_the_settings_are_written_in_the_file_and_on_the_command_line(deploy, resolve):
    path = deploy(
        'pipeline = "qwen3-tts"\n'
        "[server]\n"
        "allow_remote_media = true\n"
        'remote_media_max_bytes = "4MiB"\n'
        "header_timeout = 3\n"
    )
    server = resolve(
        path, "--server.body_timeout", "7.5", "--server.remote_media_timeout", "2"
    ).config.server
    assert server.allow_remote_media is True
    assert server.remote_media_max_bytes == 4 * 1024 * 1024
    assert (server.header_timeout, server.body_timeout, server.remote_media_timeout) == (3, 7.5, 2)


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("header_timeout", "0", "header_timeout must be > 0 seconds, got 0.0"),
        ("body_timeout", "-1", "body_timeout must be > 0 seconds, got -1.0"),
        ("remote_media_timeout", "0", "remote_media_timeout must be > 0 seconds"),
        ("remote_media_max_bytes", "0", "remote_media_max_bytes must be >= 1 byte"),
        ("allow_remote_media", "maybe", "expected true or false, got 'maybe'"),
        ("header_timeout", "soon", "expected a number, got 'soon'"),
        ("max_input_chars", "0", "max_input_chars must be >= 1 character, got 0"),
        ("max_chat_text_chars", "1.5", "expected an integer"),
    ],
)
def test_bad_values_are_refused_naming_the_flag(resolve, flag, value, message):
    with pytest.raises(ConfigError) as caught:
        resolve(None, f"--server.{flag}", value, pipeline="qwen3-tts")
    assert message in str(caught.value)
    assert f"--server.{flag}" in str(caught.value)


def test_a_bad_value_in_the_file_exits_2_naming_its_line(deploy, cli):
    path = deploy('pipeline = "qwen3-tts"\n[server]\nbody_timeout = 0\n')
    code, _out, err = cli("config", "resolve", path)
    assert code == 2
    assert "body_timeout must be > 0 seconds" in err and f"{path}:3" in err
