"""The thinker's text decoder (Qwen3-MoE with multimodal rotary positions) and its position ids.

``moe`` holds the sparse expert block, ``decoder`` the decoder stack and
language-model head, ``positions`` the three-stream position ids of a prompt.
Kept import-light: nothing is imported here, so planning code can reach the
package without loading torch.
"""
