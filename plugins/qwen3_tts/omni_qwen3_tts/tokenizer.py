"""The Qwen text tokenizer, built from the checkpoint's ``vocab.json`` + ``merges.txt``.

The release ships the slow-tokenizer files (no ``tokenizer.json``), so we
assemble the equivalent fast tokenizer with the ``tokenizers`` package:
NFC normalisation, Qwen2's pre-tokenisation regex, byte-level BPE, and the
special tokens listed in ``tokenizer_config.json`` (``added_tokens_decoder``)
matched whole before BPE. If a ``tokenizer.json`` is present it is used as is.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

# Qwen2's pre-tokenisation pattern (contractions, letters, single digits, punctuation, spaces).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


class TextTokenizer:
    """Encode text to Qwen token ids (special tokens such as ``<|im_start|>`` included)."""

    def __init__(self, tokenizer: Tokenizer):
        self._tok = tokenizer

    @classmethod
    def from_dir(cls, path: str | Path) -> TextTokenizer:
        root = Path(path)
        if (root / "tokenizer.json").is_file():
            return cls(Tokenizer.from_file(str(root / "tokenizer.json")))
        vocab, merges = root / "vocab.json", root / "merges.txt"
        missing = [p.name for p in (vocab, merges) if not p.is_file()]
        if missing:
            raise FileNotFoundError(
                f"{root}: the text tokenizer needs {' and '.join(missing)} "
                "(or a tokenizer.json); copy them from the checkpoint"
            )
        bpe = models.BPE.from_file(str(vocab), str(merges))
        tok = Tokenizer(bpe)
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        tok.decoder = decoders.ByteLevel()
        config_path = root / "tokenizer_config.json"
        if config_path.is_file():
            config = json.loads(config_path.read_text(encoding="utf-8"))
            added = config.get("added_tokens_decoder") or {}
            for index in sorted(added, key=int):
                spec = added[index]
                token = AddedToken(
                    spec["content"],
                    single_word=spec.get("single_word", False),
                    lstrip=spec.get("lstrip", False),
                    rstrip=spec.get("rstrip", False),
                    normalized=spec.get("normalized", False),
                    special=spec.get("special", True),
                )
                tok.add_special_tokens([token]) if token.special else tok.add_tokens([token])
                got = tok.token_to_id(spec["content"])
                if got != int(index):
                    raise ValueError(
                        f"{config_path}: added token {spec['content']!r} is declared as id {index} "
                        f"but the vocabulary places it at {got}"
                    )
        return cls(tok)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)

    def special_tokens(self) -> dict[int, str]:
        """The special tokens (chat markers, media pads) by id: never part of an answer's text."""
        added = self._tok.get_added_tokens_decoder()
        return {i: token.content for i, token in added.items() if token.special}

    def special_ids(self) -> set[int]:
        return set(self.special_tokens())
