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
    "served_model_name",
    "openai_compat",
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
        ("openai_compat", "maybe", "expected true or false, got 'maybe'"),
        ("served_model_name", '[" tts "]', "must be a non-empty name without surrounding"),
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


def test_served_model_name_is_one_name_or_a_list_of_aliases(deploy, resolve):
    assert resolve(None, pipeline="qwen3-tts").config.server.served_model_names == []
    one = resolve(None, "--server.served_model_name", "mine", pipeline="qwen3-tts")
    assert one.config.server.served_model_names == ["mine"]
    many = resolve(None, "--server.served_model_name", '["mine", "tts-1"]', pipeline="qwen3-tts")
    assert many.config.server.served_model_names == ["mine", "tts-1"]
    path = deploy(
        'pipeline = "qwen3-tts"\n[server]\nserved_model_name = ["a", "b"]\nopenai_compat = true\n'
    )
    server = resolve(path).config.server
    assert server.served_model_names == ["a", "b"] and server.openai_compat is True
    path = deploy('pipeline = "qwen3-tts"\n[server]\nserved_model_name = "solo"\n')
    assert resolve(path).config.server.served_model_names == ["solo"]
    assert resolve(None, pipeline="qwen3-tts").config.server.openai_compat is False


def test_an_empty_list_of_served_names_is_refused(resolve):
    with pytest.raises(ConfigError) as caught:
        resolve(None, "--server.served_model_name", "[]", pipeline="qwen3-tts")
    assert "served_model_name is empty" in str(caught.value)


def test_the_openai_voice_mapping_is_in_order_and_leaves_model_voices_alone():
    from omni_core.serve.common import openai_compat

    mapped = openai_compat.voice_aliases(["eric", "ryan", "serena"], None)
    assert list(mapped) == list(openai_compat.VOICES)
    assert [mapped[v] for v in ("alloy", "ash", "ballad", "coral")] == [
        "eric",
        "ryan",
        "serena",
        "eric",
    ]
    assert "echo" not in openai_compat.voice_aliases(["Echo", "vivian"], None)
    assert set(openai_compat.voice_aliases([], "default").values()) == {"default"}
    assert openai_compat.voice_aliases([], None) == {}
    assert openai_compat.voice_aliases(None, "default") == {}  # not known before a download
    assert openai_compat.model_names(("speech",)) == ["tts-1", "tts-1-hd", "gpt-4o-mini-tts"]
    assert "gpt-4o-audio-preview" in openai_compat.model_names(("chat",))
    assert "gpt-realtime" in openai_compat.model_names(("chat",))  # /v1/realtime: a chat api
    assert "tts-1" not in openai_compat.model_names(("chat",))
