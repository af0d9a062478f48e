"""The talker: speech codes from the thinker's text, one 16-code frame per step.

``config`` parses ``talker_config`` (and the root ids it needs), ``model``
holds the module tree the release's ``talker.*`` tensors load into (the code
predictor is Qwen3-TTS's, shared), ``prompt`` turns what the thinker streams
into the talker's inputs, and ``step`` drives it from the engine.
Kept import-light: nothing is imported here, so planning code can reach the
package without loading torch.
"""
