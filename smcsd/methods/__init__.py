"""The decoding methods, one file each; importing this package registers them all (`smcsd.runtime.METHODS`).

- `ar`: exact autoregressive decoding, the reference every speed-up is measured against;
- `sd`: exact speculative decoding with one chain of K drafted tokens (and the cycle pieces the chain methods share);
- `sd_multi`: exact, N chains per request verified together with recursive rejection sampling;
- `sd_tree`: exact speculative decoding over a token tree (D²SD's variable-prefix branches, or a product tree);
- `smc`: SMC speculative decoding — N particles drafted in parallel, scored in one target call, importance
  resampled, no rollback (approximate, consistent as N grows);
- `flex`: FlexDraft's exact one-model drafting (mask adapters the target drafts with);
- `sd_overlap`: MineDraft's overlapped `sd` (two half-batches on two device groups, drafting beside verifying).

Each file builds its program and registers a `smcsd.runtime.MethodDef` naming everything `decode` needs to shape a
call to it (docs/methods.md, "How decode reaches a method").
"""

from . import ar, sd, sd_multi, sd_tree, smc, flex, sd_overlap  # noqa: F401  (each registers its methods)

__all__ = ["ar", "sd", "sd_multi", "sd_tree", "smc", "flex", "sd_overlap"]
