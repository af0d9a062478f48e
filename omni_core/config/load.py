"""From a deploy file and command-line flags to a :class:`Resolution`."""

from __future__ import annotations

from pydantic import PydanticUserError, ValidationError

from ..errors import ConfigError, PluginError, UsageError
from ..plugins import OmniPlugins, get_plugins
from ..schema import PipelineConfig
from ..schema.validation import validation_message
from .checks import check_outside
from .file_source import DeployFile, FileSource
from .flag_source import flag_patches, split_flags
from .origin import Layer, Origin
from .paths import PathSchema
from .resolve import Resolution, resolve


def load_deployment(
    deploy: str | None,
    flags: list[str] | None = None,
    *,
    pipeline: str | None = None,
    plugins: OmniPlugins | None = None,
) -> Resolution:
    """Resolve a deployment without loading any model.

    ``deploy`` is the deploy file (optional when ``pipeline`` is given);
    ``flags`` the remaining command-line tokens (``--vocoder.factory.x 3``);
    ``pipeline`` the ``--pipeline`` option, which outranks the file's key.
    """
    plugins = plugins or get_plugins()
    pairs = split_flags(list(flags or []))
    document = DeployFile.read(deploy) if deploy is not None else None

    if pipeline is not None:
        name, origin = pipeline, Origin("--pipeline", Layer.CLI)
    elif document is not None and "pipeline" in document.data:
        name, origin = document.data["pipeline"], document.origin(("pipeline",))
        if not isinstance(name, str):
            raise ConfigError("pipeline must be a string naming a pipeline", origin=str(origin))
    elif document is not None:
        raise ConfigError(
            "the deploy file does not say which pipeline it deploys",
            origin=document.label,
            hint='add pipeline = "NAME" at the top (see `omni plugins list`), '
            "or pass --pipeline NAME",
        )
    else:
        raise UsageError(
            "nothing to deploy: give a deploy file or --pipeline NAME",
            hint="e.g. omni plan examples/qwen3_tts.toml, or omni plan --pipeline qwen3-tts",
        )
    try:
        pipeline_cls = plugins.pipeline(name)
    except PluginError as exc:
        raise type(exc)(exc.message, origin=str(origin), hint=exc.hint) from None

    schema = PathSchema(pipeline_cls, _defaults(pipeline_cls, plugins))
    counter = [0]
    patches = FileSource(document, schema, counter).collect() if document else []
    patches += flag_patches(pairs, schema, counter)
    resolution = resolve(
        pipeline_cls,
        patches,
        schema=schema,
        deploy_file=document.label if document else None,
    )
    check_outside(resolution, plugins)
    return resolution


def _defaults(pipeline_cls: type[PipelineConfig], plugins: OmniPlugins) -> PipelineConfig:
    """The pipeline as its plugin declares it; a bad declaration is the plugin's error."""
    try:
        return pipeline_cls()
    except ValidationError as exc:
        name = pipeline_cls.pipeline_name
        owner = _owner(pipeline_cls, plugins)
        raise PluginError(
            f"pipeline {name!r} of plugin {owner!r} declares defaults its own schema refuses:\n  "
            + validation_message(exc, _stage_names(pipeline_cls)).replace("\n", "\n  "),
            hint=f"this is a bug in plugin {owner!r}: fix its pipeline class, or uninstall it",
        ) from None
    except PydanticUserError as exc:  # schemas are built on first use (defer_build)
        owner = _owner(pipeline_cls, plugins)
        raise PluginError(
            f"pipeline {pipeline_cls.pipeline_name!r} of plugin {owner!r} declares a "
            f"setting pydantic cannot validate: {exc.message}",
            hint=f"this is a bug in plugin {owner!r}: fix its pipeline class, or uninstall it",
        ) from None


def _owner(pipeline_cls: type[PipelineConfig], plugins: OmniPlugins) -> str:
    return next(
        (r.plugin for r in plugins.pipelines().values() if r.value is pipeline_cls),
        "?",
    )


def _stage_names(pipeline_cls: type[PipelineConfig]) -> list[str]:
    try:
        return [stage.name for stage in pipeline_cls.default_stages()]
    except Exception:  # the stages themselves are what is broken
        return []
