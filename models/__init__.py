"""Flax Llama-family models, the fixed-shape KV cache, and tokenizers."""

from .cache import KVCache, init_cache
from .config import ModelConfig
from .gguf import from_gguf
from .hf import from_pretrained, save_pretrained
from .lm import LanguageModel, ancestor_mask, forward_cached, forward_full, forward_tree, init_model
from .sharded_load import load_sharded
from .tokenizer import ByteTokenizer, HFTokenizer
from .transformer import Transformer

__all__ = [
    "ByteTokenizer", "HFTokenizer", "KVCache", "LanguageModel", "ModelConfig", "Transformer",
    "ancestor_mask", "forward_cached", "forward_full", "forward_tree", "init_cache", "init_model",
    "from_gguf", "from_pretrained", "load_sharded", "save_pretrained",
]
