"""Engine backends: continuous batching, KV cache, sampling and streaming for engine stages.

The model supplies a :class:`~omni_core.engine.interface.StepModel`; the
backend supplies scheduling, the cache and sampling. Modules:

* ``interface`` (no torch): the contract, :class:`EngineSettings`, errors;
* ``backends`` (no torch): backends by name, ``validate_engine_settings``
  (run by the planner), ``create_engine``;
* ``budget`` (no torch): how many cache slots of how many positions;
* ``kv_cache``, ``sampling``, ``torch_engine``, ``toy_model`` (torch): imported
  only inside the child process that runs an engine stage.

This package's ``__init__`` imports nothing, so the planner can import the
light modules without torch.
"""
