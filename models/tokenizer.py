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
    """A Hugging Face `tokenizers.Tokenizer` behind the same interface as `ByteTokenizer`.

    Built from a `tokenizer.json` file (`HFTokenizer(path)`), or from a `Tokenizer` object made
    elsewhere (`HFTokenizer.from_object`, e.g. from GGUF metadata). `add_bos` is the default of
    `encode(add_bos=None)`; `chat_template` (a Jinja string or None) feeds `apply_chat_template`.
    """

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
        directory = os.path.dirname(file)
        cfg = read_tokenizer_config(directory)
        self.bos_id = self._special_id(bos_token or cfg.get("bos_token"), ("<s>", "<|begin_of_text|>", "<bos>"))
        self.eos_id = self._special_id(eos_token or cfg.get("eos_token"),
                                       ("</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>", "<|im_end|>"))
        self.pad_id = self._special_id(cfg.get("pad_token"), ("<pad>", "<|pad|>"))
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        # tokenizer_config.json's add_bos_token when it says so; otherwise BOS is added when there is one.
        self.add_bos = bool(cfg.get("add_bos_token", True))
        self.chat_template = _read_chat_template(directory, cfg)

    @classmethod
    def from_object(cls, tokenizer, *, bos_id: int | None = None, eos_id: int | None = None,
                    pad_id: int | None = None, add_bos: bool = True, chat_template: str | None = None,
                    name: str = "tokenizer") -> "HFTokenizer":
        """Wrap an in-memory `tokenizers.Tokenizer` (no file behind it; `path` is `name`)."""
        self = cls.__new__(cls)
        self.path = name
        self._tok = tokenizer
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.add_bos = bool(add_bos)
        self.chat_template = chat_template
        return self

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        return self._tok.id_to_token(int(i))

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, tokenize: bool = False,
                            chat_template: str | None = None, **kwargs):
        """The prompt for a conversation (a list of {"role", "content"} dicts) under this tokenizer's chat
        template (or `chat_template=`, which overrides it), rendered as transformers does (`models.chat`).

        Returns the text, or with tokenize=True its ids, encoded without an added BOS (templates write
        their own). The template sees `bos_token`/`eos_token` (this tokenizer's strings) and `kwargs`.
        """
        from .chat import render_chat_template
        template = self.chat_template if chat_template is None else chat_template
        if template is None:
            raise ValueError(f"tokenizer {self.path!r} has no chat template (no chat_template in "
                             "tokenizer_config.json, no chat_template.jinja); pass one as chat_template=\"...\" "
                             "or set tokenizer.chat_template, or use an instruct/chat model")
        specials = {"bos_token": self._token_str(self.bos_id), "eos_token": self._token_str(self.eos_id)}
        text = render_chat_template(template, messages, add_generation_prompt=add_generation_prompt,
                                    **{**specials, **kwargs})
        return self.encode(text, add_bos=False) if tokenize else text

    @property
    def end_of_turn_ids(self) -> list[int]:
        """Stop ids for chat: the end-of-turn tokens this tokenizer's chat template writes (in the vocabulary
        and in the template text), then eos_id. Without a template: just eos_id."""
        ids: list[int] = []
        template = self.chat_template or ""
        for token in _END_OF_TURN_TOKENS + (self._token_str(self.eos_id),):
            i = self.token_to_id(token) if token and token in template else None
            if i is not None and i not in ids:
                ids.append(i)
        if self.eos_id is not None and self.eos_id not in ids:
            ids.append(self.eos_id)
        return ids

    def _token_str(self, i: int | None) -> str:
        """The string of token id `i` ("" for None), e.g. the `bos_token` a chat template writes."""
        return "" if i is None else (self._tok.id_to_token(int(i)) or "")

    def _special_id(self, token, fallbacks: Sequence[str]):
        if isinstance(token, dict):
            token = token.get("content")
        for t in ([token] if token else []) + list(fallbacks):
            i = self._tok.token_to_id(t)
            if i is not None:
                return i
        return None

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`; special tokens written in the text (e.g. `<|im_start|>`) map to their ids.
        add_bos: prepend BOS (default: the tokenizer's own `add_bos`)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        ids = self._tok.encode(text, add_special_tokens=False).ids
        add_bos = self.add_bos if add_bos is None else add_bos
        return [self.bos_id] + ids if add_bos and self.bos_id is not None else list(ids)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def to_dict(self) -> dict:
        return {"type": "hf", "path": self.path}

    def __repr__(self):
        return f"HFTokenizer({self.path!r}, vocab_size={self.vocab_size})"


# Tokens chat templates end a turn with (ChatML, Llama 3, Gemma, Phi-3, GPT-2 style, Llama 2 / Mistral).
_END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|endoftext|>", "</s>")


def read_tokenizer_config(directory: str) -> dict:
    path = os.path.join(directory, "tokenizer_config.json")
    if os.path.isfile(path):
        with open(path) as f:
            return json.load(f)
    return {}


def _read_chat_template(directory: str, cfg: dict) -> str | None:
    """The Jinja chat template of a tokenizer directory: `chat_template.jinja`, else tokenizer_config.json's
    `chat_template` (a string, or a list of named templates of which "default" is used)."""
    path = os.path.join(directory, "chat_template.jinja")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    tmpl = cfg.get("chat_template")
    if isinstance(tmpl, list):  # [{"name": ..., "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in tmpl if isinstance(t, dict)}
        tmpl = named.get("default") or next(iter(named.values()), None)
    return tmpl if isinstance(tmpl, str) else None
