"""Every hook a plugin can implement, in one place.

Plugins are modules (or objects) with functions marked ``@hookimpl`` and are
found through the ``omni`` entry-point group. Built-in behaviour (placement
policies, transports, the default stage construction) is registered through
these same hooks by internal plugins under :mod:`omni_core.builtins`, so a
third-party plugin can do anything the core does.

Which process calls which hook:

* parent (``omni plugins list``, ``omni config``, ``omni plan``, ``omni serve``):
  :func:`omni_register_pipelines`, :func:`omni_register_placement_policies`,
  :func:`omni_register_transports`, :func:`omni_register_launchers`,
  :func:`omni_estimate_memory`;
* the child process that runs a stage: :func:`omni_build_stage` (and
  :func:`omni_register_transports`, to open the transports of its edges);
* both, when a deployment starts: :func:`omni_register_wire_types`.

Registration hooks are called once per plugin-manager state and cached; they
must be cheap and must not import ML frameworks (the parent never imports
torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from .factory import StageContext
    from .launcher import Launcher
    from .lazy_pipeline import LazyPipeline
    from .placement import MemoryEstimate, PlacementPolicy
    from .schema import PipelineConfig, StageConfig
    from .transport import Transport

PROJECT_NAME = "omni"
ENTRY_POINT_GROUP = "omni"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def omni_register_pipelines() -> list[type[PipelineConfig] | LazyPipeline]:
    """Declare the pipeline classes this plugin provides.

    Return a list of :class:`~omni_core.schema.PipelineConfig` subclasses,
    or of :class:`~omni_core.LazyPipeline` (the name, aliases and import
    string of a class, imported only when that pipeline is used).
    Each class carries its ``pipeline_name``, its ``aliases`` (such as the
    Hugging Face architecture names of the checkpoints it serves) and a
    one-line ``description``. All plugins' results are collected; two plugins
    registering the same name (or alias) is an error naming both.

    Called in the parent process, when a pipeline is looked up or listed.
    """


@hookspec(firstresult=True)
def omni_build_stage(stage: StageConfig, pipeline: PipelineConfig, context: StageContext) -> Any:
    """Build the runnable object of one stage from its resolved settings.

    ``stage`` is the resolved stage, ``pipeline`` the whole resolved
    deployment, ``context`` what placement decided for this instance (GPU ids,
    memory share, replica, TP rank) plus the standard keyword arguments.
    Returns the stage object; the first non-None result wins (``firstresult``).

    The built-in implementation imports ``stage.factory_path`` and calls it
    with the author channel overlaid by the config channel. To *wrap*
    construction rather than replace it (timing, locks, logging), implement
    this hook with ``@hookimpl(wrapper=True)`` and ``yield``.

    Called inside the child process that runs the stage, once per stage, in
    declaration order.
    """


@hookspec
def omni_register_placement_policies() -> list[PlacementPolicy]:
    """Declare named placement policies (see :mod:`omni_core.placement`).

    Return a list of :class:`~omni_core.placement.PlacementPolicy` instances.
    A deploy file chooses one with ``[placement] policy = "NAME"``. Two
    plugins registering one name is an error naming both.

    Called in the parent process, when a deployment is planned or listed.
    """


@hookspec(firstresult=True)
def omni_estimate_memory(pipeline: PipelineConfig) -> dict[str, MemoryEstimate] | None:
    """Estimate the GPU memory each stage of ``pipeline`` needs.

    Return a dict from stage name to
    :class:`~omni_core.placement.MemoryEstimate` (weights by the dtype the
    stage loads in, the engine's KV budget, activations), summed over the
    stage's tensor-parallel ranks, for the stages you can estimate; or None
    when ``pipeline`` is not yours. The first non-None answer wins
    (``firstresult``), so a plugin may estimate another plugin's pipeline
    (a quantised checkpoint, say) by registering ``tryfirst=True``.

    Estimate from facts, not by loading anything: known architectures'
    parameter counts, or the checkpoint's ``config.json`` when ``model_path``
    is a local directory. :mod:`omni_core.plan.estimates` has the arithmetic.
    A stage left out makes the ``auto`` placement policy refuse, naming it.

    Called in the parent process, only when the chosen placement policy sizes
    stages itself (``PlacementPolicy.uses_estimates``); must not import torch.
    """


@hookspec
def omni_register_transports() -> list[Transport]:
    """Declare named transports (see :mod:`omni_core.transport`).

    Return a list of :class:`~omni_core.transport.Transport` instances. The
    runtime chooses one per edge of the stage graph from the plan; a deploy
    file may override the choice. Two plugins registering one name is an
    error naming both.

    Called in the parent (planning, listing) and in child processes (to open
    the edges they own).
    """


@hookspec
def omni_register_launchers() -> list[Launcher]:
    """Declare named launchers (see :mod:`omni_core.launcher`).

    Return a list of :class:`~omni_core.launcher.Launcher` instances (a
    :class:`~omni_core.launcher.LazyLauncher` keeps the cluster client out of
    ``omni plugins list``). ``runtime.launcher`` chooses one; the built-in
    ``local`` and ``ray`` are registered through this hook too.

    Called in the parent only.
    """


@hookspec
def omni_register_wire_types() -> list[type | str]:
    """Declare the classes your stages put into payloads that cross processes.

    Return classes, or ``"module:Qualname"`` strings (which import nothing
    until a message needs them). Messages between processes are decoded by an
    unpickler that builds plain data, tensors, arrays and bytes, and only the
    classes declared here (see :mod:`omni_core.wire`): declare dataclasses,
    enums and named tuples whose construction runs no code of consequence,
    never a class whose ``__reduce__`` or ``__setstate__`` does. A payload
    holding an undeclared type fails its request on the sending side, with
    the type's name.

    Called in the parent and in every child when a deployment starts; all
    plugins' results are collected.
    """
