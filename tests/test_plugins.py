"""The plugin manager: entry points, OMNI_PLUGINS, broken plugins, clashes, the factory hook."""

from __future__ import annotations

import sys
import textwrap
import time
import types
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from omni_core import (
    ConfigError,
    EngineArgs,
    EngineStageConfig,
    FactoryArgs,
    LazyPipeline,
    OmniPlugins,
    PipelineConfig,
    PluginError,
    StageConfig,
    StageContext,
    hookimpl,
)

sys.path.insert(0, str(Path(__file__).parent))
from installed_plugins import INSTALLED, shipped_only


def external(plugins: OmniPlugins) -> dict[str, dict[str, Any]]:
    """The listing rows of non-built-in plugins, by name."""
    return {row["name"]: row for row in plugins.listing()}


def pipeline_plugin(*classes: type[PipelineConfig], name: str = "omni_test_plugin") -> Any:
    """A module-like plugin that registers ``classes``, as an installed plugin's module would."""
    module = types.ModuleType(name)

    @hookimpl
    def omni_register_pipelines() -> list[type[PipelineConfig]]:
        return list(classes)

    module.omni_register_pipelines = omni_register_pipelines  # type: ignore[attr-defined]
    return module


class EchoPipeline(PipelineConfig):
    """A one-stage pipeline registered in-process by the tests."""

    pipeline_name: ClassVar[str] = "test-echo"
    aliases: ClassVar[tuple[str, ...]] = ("EchoForConditionalGeneration",)
    description: ClassVar[str] = "echoes its input"
    entry_stage: ClassVar[str] = "echo"

    @classmethod
    def default_stages(cls) -> list[StageConfig]:
        return [StageConfig(name="echo", factory_path="x.y:z", terminal=True, process="pipeline")]


class EchoAgain(EchoPipeline):
    """Another plugin's pipeline that takes the same name."""


class ClaimsQwen3TTSArchitecture(EchoPipeline):
    """A pipeline whose alias is already the name of an installed pipeline."""

    pipeline_name: ClassVar[str] = "test-impostor"
    aliases: ClassVar[tuple[str, ...]] = ("Qwen3TTSForConditionalGeneration",)


# -- entry points and OMNI_PLUGINS ------------------------------------------


def test_the_three_installed_plugins_load_from_entry_points(plugins: OmniPlugins) -> None:
    rows = shipped_only(external(plugins))  # a developer's own plugins may be installed too
    assert {name: row["pipelines"] for name, row in rows.items()} == INSTALLED
    for row in rows.values():
        assert row["version"] == "0.1.0"
        assert "omni_register_pipelines" in row["hooks"]
        assert row["error"] is None
        assert not row["builtin"]
    shipped = [name for name, made in plugins.pipelines().items() if made.plugin in rows]
    assert sorted(shipped) == sorted(p for ps in INSTALLED.values() for p in ps)


def test_builtin_plugins_are_listed_only_when_asked(plugins: OmniPlugins) -> None:
    builtin = [row for row in plugins.listing(include_builtin=True) if row["builtin"]]
    assert {row["name"] for row in builtin} >= {
        "omni_core.builtins.factory",
        "omni_core.builtins.placement",
        "omni_core.builtins.transports",
    }
    assert not [row for row in plugins.listing() if row["builtin"]]


@pytest.mark.parametrize(
    "value", ["omni-qwen3-tts", "qwen3_tts", "Omni_Qwen3_TTS", " omni-qwen3-tts ,"]
)
def test_omni_plugins_restricts_by_distribution_or_entry_point_name(value: str) -> None:
    plugins = OmniPlugins(env={"OMNI_PLUGINS": value})
    assert list(external(plugins)) == ["omni-qwen3-tts"]
    assert list(plugins.pipelines()) == ["qwen3-tts"]
    assert plugins.unknown_requested == []


def test_an_empty_omni_plugins_loads_no_external_plugin() -> None:
    plugins = OmniPlugins(env={"OMNI_PLUGINS": ""})
    assert plugins.listing() == []
    assert plugins.pipelines() == {}
    assert len(plugins.listing(include_builtin=True)) == 4  # built-ins always load


def test_an_unknown_name_in_omni_plugins_is_reported_not_fatal() -> None:
    plugins = OmniPlugins(env={"OMNI_PLUGINS": "omni-qwen3-tts,omni-not-installed"})
    assert list(external(plugins)) == ["omni-qwen3-tts"]
    assert plugins.unknown_requested == ["omni-not-installed"]
    with pytest.raises(PluginError) as caught:
        plugins.pipeline("moss-tts")
    assert "omni-not-installed" in str(caught.value)


def test_the_env_argument_overrides_the_process_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OMNI_PLUGINS", "")
    assert list(shipped_only(external(OmniPlugins(env={})))) == sorted(INSTALLED)
    assert OmniPlugins().listing() == []


# -- in-process registration --------------------------------------------------


def test_a_plugin_registered_in_process_is_listed_and_unregistered(plugins: OmniPlugins) -> None:
    name = plugins.register(pipeline_plugin(EchoPipeline), version="9.9")
    assert name == "omni_test_plugin"
    row = external(plugins)[name]
    assert row["pipelines"] == ["test-echo"]
    assert row["version"] == "9.9"
    assert row["hooks"] == ["omni_register_pipelines"]
    assert plugins.pipeline("test-echo") is EchoPipeline

    plugins.unregister(name)
    assert name not in external(plugins)
    with pytest.raises(PluginError, match="test-echo"):
        plugins.pipeline("test-echo")
    with pytest.raises(PluginError, match="no plugin named 'omni_test_plugin'"):
        plugins.unregister(name)


def test_an_object_with_hookimpl_methods_is_a_plugin(plugins: OmniPlugins) -> None:
    class EchoPlugin:
        @hookimpl
        def omni_register_pipelines(self) -> list[type[PipelineConfig]]:
            return [EchoPipeline]

    with plugins.registered(EchoPlugin(), name="echo-plugin"):
        assert plugins.pipeline("test-echo") is EchoPipeline
        assert external(plugins)["echo-plugin"]["pipelines"] == ["test-echo"]
    assert "echo-plugin" not in external(plugins)


def test_registering_one_name_twice_is_refused(plugins: OmniPlugins) -> None:
    plugins.register(pipeline_plugin(EchoPipeline), name="echo")
    with pytest.raises(PluginError, match="'echo' is already registered"):
        plugins.register(pipeline_plugin(EchoPipeline, name="other"), name="echo")


def test_registering_an_installed_module_again_is_the_same_plugin(plugins: OmniPlugins) -> None:
    module = plugins.records["omni-qwen3-tts"].plugin
    assert isinstance(module, types.ModuleType)
    assert plugins.register(module, module.__name__) == "omni-qwen3-tts"
    assert plugins.register(module) == "omni-qwen3-tts"
    rows = [row for row in plugins.listing() if "qwen3-tts" in row["pipelines"]]
    assert [(row["name"], row["error"]) for row in rows] == [("omni-qwen3-tts", None)]
    assert plugins.pipeline("qwen3-tts").pipeline_name == "qwen3-tts"  # no clash with itself
    assert module.__name__ not in plugins.in_process_modules()  # children use the entry point

    plugins.unregister(module.__name__)  # the in-process name only: the installed plugin stays
    assert "omni-qwen3-tts" in external(plugins)
    with plugins.registered(module, module.__name__) as name:
        assert name == "omni-qwen3-tts"
        assert plugins.aliases == {module.__name__: "omni-qwen3-tts"}
    assert plugins.aliases == {}
    assert external(plugins)["omni-qwen3-tts"]["pipelines"] == ["qwen3-tts"]


def test_a_module_registered_twice_in_process_is_listed_once(plugins: OmniPlugins) -> None:
    module = pipeline_plugin(EchoPipeline)
    assert plugins.register(module, "omni-echo") == "omni-echo"
    assert plugins.register(module, "omni-echo-again") == "omni-echo"
    assert plugins.record_of(module) is plugins.records["omni-echo"]
    assert plugins.record_of(pipeline_plugin(EchoPipeline)) is None  # another object
    assert plugins.in_process_modules() == ["omni_test_plugin"]  # what children import, once
    assert [r["name"] for r in plugins.listing() if r["pipelines"] == ["test-echo"]] == [
        "omni-echo"
    ]
    plugins.unregister("omni-echo")  # its own name: the plugin and every alias go
    assert "omni-echo" not in external(plugins)
    with pytest.raises(PluginError, match="no plugin named 'omni-echo-again'"):
        plugins.unregister("omni-echo-again")


def test_another_object_under_a_taken_name_is_a_plugin_error(plugins: OmniPlugins) -> None:
    impostor = pipeline_plugin(EchoPipeline)
    with pytest.raises(PluginError) as caught:
        plugins.register(impostor, name="omni-qwen3-tts")
    assert type(caught.value) is PluginError  # not pluggy's ValueError
    message = str(caught.value)
    assert "a plugin named 'omni-qwen3-tts' is already registered" in message
    assert "from the entry point 'qwen3_tts" in message
    assert "hint: register it under another name, or unregister 'omni-qwen3-tts' first" in message
    # A name taken as an alias is taken too.
    module = plugins.records["omni-moss-tts"].plugin
    plugins.register(module, "moss")
    with pytest.raises(PluginError, match="a plugin named 'moss' is already registered"):
        plugins.register(impostor, name="moss")
    assert "omni_test_plugin" not in external(plugins)


# -- hooks a plugin gets wrong ---------------------------------------------------


def module_with(name: str, **hooks: Callable[..., Any]) -> types.ModuleType:
    """A plugin module whose attributes are ``hooks`` (functions already marked or not)."""
    module = types.ModuleType(name)
    for attribute, function in hooks.items():
        setattr(module, attribute, function)
    return module


def test_a_misspelt_hook_is_that_plugins_load_error_and_the_others_load(
    plugins: OmniPlugins,
) -> None:
    @hookimpl
    def omni_register_pipeline() -> list[type[PipelineConfig]]:
        return [EchoPipeline]

    @hookimpl
    def omni_register_wire_types() -> list[str]:
        return ["omni_test_typo:Payload"]

    typo = module_with(
        "omni_test_typo",
        omni_register_pipeline=omni_register_pipeline,
        omni_register_wire_types=omni_register_wire_types,
    )
    assert plugins.register(typo) == "omni_test_typo"  # recorded, not raised
    row = external(plugins)["omni_test_typo"]
    assert row["error"] == (
        "omni_register_pipeline is not an omni hook; did you mean omni_register_pipelines?"
    )
    assert row["hooks"] == []  # neither the misspelt hook nor the good one: it did not load
    assert "omni_test_typo:Payload" not in plugins.wire_types()
    for name, pipelines in INSTALLED.items():
        assert external(plugins)[name]["pipelines"] == pipelines
        assert external(plugins)[name]["error"] is None
    with pytest.raises(PluginError) as caught:
        plugins.pipeline("test-echo")
    assert "omni_test_typo (omni_register_pipeline is not an omni hook" in str(caught.value)
    plugins.unregister("omni_test_typo")
    assert "omni_test_typo" not in external(plugins)


def test_an_unknown_hook_with_no_close_name_lists_the_hooks(plugins: OmniPlugins) -> None:
    @hookimpl
    def omni_frobnicate() -> None:
        return None

    plugins.register(module_with("omni_test_frob", omni_frobnicate=omni_frobnicate))
    error = external(plugins)["omni_test_frob"]["error"]
    assert error.startswith("omni_frobnicate is not an omni hook (the hooks: omni_build_stage, ")
    assert "omni_register_wire_types" in error
    assert "@hookimpl(optionalhook=True)" in error


def test_an_optional_hook_of_another_version_is_accepted(plugins: OmniPlugins) -> None:
    @hookimpl(optionalhook=True)
    def omni_register_codecs() -> list[str]:
        return []

    @hookimpl
    def omni_register_pipelines() -> list[type[PipelineConfig]]:
        return [EchoPipeline]

    plugins.register(
        module_with(
            "omni_test_newer",
            omni_register_codecs=omni_register_codecs,
            omni_register_pipelines=omni_register_pipelines,
        )
    )
    assert external(plugins)["omni_test_newer"]["error"] is None
    assert plugins.pipeline("test-echo") is EchoPipeline


def test_a_hook_whose_arguments_are_not_the_hookspecs_is_a_load_error(
    plugins: OmniPlugins,
) -> None:
    class Misnamed:
        @hookimpl
        def omni_build_stage(self, stage: Any, pipline: Any, context: Any) -> Any:
            return None

    plugins.register(Misnamed(), name="misnamed")  # pluggy's error does not escape
    row = external(plugins)["misnamed"]
    assert row["error"].startswith("PluginValidationError: Plugin 'misnamed' for hook")
    assert "omni_build_stage" in row["error"]
    assert "pipline" in row["error"]
    assert "\n" not in row["error"]
    assert row["hooks"] == []
    assert plugins.pipeline("qwen3-tts").pipeline_name == "qwen3-tts"


def test_a_pydantic_error_in_a_registration_hook_names_the_plugin_and_hook(
    plugins: OmniPlugins,
) -> None:
    @hookimpl
    def omni_register_pipelines() -> list[type[PipelineConfig]]:
        StageConfig(name="x", factory_path="a:b", terminal=True, tp_size="two")
        return [EchoPipeline]

    plugins.register(
        module_with("omni_test_pydantic", omni_register_pipelines=omni_register_pipelines)
    )
    error = external(plugins)["omni_test_pydantic"]["error"]
    assert error == (
        "omni_register_pipelines failed: ValidationError in StageConfig: tp_size: "
        "Input should be a valid integer, unable to parse string as an integer"
    )
    with pytest.raises(PluginError) as caught:
        plugins.pipeline("test-echo")
    assert f"omni_test_pydantic ({error})" in str(caught.value)


def test_pipeline_aliases_written_as_a_string_are_refused(plugins: OmniPlugins) -> None:
    class OneAlias(EchoPipeline):
        aliases: ClassVar[tuple[str, ...]] = "EchoModel"  # type: ignore[assignment]

    plugins.register(pipeline_plugin(OneAlias), name="one-alias")
    error = external(plugins)["one-alias"]["error"]
    assert "pipeline 'test-echo': aliases must be a tuple of names, not 'EchoModel'" in error
    assert 'aliases = ("EchoModel",)' in error
    assert "E" not in plugins.registries.aliases  # no alias per character


@pytest.fixture
def install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str, str], str]:
    """``install(distribution, source)``: a distribution whose ``omni`` plugin is ``source``."""
    made: list[str] = []

    def make(distribution: str, source: str) -> str:
        module = distribution.replace("-", "_") + "_for_tests"
        info = tmp_path / f"{distribution.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n"
        )
        (info / "entry_points.txt").write_text(f"[omni]\nplugin = {module}\n")
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
        made.append(module)
        return module

    monkeypatch.syspath_prepend(str(tmp_path))
    yield make
    for module in made:
        sys.modules.pop(module, None)


def test_an_installed_plugin_with_a_misspelt_hook_is_listed_with_its_error(install) -> None:
    install(
        "omni-typo",
        """
        from omni_core import hookimpl

        @hookimpl
        def omni_register_transport():
            return []
        """,
    )
    rows = external(OmniPlugins(env={}))
    assert rows["omni-typo"]["error"] == (
        "omni_register_transport is not an omni hook; did you mean omni_register_transports?"
    )
    assert rows["omni-typo"]["hooks"] == []
    for name, pipelines in INSTALLED.items():
        assert rows[name]["pipelines"] == pipelines


# -- the names of things in messages ----------------------------------------------


def named(name: str) -> types.SimpleNamespace:
    """A registered item (policy or transport) that has nothing but a name."""
    return types.SimpleNamespace(name=name, description="")


def test_missing_items_are_named_in_the_singular_and_listed_in_the_plural(
    plugins: OmniPlugins,
) -> None:
    with pytest.raises(PluginError) as caught:
        plugins.policy("declard")
    assert caught.value.message == "no plugin provides a placement policy called 'declard'"
    assert caught.value.hint.startswith("registered placement policies: auto, colocate, cpu, ")
    assert "did you mean: declared" in caught.value.hint
    with pytest.raises(PluginError) as caught:
        plugins.transport("shmm")
    assert caught.value.message == "no plugin provides a transport called 'shmm'"
    assert caught.value.hint.startswith("registered transports: inproc, shm, socket")


@pytest.mark.parametrize(
    ("hook", "lookup", "label", "builtin"),
    [
        ("omni_register_placement_policies", "policy", "placement policy", "placement"),
        ("omni_register_transports", "transport", "transport", "transports"),
    ],
)
def test_clashes_and_nameless_items_say_what_kind_they_are(
    plugins: OmniPlugins, hook: str, lookup: str, label: str, builtin: str
) -> None:
    taken = {"policy": "declared", "transport": "shm"}[lookup]

    @hookimpl(specname=hook)
    def clash() -> list[Any]:
        return [named(taken)]

    @hookimpl(specname=hook)
    def nameless() -> list[Any]:
        return [named("")]

    plugins.register(module_with("omni_test_fork", clash=clash), name="omni-fork")
    with pytest.raises(PluginError) as caught:
        getattr(plugins, lookup)(taken)
    assert str(caught.value).startswith(
        f"{label} {taken!r} is registered by two plugins: "
        f"'omni_core.builtins.{builtin}' and 'omni-fork'; uninstall one"
    )
    plugins.unregister("omni-fork")
    plugins.register(module_with("omni_test_nameless", nameless=nameless))
    assert external(plugins)["omni_test_nameless"]["error"].startswith(
        f"{hook} failed: PluginError: a plugin registered a {label} without a name: "
    )


# -- broken plugins -------------------------------------------------------------


def test_a_registration_hook_that_raises_does_not_hide_the_others(plugins: OmniPlugins) -> None:
    broken = types.ModuleType("omni_test_raises")

    @hookimpl
    def omni_register_pipelines() -> list[type[PipelineConfig]]:
        raise RuntimeError("checkpoint index is corrupt")

    broken.omni_register_pipelines = omni_register_pipelines  # type: ignore[attr-defined]
    plugins.register(broken)
    rows = external(plugins)
    assert "RuntimeError: checkpoint index is corrupt" in rows["omni_test_raises"]["error"]
    assert rows["omni-qwen3-tts"]["pipelines"] == ["qwen3-tts"]
    assert plugins.pipeline("qwen3-tts").pipeline_name == "qwen3-tts"


def test_a_plugin_that_failed_to_load_is_listed_with_its_error(plugins: OmniPlugins) -> None:
    plugins.register_broken("omni-fake-model", ImportError("No module named 'fake_model'"))
    rows = external(plugins)
    assert rows["omni-fake-model"]["error"] == "ImportError: No module named 'fake_model'"
    assert rows["omni-fake-model"]["pipelines"] == []
    assert rows["omni-moss-tts"]["pipelines"] == ["moss-tts"]
    with pytest.raises(PluginError) as caught:
        plugins.pipeline("fake-model")
    assert "omni-fake-model" in str(caught.value)
    assert "No module named 'fake_model'" in str(caught.value)


@pytest.fixture
def broken_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An installed distribution whose ``omni`` entry point raises ImportError on load.

    A ``*.dist-info`` directory on ``sys.path`` is all importlib.metadata needs,
    so this is the same path a ``pip install``-ed broken plugin takes.
    """
    module = "omni_broken_plugin_for_tests"
    info = tmp_path / "omni_broken-0.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: omni-broken\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text(f"[omni]\nbroken = {module}\n")
    (tmp_path / f"{module}.py").write_text(
        'raise ImportError("omni-broken needs libfoo.so, which is not installed")\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield module
    sys.modules.pop(module, None)


def test_a_broken_entry_point_is_listed_with_its_error(broken_distribution: str) -> None:
    plugins = OmniPlugins(env={})
    rows = external(plugins)
    assert rows["omni-broken"]["version"] == "0.3"
    assert rows["omni-broken"]["error"] == (
        "ImportError: omni-broken needs libfoo.so, which is not installed"
    )
    assert plugins.records["omni-broken"].plugin is None  # nothing half-loaded is registered
    for name, pipelines in INSTALLED.items():
        assert rows[name]["pipelines"] == pipelines
    with pytest.raises(PluginError) as caught:
        plugins.pipeline("x")
    message = str(caught.value)
    assert "omni-broken" in message
    assert "libfoo.so" in message


def test_omni_plugins_can_leave_a_broken_plugin_out(broken_distribution: str) -> None:
    plugins = OmniPlugins(env={"OMNI_PLUGINS": "omni-qwen3-omni"})
    assert list(external(plugins)) == ["omni-qwen3-omni"]


# -- clashes ----------------------------------------------------------------------


def test_two_plugins_registering_one_pipeline_name_is_an_error_naming_both(
    plugins: OmniPlugins,
) -> None:
    plugins.register(pipeline_plugin(EchoPipeline), name="omni-echo")
    plugins.register(pipeline_plugin(EchoAgain), name="omni-echo-fork")
    with pytest.raises(PluginError) as caught:
        plugins.pipelines()
    message = str(caught.value)
    assert "'test-echo'" in message
    assert "'omni-echo'" in message
    assert "'omni-echo-fork'" in message
    # The listing still answers, and shows who clashes.
    assert "omni-echo" in external(plugins)["omni-echo-fork"]["error"]


def test_an_alias_that_clashes_with_an_installed_pipeline_is_an_error(
    plugins: OmniPlugins,
) -> None:
    plugins.register(pipeline_plugin(ClaimsQwen3TTSArchitecture), name="omni-impostor")
    with pytest.raises(PluginError) as caught:
        plugins.pipeline("qwen3-tts")
    message = str(caught.value)
    assert "Qwen3TTSForConditionalGeneration" in message
    assert "'omni-qwen3-tts'" in message
    assert "'omni-impostor'" in message


# -- lookups ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("alias", "pipeline"),
    [
        ("Qwen3TTSForConditionalGeneration", "qwen3-tts"),
        ("qwen3_tts", "qwen3-tts"),
        ("Qwen3OmniMoeForConditionalGeneration", "qwen3-omni"),
        ("qwen3_omni_moe", "qwen3-omni"),
        ("MossTTSDelayModel", "moss-tts"),
        ("QWEN3-OMNI-TEXT", "qwen3-omni-text"),
    ],
)
def test_a_pipeline_is_found_by_name_or_alias(
    plugins: OmniPlugins, alias: str, pipeline: str
) -> None:
    assert plugins.pipeline(alias).pipeline_name == pipeline


def test_a_misspelt_pipeline_name_gets_a_suggestion(plugins: OmniPlugins) -> None:
    with pytest.raises(PluginError) as caught:
        plugins.pipeline("qwen3-omni-colocate")
    message = str(caught.value)
    assert "no plugin provides a pipeline called 'qwen3-omni-colocate'" in message
    assert "did you mean: qwen3-omni-colocated" in message


# -- the factory hook ----------------------------------------------------------------

FACTORIES = '''
"""Stage factories the tests build through the default construction."""

def make_vocoder(model_path, gpu_id, chunk_frames=12, flavour="default"):
    return {"model_path": model_path, "gpu_id": gpu_id,
            "chunk_frames": chunk_frames, "flavour": flavour}

def make_any(**kwargs):
    return kwargs

def make_engine(model_path, engine_args):
    return {"model_path": model_path, "engine_args": engine_args}
'''


class VocoderArgs(FactoryArgs):
    # Lets undeclared keys through to the factory, whose signature then judges them:
    # these tests are about that judgement at construction time.
    allow_extra_keys = True
    chunk_frames: int = 12


@pytest.fixture
def factories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The import name of a fresh module of stage factories."""
    module = "omni_test_factories"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(FACTORIES))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)
    return module


def make_stage(factory_path: str, factory: FactoryArgs, **author: Any) -> StageConfig:
    return StageConfig(
        name="vocoder",
        factory_path=factory_path,
        terminal=True,
        process="pipeline",
        gpu=3,
        factory=factory,
        author_kwargs=author,
    )


def build(plugins: OmniPlugins, stage: StageConfig) -> Any:
    class OneStage(PipelineConfig):
        pipeline_name: ClassVar[str] = "test-one-stage"
        default_model_path: ClassVar[str] = "org/model"

    context = StageContext(instance="vocoder", process="pipeline", gpu_ids=(3,))
    return plugins.build_stage(stage, OneStage(stages=[stage]), context)


def test_the_default_construction_merges_the_two_channels(
    plugins: OmniPlugins, factories: str
) -> None:
    path = f"{factories}:make_vocoder"
    # Author channel over the declared default.
    built = build(plugins, make_stage(path, VocoderArgs(), chunk_frames=24, flavour="author"))
    assert built == {
        "model_path": "org/model",
        "gpu_id": 3,
        "chunk_frames": 24,
        "flavour": "author",
    }
    # Config channel (what a deploy file set) over the author channel, per key.
    built = build(
        plugins, make_stage(path, VocoderArgs(flavour="config"), chunk_frames=24, flavour="author")
    )
    assert built["flavour"] == "config"
    assert built["chunk_frames"] == 24
    built = build(plugins, make_stage(path, VocoderArgs(chunk_frames=48), chunk_frames=24))
    assert built["chunk_frames"] == 48


def test_standard_kwargs_are_injected_only_where_declared(
    plugins: OmniPlugins, factories: str
) -> None:
    built = build(plugins, make_stage(f"{factories}:make_vocoder", VocoderArgs()))
    assert set(built) == {"model_path", "gpu_id", "chunk_frames", "flavour"}
    # A factory taking **kwargs declares no standard kwarg by name, so it gets none.
    assert build(plugins, make_stage(f"{factories}:make_any", FactoryArgs(depth=2))) == {"depth": 2}


def test_an_engine_stage_factory_receives_its_engine_group_when_it_asks(
    plugins: OmniPlugins, factories: str
) -> None:
    stage = EngineStageConfig(
        name="vocoder",
        factory_path=f"{factories}:make_engine",
        terminal=True,
        process="pipeline",
        engine=EngineArgs(max_running_requests=4, cuda_graph_max_bs=8),
    )
    built = build(plugins, stage)
    assert built["engine_args"] == {"max_running_requests": 4, "cuda_graph_max_bs": 8}
    # A plain stage never gets one, even if its factory asks.
    with pytest.raises(TypeError, match="engine_args"):
        build(plugins, make_stage(f"{factories}:make_engine", FactoryArgs()))


def test_an_unknown_factory_key_is_refused_by_name(plugins: OmniPlugins, factories: str) -> None:
    stage = make_stage(f"{factories}:make_vocoder", VocoderArgs(batch_wait_when_idle=True))
    with pytest.raises(ConfigError) as caught:
        build(plugins, stage)
    message = str(caught.value)
    assert "stage 'vocoder'" in message
    assert "factory.batch_wait_when_idle" in message
    assert f"{factories}:make_vocoder" in message
    assert "chunk_frames" in message  # the hint lists what it does accept


def test_a_factory_path_that_does_not_import_is_a_config_error(plugins: OmniPlugins) -> None:
    with pytest.raises(ConfigError, match="stage 'vocoder' factory: cannot import"):
        build(plugins, make_stage("omni_no_such_module_anywhere:make", FactoryArgs()))


class Timer:
    """A plugin that wraps stage construction: it times it and never replaces it."""

    def __init__(self) -> None:
        self.timings: list[tuple[str, float, str]] = []

    @hookimpl(wrapper=True)
    def omni_build_stage(
        self, stage: StageConfig, pipeline: PipelineConfig, context: StageContext
    ) -> Generator[None, Any, Any]:
        start = time.perf_counter()
        outcome = "ok"
        try:
            return (yield)
        except Exception as exc:
            outcome = type(exc).__name__
            raise
        finally:
            self.timings.append((stage.name, time.perf_counter() - start, outcome))


def test_a_wrapper_plugin_times_construction_without_replacing_it(
    plugins: OmniPlugins, factories: str
) -> None:
    timer = Timer()
    with plugins.registered(timer, name="timer"):
        built = build(plugins, make_stage(f"{factories}:make_vocoder", VocoderArgs()))
        with pytest.raises(ConfigError):
            build(plugins, make_stage(f"{factories}:make_vocoder", VocoderArgs(nope=1)))
    assert built["gpu_id"] == 3  # the built-in construction still ran
    assert [(name, outcome) for name, _, outcome in timer.timings] == [
        ("vocoder", "ok"),
        ("vocoder", "ConfigError"),
    ]
    assert all(seconds >= 0 for _, seconds, _ in timer.timings)


def test_every_installed_pipeline_builds_its_default_config(plugins: OmniPlugins) -> None:
    """Also proves each lazily registered pipeline's names match its class's (checked on load)."""
    classes = plugins.pipeline_classes()
    assert set(classes) == set(plugins.pipelines())
    for name, cls in classes.items():
        config: PipelineConfig = cls()
        assert config.model_path == cls.default_model_path
        assert config.stage_names, name


def lazy_plugin(*items: LazyPipeline, name: str = "omni_test_lazy") -> Any:
    module = types.ModuleType(name)

    @hookimpl
    def omni_register_pipelines() -> list[LazyPipeline]:
        return list(items)

    module.omni_register_pipelines = omni_register_pipelines  # type: ignore[attr-defined]
    return module


def test_a_lazy_pipeline_is_listed_without_importing_its_module(plugins: OmniPlugins) -> None:
    target = f"{__name__}:EchoPipeline"
    aliases = ("EchoForConditionalGeneration",)
    plugins.register(lazy_plugin(LazyPipeline("test-echo", target, aliases)), name="lazy")
    registered = plugins.pipelines()["test-echo"]
    assert isinstance(registered.value, LazyPipeline)  # collected, not imported
    assert plugins.pipeline("EchoForConditionalGeneration") is EchoPipeline  # by alias
    assert plugins.pipelines()["test-echo"].value is EchoPipeline  # loaded once, kept


@pytest.mark.parametrize(
    ("item", "says"),
    [
        (
            LazyPipeline("test-echo", f"{__name__}:EchoPipeline", ()),
            "but the class declares aliases ('EchoForConditionalGeneration',)",
        ),
        (
            LazyPipeline(
                "test-other", f"{__name__}:EchoPipeline", ("EchoForConditionalGeneration",)
            ),
            "but the class declares pipeline_name 'test-echo'",
        ),
        (
            LazyPipeline("test-gone", "omni_no_such_module:Gone"),
            "cannot import 'omni_no_such_module'",
        ),
        (LazyPipeline("test-not", f"{__name__}:module_with"), "not a PipelineConfig subclass"),
    ],
    ids=["aliases", "name", "import", "not-a-pipeline"],
)
def test_a_lazy_pipeline_that_disagrees_with_its_class_names_the_plugin(
    plugins: OmniPlugins, item: LazyPipeline, says: str
) -> None:
    plugins.register(lazy_plugin(item), name="omni-lazy-test")
    with pytest.raises(PluginError) as caught:
        plugins.pipeline(item.pipeline_name)
    assert says in caught.value.message
    assert "plugin 'omni-lazy-test'" in caught.value.message


def test_a_lazy_pipeline_clashing_with_a_class_is_refused_naming_both(
    plugins: OmniPlugins,
) -> None:
    plugins.register(pipeline_plugin(EchoPipeline), name="eager")
    plugins.register(lazy_plugin(LazyPipeline("test-echo", "x.y:Z")), name="lazy")
    with pytest.raises(PluginError, match="registered by two plugins: 'eager' and 'lazy'"):
        plugins.pipeline("test-echo")


def test_wire_types_are_collected_from_every_plugin(plugins: OmniPlugins) -> None:
    class Payload:
        pass

    class PayloadPlugin:
        @hookimpl
        def omni_register_wire_types(self) -> list[type | str]:
            return [Payload, "some.module:Frame"]

    with plugins.registered(PayloadPlugin(), name="payloads"):
        names = plugins.wire_types()
        assert external(plugins)["payloads"]["hooks"] == ["omni_register_wire_types"]
    assert {f"{Payload.__module__}:{Payload.__qualname__}", "some.module:Frame"} <= names
    assert "some.module:Frame" not in plugins.wire_types()


def test_a_malformed_wire_type_is_refused_by_name(plugins: OmniPlugins) -> None:
    class BadPlugin:
        @hookimpl
        def omni_register_wire_types(self) -> list[str]:
            return ["no-colon-here"]

    with plugins.registered(BadPlugin(), name="bad"), pytest.raises(PluginError) as caught:
        plugins.wire_types()
    message = str(caught.value)
    assert "plugin 'bad': omni_register_wire_types failed" in message
    assert "'no-colon-here' is not 'module:Qualname'" in message


def test_an_engine_stage_factory_may_ask_for_the_validated_settings(
    plugins: OmniPlugins, factories: str, tmp_path: Path
) -> None:
    module = tmp_path / "settings_factories.py"
    module.write_text("def make(model_path, engine_settings):\n    return engine_settings\n")
    stage = EngineStageConfig(
        name="vocoder",
        factory_path="settings_factories:make",
        terminal=True,
        process="pipeline",
        engine=EngineArgs(max_running_requests=4),
    )
    settings = build(plugins, stage)
    # the backend's model, defaults filled in: what planning and admission read too
    assert settings.max_running_requests == 4 and settings.max_total_tokens == 16384
