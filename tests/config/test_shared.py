"""[[shared]] selector blocks: one value into several stages."""

from __future__ import annotations

import pytest

from omni_core.config.render import explain
from omni_core.errors import ConfigError

HEAD = 'pipeline = "qwen3-omni"\n'


def test_select_engine_stages(deploy, resolve):
    path = deploy(
        HEAD + "\n[[shared]]\nselect = { engine = true }\nengine.max_running_requests = 16\n"
    )
    res = resolve(path)
    assert res.config.stage("thinker").engine.max_running_requests == 16
    assert res.config.stage("talker_ar").engine.max_running_requests == 16
    record = res.record(("stages", "thinker", "engine", "max_running_requests"))
    assert str(record.winner.origin) == f"[[shared]] #1 ({path}:3)"


def test_select_by_names_with_exclude_applied_last(deploy, resolve):
    path = deploy(
        HEAD + '[[shared]]\nselect = { stages = ["image_encoder", "audio_encoder", "code2wav"], '
        'exclude = ["code2wav"] }\nfactory.dtype = "float16"\n'
    )
    res = resolve(path)
    assert res.config.stage("image_encoder").factory.dtype == "float16"
    assert res.config.stage("audio_encoder").factory.dtype == "float16"
    assert res.config.stage("code2wav").factory.dtype == "float32"


def test_select_non_engine_stages(deploy, resolve):
    path = deploy(HEAD + '[[shared]]\nselect = { engine = false }\nenv.OMP_NUM_THREADS = "2"\n')
    res = resolve(path)
    assert res.config.stage("decode").env == {"OMP_NUM_THREADS": "2"}
    assert res.config.stage("thinker").env == {}


def test_explicit_path_beats_shared_and_shared_beats_broadcast(deploy, resolve):
    path = deploy(
        HEAD
        + "[stages.thinker.engine]\nmem_fraction_static = 0.8\n"
        + "[[shared]]\nselect = { engine = true }\nengine.mem_fraction_static = 0.6\n"
    )
    res = resolve(path, "--mem-fraction-static", "0.5")
    # The command line outranks the file, whatever the rank inside the file.
    assert res.config.stage("talker_ar").engine.mem_fraction_static == 0.5
    res = resolve(path)
    assert res.config.stage("thinker").engine.mem_fraction_static == 0.8
    assert res.config.stage("talker_ar").engine.mem_fraction_static == 0.6
    text = explain(res.record(("stages", "thinker", "engine", "mem_fraction_static")))
    assert "[[shared]] #1" in text and "[superseded]" in text and "[winner]" in text


def test_two_shared_entries_writing_different_values_conflict(deploy, resolve):
    path = deploy(
        HEAD
        + "[[shared]]\nselect = { engine = true }\nengine.max_running_requests = 8\n"
        + '[[shared]]\nselect = { stages = ["thinker"] }\nengine.max_running_requests = 9\n'
    )
    with pytest.raises(ConfigError) as info:
        resolve(path)
    assert "[[shared]] #1" in str(info.value) and "[[shared]] #2" in str(info.value)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (
            "select = { kind = true }\nengine.max_running_requests = 1\n",
            "unknown selector key 'kind'",
        ),
        (
            'select = { stages = ["thinkr"] }\nengine.max_running_requests = 1\n',
            "did you mean: thinker",
        ),
        ('select = { exclude = ["decod"] }\nfactory.x = 1\n', "did you mean: decode"),
        ('select = { stages = ["decode"], engine = true }\nfactory.x = 1\n', "matches no stage"),
        ("select = { engine = true }\n", "no settings to write"),
        ("select = { stages = [] }\nfactory.x = 1\n", "select.stages is empty"),
        (
            'select = { stages = ["decode"] }\nengine.max_running_requests = 1\n',
            "not an engine stage",
        ),
        ('select = { engine = true }\nnext = "decode"\n', "topology"),
    ],
)
def test_bad_shared_entries_are_refused(deploy, resolve, body, says):
    path = deploy(HEAD + "[[shared]]\n" + body)
    with pytest.raises(ConfigError) as info:
        resolve(path)
    assert says in str(info.value)
    assert f"[[shared]] #1 ({path}:2)" in str(info.value)
