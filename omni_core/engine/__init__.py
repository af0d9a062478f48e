"""Engine backends: continuous batching, KV cache, sampling and streaming for engine stages.

Imported only inside the child process that runs an engine stage (it needs
torch). The model supplies a :class:`~omni_core.engine.interface.StepModel`;
the backend supplies scheduling, the cache and sampling.
"""
