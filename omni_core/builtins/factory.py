"""Default stage construction: import ``factory_path`` and call it."""

from __future__ import annotations

from typing import Any

from ..factory import StageContext, build_from_factory
from ..hookspecs import hookimpl


@hookimpl(trylast=True)
def omni_build_stage(stage: Any, pipeline: Any, context: StageContext) -> Any:
    return build_from_factory(stage, pipeline, context)
