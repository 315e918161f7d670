"""The decoding methods, one file each; importing this package registers them all (`smcsd.runtime.METHODS`).

- `ar`: exact autoregressive decoding, the reference every speed-up is measured against;
- `sd`: exact speculative decoding with one chain of K drafted tokens (and the cycle pieces the chain methods share);
- `sd_multi`: exact, N chains per request verified together with recursive rejection sampling;
- `sd_tree`: exact speculative decoding over a token tree (D²SD's variable-prefix branches, or a product tree);
- `smc`: SMC speculative decoding — N particles drafted in parallel, scored in one target call, importance
  resampled, no rollback (approximate, consistent as N grows);
- `flex`: FlexDraft's exact one-model drafting (mask adapters the target drafts with);
- `sd_overlap`: MineDraft's overlapped `sd` (two half-batches on two device groups, drafting beside verifying).

Each file also defines its method as a frozen dataclass of the options that shape it (`AR`, `SD`, `SDMulti`, `SDTree`,
`SMC`, `Flex`, `SDOverlap`; smcsd/methods/base.py): `decode(prompt, method=SMC(num_particles=8))` is
`decode(prompt, method="smc", num_particles=8)`, checked when the value is built.

Each file builds its program and registers a `smcsd.runtime.MethodDef` naming everything `decode` needs to shape a
call to it (docs/methods.md, "How decode reaches a method").
"""

from . import ar, sd, sd_multi, sd_tree, smc, flex, sd_overlap  # noqa: F401  (each registers its methods)

from .ar import AR
from .base import Method
from .flex import Flex
from .sd import SD
from .sd_multi import SDMulti
from .sd_overlap import SDOverlap
from .sd_tree import SDTree
from .smc import SMC

__all__ = ["AR", "Flex", "Method", "SD", "SDMulti", "SDOverlap", "SDTree", "SMC"]
__all__ += ["ar", "sd", "sd_multi", "sd_tree", "smc", "flex", "sd_overlap"]
