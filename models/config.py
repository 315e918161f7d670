"""Model configuration: one frozen dataclass whose field names follow Hugging Face's `LlamaConfig`.

Speaking the same words as the checkpoints' `config.json` lets users (and the loader) move between
the two without a translation table. Qwen2 (q/k/v bias) and Qwen3 (per-head q/k RMSNorm) are flags.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
_ROPE_TYPES = ("default", "llama3", "linear")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture of a decoder-only Llama-family transformer (Llama, Mistral, Qwen2, Qwen3)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None = None  # None: same as num_attention_heads (plain MHA)
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    # None, or a mapping like HF's: {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
    # "high_freq_factor": 4.0, "original_max_position_embeddings": 8192} or {"rope_type": "linear", "factor": 2.0}
    rope_scaling: Mapping[str, Any] | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: bias on q/k/v projections
    qk_norm: bool = False  # Qwen3: RMSNorm over each head's q and k before RoPE
    mlp_bias: bool = False
    hidden_act: str = "silu"
    dtype: str = "float32"  # dtype of params and activations; logits are always float32
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None

    def __post_init__(self):
        def positive(name):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")

        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "max_position_embeddings"):
            positive(name)
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        positive("num_key_value_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"ModelConfig.num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads}) for grouped-query attention")
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(
                    f"ModelConfig.hidden_size ({self.hidden_size}) is not divisible by num_attention_heads "
                    f"({self.num_attention_heads}); set head_dim explicitly")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        positive("head_dim")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even for rotary embeddings, got {self.head_dim}")
        if not self.rope_theta > 0:
            raise ValueError(f"ModelConfig.rope_theta must be > 0, got {self.rope_theta!r}")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"ModelConfig.rms_norm_eps must be > 0, got {self.rms_norm_eps!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"ModelConfig.dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if self.hidden_act not in ("silu", "swish"):
            raise ValueError(f"ModelConfig.hidden_act {self.hidden_act!r} is not supported; use 'silu'")
        if self.rope_scaling is not None:
            scaling = dict(self.rope_scaling)
            rope_type = scaling.get("rope_type", scaling.get("type", "default"))
            if rope_type not in _ROPE_TYPES:
                raise ValueError(f"ModelConfig.rope_scaling rope_type {rope_type!r} is not supported; "
                                 f"choose one of {_ROPE_TYPES}")
            if rope_type in ("llama3", "linear") and not float(scaling.get("factor", 0)) > 0:
                raise ValueError("ModelConfig.rope_scaling needs a positive 'factor'")
            # Freeze to a hashable tuple-of-pairs so configs can key compile caches.
            object.__setattr__(self, "rope_scaling", _FrozenDict(scaling))
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(self, name)
            if value is not None and not (0 <= int(value) < self.vocab_size):
                raise ValueError(f"ModelConfig.{name}={value} is outside the vocabulary [0, {self.vocab_size})")

    @property
    def jnp_dtype(self):
        return _DTYPES[self.dtype]

    @property
    def num_params(self) -> int:
        """Parameter count (embeddings counted once when tied)."""
        d, f, v, L = self.hidden_size, self.intermediate_size, self.vocab_size, self.num_hidden_layers
        hq, hk, hd = self.num_attention_heads, self.num_key_value_heads, self.head_dim
        attn = d * hq * hd + 2 * d * hk * hd + hq * hd * d
        if self.attention_bias:
            attn += hq * hd + 2 * hk * hd
        if self.qk_norm:
            attn += 2 * hd
        mlp = 3 * d * f + (2 * f + d if self.mlp_bias else 0)
        per_layer = attn + mlp + 2 * d
        emb = v * d * (1 if self.tie_word_embeddings else 2)
        return L * per_layer + emb + d

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        if self.rope_scaling is not None:
            out["rope_scaling"] = dict(self.rope_scaling)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ModelConfig":
        """Build from a dict such as HF's config.json; unknown keys are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        if "torch_dtype" in data and "dtype" not in data and data["torch_dtype"] in _DTYPES:
            kwargs["dtype"] = data["torch_dtype"]
        if isinstance(kwargs.get("eos_token_id"), (list, tuple)):
            kwargs["eos_token_id"] = kwargs["eos_token_id"][0]
        return cls(**kwargs)


class _FrozenDict(dict):
    """A dict that is hashable (by its sorted items) so a config holding it can key jit caches."""

    def __hash__(self):
        return hash(tuple(sorted((k, repr(v)) for k, v in self.items())))

    def _immutable(self, *args, **kwargs):
        raise TypeError("rope_scaling is frozen")

    __setitem__ = __delitem__ = update = pop = popitem = setdefault = clear = _immutable
