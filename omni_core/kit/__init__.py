"""The speech-pipeline kit: what every speech/omni model plugin would otherwise repeat.

A model family should cost only its differences. The shapes the Qwen3-TTS,
MOSS-TTS and Qwen3-Omni plugins each wrote for themselves live here once:

- :mod:`.source` (torch-free): where a model's files come from, a preset
  (configs only, for ``load_format = "dummy"``), a local checkpoint
  directory or a hub id, and what the stages would refuse in it, said at
  plan time (:class:`~.source.ModelSource`);
- :mod:`.pipeline` (torch-free): the TTS-style topology (preprocessing ->
  engine -> vocoder, :func:`~.pipeline.tts_stages`; a whole
  :class:`~.pipeline.TTSPipeline` class; any straight line of stages with
  :func:`~.pipeline.chain`), the factory arguments those stages share, and
  :class:`~.pipeline.SourceChecks`, the ``PipelineConfig`` hooks that run a
  :class:`~.source.ModelSource`'s checks;
- :mod:`.plugin` (torch-free): the entry-point module's hooks
  (:class:`~.plugin.ModelPlugin`: pipelines by name, memory estimates,
  wire types);
- :mod:`.memory` (torch-free): estimates read from a stage's config;
- :mod:`.config` (torch-free): a release's JSON into frozen dataclasses
  (known keys, nulls as defaults, rotary settings under either spelling,
  the special ids of Qwen's tokenizer that families built on it inherit);
- :mod:`.batching` (anyio only): an encoder stage's concurrent requests
  coalesced into one call of its batched function;
- :mod:`.weights` (torch, stage processes only): strict safetensors loading
  by name or prefix, every mismatch named; a module filled from a directory
  or with dummy weights through the weight-sharing seam;
- :mod:`.stages` (stage processes only): an engine stage factory's
  standard signature declared once (:func:`~.stages.engine_factory`), the
  device a stage was placed on, an engine's settings under its placement
  share, a tensor-parallel group,
  a preprocessing stage run in a worker thread behind its field and token
  checks, typed request fields.

Why in the core and not a package of its own: every plugin already depends
on ``omni-core``, so the kit adds no distribution to install, version or
keep in step, and it can follow the schema it builds on (``StageConfig``,
``FactoryArgs``, ``SourceProblem``) in the same commit. The core's promise
that ``omni config``/``omni plan``/``omni plugins list`` import no ML
framework is kept by the split above: this package's ``__init__`` imports
nothing, the plan-time modules import no torch or numpy, and the
stage-side modules (which import torch, if at all, inside their functions)
are imported only by stage factories, inside stage processes
(``tests/kit/test_light.py`` checks the imports). The kit knows no plugin:
model code (layers, codecs) stays with the families that share it.
"""
