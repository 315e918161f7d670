"""smcsd: fast decoding of large language models with a small draft model in JAX.

`smcsd.decode(prompt, target=..., draft=..., method=...)` runs one of the registered methods:
`ar` (exact autoregressive reference), the exact speculative baselines, and SMC speculative decoding.
"""

from . import methods  # noqa: F401  (registers every method: smcsd/methods/)
from .methods import AR, SD, SMC, Flex, Method, SDMulti, SDOverlap, SDTree
from .decode import available_methods, decode, prepare
from .runtime.mesh import make_mesh
from smcsd.models.registry import available_models, fetch  # noqa: E402
from . import drafters
from .drafters import ARDrafter, Drafter, PromptLookup
from .drafters.tree import TreeSpec
from .pairs import available_drafters, load
from .sampling import SamplingParams, process_logits
from .runtime.stats import DecodeResult, DecodeStats

__version__ = "0.1.0"

__all__ = ["DecodeResult", "DecodeStats", "SamplingParams", "available_methods", "decode", "prepare", "process_logits"]
__all__ += ["available_models", "fetch", "load", "available_drafters"]
__all__ += ["ARDrafter", "Drafter", "PromptLookup", "TreeSpec", "drafters"]
__all__ += ["make_mesh"]
__all__ += ["AR", "Flex", "Method", "SD", "SDMulti", "SDOverlap", "SDTree", "SMC"]
