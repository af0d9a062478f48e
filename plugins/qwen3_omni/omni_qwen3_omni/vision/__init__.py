"""Qwen3-Omni's vision half: image preprocessing (``processor``) and the ViT tower (``encoder``).

Import the submodules directly. This package imports nothing on its own so the
prompt builder can ask for token counts (``processor.image_token_count``)
without loading torch.
"""
