"""Step 1: a pipeline. Its topology lives here, in code, and nowhere else."""

from __future__ import annotations

from typing import ClassVar

from omni_core import FactoryArgs, PipelineConfig, StageConfig


class ShoutArgs(FactoryArgs):
    """Typed ``factory.*`` settings of the shout stage (deploy files may set them)."""

    suffix: str = "!"


class HelloPipeline(PipelineConfig):
    pipeline_name: ClassVar[str] = "hello"
    aliases: ClassVar[tuple[str, ...]] = ("HelloWorldForCausalLM",)
    description: ClassVar[str] = "greets, then shouts: a two-process example pipeline"
    entry_stage: ClassVar[str] = "greet"
    # What `omni serve` and `omni run --prompt` answer: chat, its text from "shout".
    api: ClassVar[tuple[str, ...]] = ("chat",)
    text_stage: ClassVar[str | None] = "shout"

    @classmethod
    def default_stages(cls) -> list[StageConfig]:
        return [
            StageConfig(
                name="greet",
                factory_path="omni_hello.stages:create_greet",
                next="shout",
                process="front",
                author_kwargs={"greeting": "hello"},  # the author channel
            ),
            StageConfig(
                name="shout",
                factory_path="omni_hello.stages:create_shout",
                terminal=True,
                process="back",
                gpu=0,
                factory=ShoutArgs(),  # the config channel
            ),
        ]
