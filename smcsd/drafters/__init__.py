"""Drafters: a layer of their own (DESIGN.md, "Drafters"). One kind per file, behind `base.Drafter`.

- `ARDrafter(model)`: a small autoregressive model (a `LanguageModel` passed as `draft=` is wrapped in it).
- `PromptLookup()`: n-gram lookup in the prompt and output so far, no params.
- `DFlashDrafter` (DFlash): a block of drafts from one forward over [anchor, MASK x (B-1)], conditioned on the
  target's hidden states.
- `D2SDDrafter` (D²SD): a block drafter's chain plus branches re-anchored by a variable-prefix block drafter where
  rejection is likely, verified as one tree by `sd-tree` (tree shapes: `TreeSpec`, drafters/tree.py).
- `DeLSDrafter` (DeLS-Spec): a block drafter fused with a `LocalHead` (a GRU over the block's drafted tokens) that
  restores left-to-right dependence inside the block.
- `SpecBlockDrafter` (SpecBlock): S dependent positions per forward (slot queries, layer-wise shift), blocks
  chained from the drafter's own hidden state.
- `FlexDrafter` (FlexDraft): mask-token adapters that let the target draft for itself inside its own verification
  forward (method `flex`).
- `PARD2Drafter` (PARD-2): a small causal LM drafting K tokens in one forward over [pending, MASK x (K-1)],
  optionally with the target's hidden states added to its inputs (dual mode).
- `EagleDrafter` (EAGLE-3): fused low / middle / high target features and the next token's embedding -> one decoder
  layer -> a head over a draft vocabulary (`DraftVocab`, FR-Spec), autoregressive over its own features; reads and
  writes EAGLE / SpecForge checkpoints.
"""

from __future__ import annotations

from .ar import ARDrafter
from .dflash import DFlashConfig, DFlashDrafter
from .d2sd import D2SDDrafter
from .eagle import EagleConfig, EagleDrafter
from .flex import FlexDrafter
from .dels import DeLSDrafter, LocalHead
from .pard2 import PARD2Drafter
from .specblock import OnlineAdapt, SpecBlockConfig, SpecBlockDrafter
from .tree import TreeSpec
from .base import Drafter, Proposal, TokenHistory, TreeProposal, initial_feed
from .prompt_lookup import PromptLookup
from .vocab import DraftVocab, stop_ids_of

KINDS = {"ar": ARDrafter, "prompt-lookup": PromptLookup, "dflash": DFlashDrafter, "d2sd": D2SDDrafter,
         "pard2": PARD2Drafter, "dels": DeLSDrafter, "specblock": SpecBlockDrafter, "flex": FlexDrafter,
         "eagle": EagleDrafter}


def as_drafter(draft):
    """A `Drafter` from what `decode(draft=...)` accepts: a Drafter, a `models.LanguageModel` (wrapped in
    `ARDrafter`), a `models.ModelConfig` (static use: building programs), or None."""
    from smcsd.models import LanguageModel, ModelConfig
    if draft is None or isinstance(draft, Drafter):
        return draft
    if isinstance(draft, (LanguageModel, ModelConfig)):
        return ARDrafter(draft)
    raise TypeError(f"draft must be a models.LanguageModel, a smcsd.drafters.Drafter (ARDrafter, PromptLookup, ...) "
                    f"or None, got {type(draft).__name__}")


__all__ = ["ARDrafter", "DFlashConfig", "DFlashDrafter", "D2SDDrafter", "DraftVocab", "Drafter", "EagleConfig",
           "EagleDrafter", "FlexDrafter", "DeLSDrafter", "LocalHead",
           "PARD2Drafter", "OnlineAdapt", "SpecBlockConfig", "SpecBlockDrafter", "TreeSpec", "KINDS", "PromptLookup", "Proposal", "TokenHistory", "TreeProposal",
           "as_drafter", "initial_feed", "stop_ids_of"]
