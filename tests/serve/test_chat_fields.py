"""Chat request fields: what is refused (400 naming ``param``), the ``sampling`` dict the
entry stage receives, stop strings, and ``usage`` (plain and streamed), via openai."""

from __future__ import annotations

import json

import openai
import pytest
from serve_helpers import raw

PROMPT = "hello there"  # two prompt "tokens" (words) for t-chat
REPLY = "You said: hello there"  # four completion "tokens"
USAGE = {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}
DEFAULTS = {
    "max_tokens": None,
    "temperature": None,
    "top_p": None,
    "top_k": None,
    "seed": None,
    "stop": [],
    "repetition_penalty": None,
}


def user(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


def echo(server, extra: dict | None = None, **fields) -> dict:
    """The ``sampling`` dict t-chat's entry stage received for a request with ``fields``
    (OpenAI's, as keywords) and ``extra`` (fields the openai client sends in extra_body)."""
    completion = server.client().chat.completions.create(
        model="t-chat",
        messages=user(PROMPT),
        extra_body={"test_echo": True, **(extra or {})},
        **fields,
    )
    return json.loads(completion.choices[0].message.content)


REFUSED = [
    ({"max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
    ({"max_tokens": 1.5}, "max_tokens", "valid integer"),
    ({"max_tokens": True}, "max_tokens", "valid integer"),
    ({"max_completion_tokens": 0}, "max_completion_tokens", "greater than or equal to 1"),
    (
        {"max_tokens": 5, "max_completion_tokens": 6},
        "max_completion_tokens",
        "max_completion_tokens (6) and max_tokens (5) differ",
    ),
    ({"temperature": 2.5}, "temperature", "less than or equal to 2"),
    ({"temperature": -0.1}, "temperature", "greater than or equal to 0"),
    ({"temperature": "0.5"}, "temperature", "valid number"),
    ({"top_p": 0}, "top_p", "greater than 0"),
    ({"top_p": 1.5}, "top_p", "less than or equal to 1"),
    ({"top_k": -2}, "top_k", "-1 or 0 for no top-k limit"),
    ({"top_k": 2.5}, "top_k", "valid integer"),
    ({"seed": 2**63}, "seed", "less than or equal to"),
    ({"seed": -(2**63) - 1}, "seed", "greater than or equal to"),
    ({"seed": 1.0}, "seed", "valid integer"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4 stop strings, got 5"),
    ({"stop": ""}, "stop", "must not be empty"),
    ({"stop": ["x", ""]}, "stop", "must not be empty"),
    ({"stop": 5}, "stop", "a string or a list of strings"),
    ({"stop": ["x", 1]}, "stop", "a string or a list of strings"),
    ({"n": 2}, "n", "n must be 1: this server returns one choice per request"),
    ({"n": 0}, "n", "n must be 1"),
    ({"presence_penalty": 0.5}, "presence_penalty", "presence_penalty other than 0 is not"),
    ({"frequency_penalty": -1}, "frequency_penalty", "frequency_penalty other than 0 is not"),
    ({"repetition_penalty": 0}, "repetition_penalty", "greater than 0"),
    ({"logprobs": True}, "logprobs", "logprobs is not supported"),
    ({"top_logprobs": 2}, "top_logprobs", "top_logprobs is not supported"),
    ({"logit_bias": {"50256": -100}}, "logit_bias", "logit_bias is not supported"),
    (
        {"response_format": {"type": "json_object"}},
        "response_format",
        "response_format 'json_object' is not supported",
    ),
    ({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format", ""),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", "not supported"),
    ({"tool_choice": "auto"}, "tool_choice", "tool_choice (function calling) is not"),
    ({"functions": [{"name": "f"}]}, "functions", "not supported"),
    ({"function_call": "auto"}, "function_call", "not supported"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "only allowed with stream"),
    (
        {"stream": True, "stream_options": {"include_usage": "yes"}},
        "stream_options.include_usage",
        "valid boolean",
    ),
    ({"stream": True, "stream_options": {"bogus": 1}}, "stream_options.bogus", "not permitted"),
    ({"sampling": {"temperature": 0}}, "sampling", "sampling is written by the server"),
]


@pytest.mark.parametrize(
    ("fields", "param", "message"), REFUSED, ids=[param for _, param, _ in REFUSED]
)
def test_refused_fields_get_400_naming_the_field(chat_server, fields, param, message):
    with pytest.raises(openai.BadRequestError) as caught:
        chat_server.client().post(
            "/chat/completions",
            body={"model": "t-chat", "messages": user(PROMPT), **fields},
            cast_to=object,
        )
    assert caught.value.status_code == 400
    assert caught.value.param == param
    assert message in caught.value.message


def test_json_s_nan_and_infinity_are_not_numbers(chat_server):
    """json.loads reads NaN and Infinity; the openai client cannot send them, curl can."""
    for field in ("temperature", "repetition_penalty"):
        for value in (float("nan"), float("inf")):
            reply = raw(
                "POST",
                f"{chat_server.url}/v1/chat/completions",
                json_body={"messages": user(PROMPT), field: value},
            )
            assert reply.status_code == 400
            assert reply.json()["error"]["param"] == field
            assert "finite number" in reply.json()["error"]["message"]


def test_unsupported_fields_at_their_neutral_values_are_accepted(chat_server):
    completion = chat_server.client().chat.completions.create(
        model="t-chat",
        messages=user(PROMPT),
        n=1,
        presence_penalty=0,
        frequency_penalty=0.0,
        logprobs=False,
        response_format={"type": "text"},
        tools=[],
        tool_choice="none",
    )
    assert completion.choices[0].message.content == REPLY


def test_the_entry_stage_gets_the_normalised_sampling_dict(chat_server):
    assert echo(chat_server) == DEFAULTS
    assert echo(
        chat_server,
        max_completion_tokens=64,
        temperature=0,
        top_p=1,
        seed=-(2**63),
        stop="###",
        extra={"top_k": 20, "repetition_penalty": 1.05},
    ) == {
        "max_tokens": 64,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 20,
        "seed": -(2**63),
        "stop": ["###"],
        "repetition_penalty": 1.05,
    }
    assert echo(
        chat_server,
        max_tokens=7,
        max_completion_tokens=7,
        seed=2**63 - 1,
        stop=["a", "b", "c", "d"],
        extra={"top_k": -1},
    ) == {**DEFAULTS, "max_tokens": 7, "seed": 2**63 - 1, "stop": ["a", "b", "c", "d"], "top_k": 0}
    assert echo(chat_server, max_tokens=3)["max_tokens"] == 3  # the older name alone
    assert echo(chat_server, {"top_k": 0})["top_k"] == 0


def test_a_stop_string_ends_the_text_before_it_as_stop(chat_server):
    client = chat_server.client()
    completion = client.chat.completions.create(
        model="t-chat", messages=user(PROMPT), stop=["nowhere", "hello"], max_tokens=10
    )
    assert completion.choices[0].message.content == "You said: "
    assert completion.choices[0].finish_reason == "stop"
    chunks = list(
        client.chat.completions.create(
            model="t-chat", messages=user(PROMPT), stop="there", stream=True
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == "You said: hello "
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_usage_of_a_plain_response(chat_server):
    client = chat_server.client()
    completion = client.chat.completions.create(model="t-chat", messages=user(PROMPT))
    assert completion.usage.model_dump(exclude_none=True) == USAGE
    capped = client.chat.completions.create(model="t-chat", messages=user(PROMPT), max_tokens=2)
    assert (capped.usage.completion_tokens, capped.usage.total_tokens) == (2, 4)
    assert capped.choices[0].finish_reason == "length"


def test_usage_is_the_text_stage_s_even_with_audio(chat_server):
    """t-chat's talker reports 1000 tokens; only the text stage's count is the usage."""
    completion = chat_server.client().chat.completions.create(
        model="t-chat",
        messages=user(PROMPT),
        modalities=["text", "audio"],
        audio={"voice": "bob", "format": "wav"},
    )
    assert completion.usage.model_dump(exclude_none=True) == USAGE


def test_a_pipeline_without_a_text_stage_reports_its_audio_stage_s_usage(speech_server):
    completion = speech_server.client().chat.completions.create(
        model="t-speech",
        messages=user("one two three"),
        modalities=["text", "audio"],
        audio={"voice": "alice", "format": "pcm16"},
    )
    assert completion.usage.model_dump(exclude_none=True) == {
        "prompt_tokens": 0,
        "completion_tokens": 3,
        "total_tokens": 3,
    }


def test_streamed_usage_comes_last_when_asked_for(chat_server):
    client = chat_server.client()
    chunks = list(
        client.chat.completions.create(
            model="t-chat",
            messages=user(PROMPT),
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    *content, last = chunks
    assert last.choices == [] and last.usage.model_dump(exclude_none=True) == USAGE
    assert all(c.usage is None and len(c.choices) == 1 for c in content)
    assert "".join(c.choices[0].delta.content or "" for c in content) == REPLY
    assert content[-1].choices[0].finish_reason == "stop"

    plain = list(client.chat.completions.create(model="t-chat", messages=user(PROMPT), stream=True))
    assert all(len(c.choices) == 1 and c.usage is None for c in plain)
    unasked = list(
        client.chat.completions.create(
            model="t-chat",
            messages=user(PROMPT),
            stream=True,
            stream_options={"include_usage": False},
        )
    )
    assert all(len(c.choices) == 1 for c in unasked)


def test_the_openai_stream_helper_collects_text_and_usage(chat_server):
    with chat_server.client().chat.completions.stream(
        model="t-chat", messages=user(PROMPT), stream_options={"include_usage": True}
    ) as stream:
        completion = stream.get_final_completion()
    assert completion.choices[0].message.content == REPLY
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage.model_dump(exclude_none=True) == USAGE


def test_a_malformed_usage_report_is_a_server_error(chat_server):
    client = chat_server.client()
    bad = {"test_usage": {"prompt_tokens": -1, "completion_tokens": 2}}
    with pytest.raises(openai.InternalServerError, match="reported usage prompt_tokens = -1"):
        client.chat.completions.create(model="t-chat", messages=user(PROMPT), extra_body=bad)
    stream = client.chat.completions.create(
        model="t-chat", messages=user(PROMPT), extra_body=bad, stream=True
    )
    with pytest.raises(openai.APIError, match="reported usage prompt_tokens = -1"):
        list(stream)
