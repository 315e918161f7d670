"""Pairs and their drafters: `smcsd.load(pair, drafter=None)` and `smcsd.available_drafters(pair)`.

A pair is a target plus the drafters made for it. The targets come from `models.registry` (the shipped toys,
the fetchable SmolLM2); the drafters are:
- model drafters shipped in the package: `models/shipped/<pair>/draft/` is the pair's `ar` drafter and
  `models/shipped/<pair>/drafters/<name>/` holds the others (`ar-distilled`, later `dflash`, `pard2`, ...), each a
  checkpoint directory (config.json + model.safetensors, as `experiments/train/pair.py` and `smcsd.train` export);
- parameter-free drafters that work with any target: `prompt-lookup`.
Names say the kind: `ar`, `ar-distilled`, `prompt-lookup`, `dflash`, `dflash-dpace`, `d2sd` (a `D2SDDrafter`: its
variable-prefix network with a `d2sd.json` naming the main block drafter), `pard2` (a `PARD2Drafter`), `dels` (a
`DeLSDrafter`: a DeLS-Spec local head with a `dels.json` naming the block drafter it is fused with), `specblock`
(a `SpecBlockDrafter`), `eagle` (an `EagleDrafter`: EAGLE-3, in the EAGLE / SpecForge checkpoint layout), ...
"""

from __future__ import annotations

import dataclasses
import os

from smcsd.models.registry import FETCHABLE, available_models, load_pair as _load_target_pair, load_target
from smcsd.models.shipped import SHIPPED_DIR, load_model_dir

from .drafters import (DFlashDrafter, D2SDDrafter, EagleDrafter, FlexDrafter, DeLSDrafter, LocalHead, PARD2Drafter,
                       PromptLookup, SpecBlockDrafter)

# Model drafters, best first: `load(pair)` returns the first one the pair has.
MODEL_DRAFTERS = ("ar-distilled", "ar")
SMC_PROPOSALS = ("smc-proposal",)  # AR drafters fine-tuned for SMC (χ² / Rényi); decode(method="smc") picks them
BLOCK_DRAFTERS = ("dflash-dpace", "dflash", "specblock")  # DFlashDrafter checkpoints (SpecBlock: its subclass)
BLOCK_KINDS = {"specblock": SpecBlockDrafter}
TREE_DRAFTERS = ("d2sd",)  # a variable-prefix block drafter + d2sd.json naming its main drafter
MASK_DRAFTERS = ("pard2",)  # PARD-2: a small LM + mask embedding (+ feature projection), pard2.json
FLEX_DRAFTERS = ("flex",)  # FlexDraft: mask adapters the target drafts with (method "flex")
EAGLE_DRAFTERS = ("eagle",)  # EAGLE-3 heads in the EAGLE / SpecForge checkpoint layout (smcsd/drafters/eagle.py)
FUSED_DRAFTERS = ("dels",)  # DeLS-Spec: a local head + dels.json naming the block drafter and the fusion weights
PARAM_FREE = {"prompt-lookup": PromptLookup}


def drafter_dir(pair: str, name: str) -> str | None:
    path = os.path.join(SHIPPED_DIR, pair, "draft") if name == "ar" else os.path.join(SHIPPED_DIR, pair, "drafters", name)
    return path if os.path.isfile(os.path.join(path, "config.json")) else None


def _check_pair(pair) -> str:
    if not isinstance(pair, str):
        raise TypeError(f"pair must be a name (str), got {type(pair).__name__}")
    if pair not in available_models():
        raise ValueError(f"unknown model pair {pair!r}; available: {', '.join(available_models())}")
    return pair


def available_drafters(pair: str = "tiny-code") -> list[str]:
    """Drafter names `load(pair, drafter=...)` accepts, the pair's best model drafter first."""
    _check_pair(pair)
    return [n for n in MODEL_DRAFTERS + SMC_PROPOSALS + BLOCK_DRAFTERS + EAGLE_DRAFTERS + TREE_DRAFTERS + MASK_DRAFTERS + FUSED_DRAFTERS +
                    FLEX_DRAFTERS if drafter_dir(pair, n)] \
        + sorted(PARAM_FREE)


def load(pair: str = "tiny-code", drafter: str | None = None, dtype: str | None = None):
    """`(target, drafter)` of a pair. `drafter=None` gives the pair's default drafter: the one its
    `decode_defaults.json` measured fastest on this backend (`smcsd.defaults.default_drafter`), else its best model
    drafter (None when it has none, so `decode` runs `ar`); a name from `available_drafters(pair)` gives that one. Model drafters come back as
    their `LanguageModel` (what `decode(draft=...)` wraps in `ARDrafter`), block drafters as a `DFlashDrafter` bound
    to the target, parameter-free ones as a `Drafter`.
    `dtype` applies to fetched targets (and their drafters); shipped toys load in their stored dtype."""
    _check_pair(pair)
    target = load_target(pair, dtype) if pair in FETCHABLE else _load_target_pair(pair, dtype)[0]
    names = available_drafters(pair)
    if drafter is None:  # the measured best on this backend (decode_defaults.json), else the best model drafter
        from .defaults import default_drafter
        drafter = default_drafter(pair)
        if drafter not in names:
            drafter = next((n for n in MODEL_DRAFTERS if n in names), None)
        if drafter is None:
            return target, None
    if drafter not in names:
        raise ValueError(f"pair {pair!r} has no drafter {drafter!r}; available: {', '.join(names)}")
    if drafter in PARAM_FREE:
        return target, PARAM_FREE[drafter]()
    if drafter in BLOCK_DRAFTERS:
        cls = BLOCK_KINDS.get(drafter, DFlashDrafter)
        block = cls.load(drafter_dir(pair, drafter), dtype=target.config.dtype, name=f"{pair}/{drafter}")
        return target, block.bind(target)  # raises if the checkpoint does not fit this target
    if drafter in EAGLE_DRAFTERS:
        eagle = EagleDrafter.load(drafter_dir(pair, drafter), dtype=target.config.dtype, name=f"{pair}/{drafter}")
        return target, eagle.bind(target)  # raises if the checkpoint does not fit this target
    if drafter in TREE_DRAFTERS:
        return target, _load_d2sd(pair, drafter, target)
    if drafter in FLEX_DRAFTERS:
        return target, FlexDrafter.load(drafter_dir(pair, drafter), name=f"{pair}/{drafter}").bind(target)
    if drafter in FUSED_DRAFTERS:
        return target, _load_fused(pair, drafter, target)
    if drafter in MASK_DRAFTERS:
        mask = PARD2Drafter.load(drafter_dir(pair, drafter), dtype=target.config.dtype, name=f"{pair}/{drafter}",
                                tokenizer=target.tokenizer)
        return target, mask.bind(target)
    if drafter == "ar" and pair not in FETCHABLE:
        return target, _load_target_pair(pair)[1]
    model = load_model_dir(drafter_dir(pair, drafter), name=f"{pair}/{drafter}")
    model = dataclasses.replace(model, tokenizer=target.tokenizer)  # one vocabulary: the target's tokenizer
    if model.config.vocab_size != target.config.vocab_size:
        raise ValueError(f"shipped drafter {pair}/{drafter} has vocab_size {model.config.vocab_size}, the target "
                         f"{target.config.vocab_size}: the checkpoint does not belong to this pair")
    if pair in FETCHABLE and model.config.dtype != target.config.dtype:
        model = model.astype(target.config.dtype)
    return target, model


def _named_block(pair: str, name: str, meta_file: str, key: str):
    """(metadata, path of the block drafter it names) of a drafter directory whose `meta_file` names a block drafter
    of the same pair under `key`."""
    import json
    path = drafter_dir(pair, name)
    meta_path = os.path.join(path, meta_file)
    if not os.path.isfile(meta_path):
        raise ValueError(f"{path} has no {meta_file} naming its block drafter; it is not a {name} drafter")
    with open(meta_path) as f:
        meta = json.load(f)
    main_dir = drafter_dir(pair, meta[key])
    if main_dir is None:
        raise ValueError(f"{meta_path} names block drafter {meta[key]!r}, which pair {pair!r} does not have")
    return meta, main_dir


def _load_fused(pair: str, name: str, target) -> DeLSDrafter:
    meta, block_dir = _named_block(pair, name, "dels.json", "block")
    block = DFlashDrafter.load(block_dir, dtype=target.config.dtype, name=f"{pair}/{meta['block']}")
    head = LocalHead.load(drafter_dir(pair, name), name=f"{pair}/{name}")
    return DeLSDrafter(block, head, meta.get("alpha", 0.3), meta.get("beta", 0.3), name=f"{pair}/{name}").bind(target)


def _load_d2sd(pair: str, name: str, target) -> D2SDDrafter:
    meta, main_dir = _named_block(pair, name, "d2sd.json", "main")
    main_name, path = meta["main"], drafter_dir(pair, name)
    dt = target.config.dtype
    main = DFlashDrafter.load(main_dir, dtype=dt, name=f"{pair}/{main_name}")
    vp = DFlashDrafter.load(path, dtype=dt, name=f"{pair}/{name}-vp")
    return D2SDDrafter(main, vp, name=f"{pair}/{name}").bind(target)


def target_pair(target) -> str:
    """The name of the pair a target belongs to ("tiny-code", the default pair, for None); a user's own model gives
    a name that is no pair."""
    return "tiny-code" if target is None else str(getattr(target, "name", "")).split("/")[0]


def pair_drafter(target, name: str):
    """(target, its pair's drafter `name`) or None when the target's pair has no such drafter (a method's
    `pair_draft` when decode is called without draft=; a target of None loads the default pair's)."""
    pair = target_pair(target)
    if pair not in available_models() or name not in available_drafters(pair):
        return None
    dtype = target.config.dtype if target is not None and pair in FETCHABLE else None  # shipped toys: their own
    t, drafter = load(pair, drafter=name, dtype=dtype)
    return (t if target is None else target), drafter
