"""``GET /v1/deployment`` and ``GET /v1/deployment.svg``: what is deployed, for people and pages.

Why: ``/health`` says how each process is doing but not how the stages are
wired, which GPU each process holds, or what the pipeline answers. The
playground draws the deployment from these two (the SVG is
:func:`omni_core.plan.picture.plan_svg` of the running plan, with empty
live lines the page fills from ``/health`` every second), and any client may
read them too. Both sit behind the API key like every route but ``/health``.

The JSON is the plan's shape, trimmed to what a client can use: process
names, their stages, GPU and replica; stage instances; GPUs; edges with
their transports. Host paths (the model directory, sockets, the run
directory) and the children's environment stay out of both: they help no
client and describe the host. The model is named as ``/v1/models`` names it
(see :func:`.service.public_model_name`); the start-up output has the path.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

PATH = "/v1/deployment"
SVG_PATH = "/v1/deployment.svg"


def deployment_view(plan: Any, service: Any) -> dict[str, Any]:
    """The deployment as ``GET /v1/deployment`` answers it."""
    serving = service.serving
    return {
        "object": "deployment",
        "pipeline": serving.pipeline,
        "model": service.model_id,
        "api": list(serving.api),
        "outputs": {
            "text": serving.text_stage is not None,
            "audio": serving.audio_stage is not None,
        },
        "sample_rate": serving.sample_rate,
        # what /v1/audio/speech does with ``input``: "read" it aloud or "answer" it aloud
        "speech_input": serving.speech_input,
        "policy": plan.policy,
        "inventory": plan.inventory.describe(),
        "processes": [
            {
                "name": p.name,
                "logical": p.logical,
                "stages": list(p.stages),
                "gpu": p.gpu,
                "replica": p.replica,
                "num_replicas": p.num_replicas,
                "tp_rank": p.tp_rank,
                "tp_size": p.tp_size,
                "node": getattr(p, "node", None),  # multi-node plans: the host it runs on
            }
            for p in plan.processes
        ],
        "stages": [
            {
                "instance": s.instance,
                "stage": s.stage,
                "process": s.process,
                "tp_processes": list(s.tp_processes),
                "gpus": list(s.gpus),
            }
            for s in plan.stages
        ],
        "gpus": {
            str(gpu): {
                "memory_bytes": usage.memory_bytes,
                "processes": list(usage.processes),
                "stages": list(usage.stages),
            }
            for gpu, usage in sorted(plan.gpus.items())
        },
        "edges": [e.to_dict() for e in plan.edges],
    }


class DeploymentPages:
    """The two endpoints over one running plan; the SVG is drawn once, on first request."""

    def __init__(self, plan: Any, service: Any):
        self.plan, self.service = plan, service
        self._svg: str | None = None

    async def json(self, request: Request) -> Response:
        return JSONResponse(deployment_view(self.plan, self.service))

    async def svg(self, request: Request) -> Response:
        if self._svg is None:
            from ...plan.picture import plan_svg

            self._svg = plan_svg(self.plan, model=self.service.model_id)
        return Response(
            self._svg,
            media_type="image/svg+xml",
            headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"},
        )
