"""smcsd: fast decoding of large language models with a small draft model in JAX.

`smcsd.decode(prompt, target=..., draft=..., method=...)` runs one of the registered methods:
`ar` (exact autoregressive reference), the exact speculative baselines, and SMC speculative decoding.
"""

from . import ar as _ar  # noqa: F401  (registers "ar")
from .decode import available_methods, decode
from .sampling import SamplingParams, process_logits
from .stats import DecodeResult, DecodeStats

__version__ = "0.1.0"

__all__ = ["DecodeResult", "DecodeStats", "SamplingParams", "available_methods", "decode", "process_logits"]
