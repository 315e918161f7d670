"""Tokenizers with one interface: a byte-level tokenizer (the shipped models') and a thin wrapper over
the `tokenizers` package for Hugging Face `tokenizer.json` files."""

from __future__ import annotations

import json
import os
from typing import Iterable, Sequence


class ByteTokenizer:
    """UTF-8 bytes 0..255 plus BOS=256, EOS=257, PAD=258 (vocab 259). Lossless for any text."""

    bos_id = 256
    eos_id = 257
    pad_id = 258
    vocab_size = 259

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        ids = list(text.encode("utf-8"))
        return [self.bos_id] + ids if add_bos else ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        data = bytearray()
        for i in ids:
            i = int(i)
            if i < 256:
                data.append(i)
            elif not skip_special_tokens:
                data.extend({256: b"<s>", 257: b"</s>", 258: b"<pad>"}.get(i, b"?"))
        return data.decode("utf-8", errors="replace")

    def to_dict(self) -> dict:
        return {"type": "byte"}

    def __repr__(self):
        return "ByteTokenizer(vocab_size=259)"


class HFTokenizer:
    """`tokenizer.json` (Hugging Face `tokenizers`) behind the same interface as `ByteTokenizer`."""

    def __init__(self, path: str, bos_token: str | None = None, eos_token: str | None = None):
        try:
            from tokenizers import Tokenizer
        except ImportError as e:  # pragma: no cover - tokenizers is a core dependency
            raise ImportError("HFTokenizer needs the `tokenizers` package: pip install tokenizers") from e
        file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        if not os.path.isfile(file):
            raise FileNotFoundError(f"tokenizer file not found: {file}")
        self.path = file
        self._tok = Tokenizer.from_file(file)
        cfg = _read_tokenizer_config(os.path.dirname(file))
        self.bos_id = self._special_id(bos_token or cfg.get("bos_token"), ("<s>", "<|begin_of_text|>", "<bos>"))
        self.eos_id = self._special_id(eos_token or cfg.get("eos_token"),
                                       ("</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>", "<|im_end|>"))
        self.pad_id = self._special_id(cfg.get("pad_token"), ("<pad>", "<|pad|>"))
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def _special_id(self, token, fallbacks: Sequence[str]):
        if isinstance(token, dict):
            token = token.get("content")
        for t in ([token] if token else []) + list(fallbacks):
            i = self._tok.token_to_id(t)
            if i is not None:
                return i
        return None

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return [self.bos_id] + ids if add_bos and self.bos_id is not None else list(ids)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def to_dict(self) -> dict:
        return {"type": "hf", "path": self.path}

    def __repr__(self):
        return f"HFTokenizer({self.path!r}, vocab_size={self.vocab_size})"


def _read_tokenizer_config(directory: str) -> dict:
    path = os.path.join(directory, "tokenizer_config.json")
    if os.path.isfile(path):
        with open(path) as f:
            return json.load(f)
    return {}
