"""``omni plan DEPLOY [flags] [--json]``: where every stage will run, before anything starts.

Resolves the deployment like ``omni config resolve``, detects this machine's
GPUs (NVML; "unknown" without a driver) under the deploy file's ``[cluster]``
overrides (``--gpus N --gpu-memory 80GiB`` plan for other hardware), and
prints the plan as tables or as JSON. Nothing is created on disk and no model
is loaded; an infeasible deployment exits 2 with every reason.
"""

from __future__ import annotations

import json

import typer

from ..plan import inventory_from_cluster, plan_deployment, resolve_inventory
from ._app import app
from .deployment import deployment_command


@deployment_command(app, "plan")
def plan_command(
    resolution,
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
    detect: bool = typer.Option(
        True,
        "--detect/--no-detect",
        help="Detect this machine's GPUs through NVML (default), or plan against the "
        "deploy file's [cluster] alone.",
    ),
) -> None:
    """Plan DEPLOY: placement, processes, replicas, weight sharing, MPS and endpoints."""
    config = resolution.config
    cluster = config.cluster
    inventory = resolve_inventory(cluster) if detect else inventory_from_cluster(cluster)
    plan = plan_deployment(config, inventory)
    if as_json:
        typer.echo(json.dumps(plan.to_dict(), indent=2))
        return
    from ..plan.render import render_plan

    render_plan(plan)
