"""Pairs and their drafters: `smcsd.load(pair, drafter=None)` and `smcsd.available_drafters(pair)`.

A pair is a target plus the drafters made for it. The targets come from `models.registry` (the shipped toys,
the fetchable SmolLM2); the drafters are:
- model drafters shipped in the package: `models/shipped/<pair>/draft/` is the pair's `ar` drafter and
  `models/shipped/<pair>/drafters/<name>/` holds the others (`ar-distilled`, later `dflash`, `pard2`, ...), each a
  checkpoint directory (config.json + model.safetensors, as `experiments/train/pair.py` and `smcsd.train` export);
- parameter-free drafters that work with any target: `prompt-lookup`.
Names say the kind: `ar`, `ar-distilled`, `prompt-lookup`, `dflash`, `dflash-dpace`, `dflash-distilled` (a DFlash
drafter trained on the target's own continuations, `experiments/train/code_continuations.py`), `d2sd` (a `D2SDDrafter`: its
variable-prefix network with a `d2sd.json` naming the main block drafter), `pard2` (a `PARD2Drafter`), `dels` (a
`DeLSDrafter`: a DeLS-Spec local head with a `dels.json` naming the block drafter it is fused with), `specblock`
(a `SpecBlockDrafter`), `eagle` (an `EagleDrafter`: EAGLE-3, in the EAGLE / SpecForge checkpoint layout), ...
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable

from smcsd.models.registry import FETCHABLE, available_models, load_pair as _load_target_pair, load_target
from smcsd.models.shipped import SHIPPED_DIR, load_model_dir

from .drafters import (DFlashDrafter, D2SDDrafter, EagleDrafter, FlexDrafter, DeLSDrafter, LocalHead, PARD2Drafter,
                       PromptLookup, SpecBlockDrafter)


@dataclasses.dataclass(frozen=True)
class DrafterEntry:
    """One drafter name a pair may ship: what it is for (`role`) and how it loads. `load(pair, name, target)` returns
    the drafter bound to `target`; a parameter-free one (`shipped=False`) works with any target and has no directory."""

    name: str
    role: str  # "model" (an AR language model), "smc-proposal", "block", "eagle", "tree", "mask", "fused", "flex",
    #            "param-free"
    load: Callable
    shipped: bool = True  # lives in models/shipped/<pair>/ (else parameter-free: every pair has it)


def drafter_dir(pair: str, name: str) -> str | None:
    path = os.path.join(SHIPPED_DIR, pair, "draft") if name == "ar" else os.path.join(SHIPPED_DIR, pair, "drafters", name)
    return path if os.path.isfile(os.path.join(path, "config.json")) else None


def _check_pair(pair) -> str:
    if not isinstance(pair, str):
        raise TypeError(f"pair must be a name (str), got {type(pair).__name__}")
    if pair not in available_models():
        raise ValueError(f"unknown model pair {pair!r}; available: {', '.join(available_models())}")
    return pair


def _load_model(pair: str, name: str, target):
    """An AR drafter: the shipped toy's own draft, else a `LanguageModel` checkpoint sharing the target's tokenizer."""
    if name == "ar" and pair not in FETCHABLE:
        return _load_target_pair(pair)[1]
    return _model_dir(drafter_dir(pair, name), f"{pair}/{name}", target, pair in FETCHABLE)


def _model_dir(path: str, name: str, target, cast: bool):
    model = load_model_dir(path, name=name)
    model = dataclasses.replace(model, tokenizer=target.tokenizer)  # one vocabulary: the target's tokenizer
    if model.config.vocab_size != target.config.vocab_size:
        raise ValueError(f"drafter {name} has vocab_size {model.config.vocab_size}, the target "
                         f"{target.config.vocab_size}: the checkpoint does not belong to this target")
    if cast and model.config.dtype != target.config.dtype:
        model = model.astype(target.config.dtype)
    return model


def _load_proposal(pair: str, name: str, target):
    """A pair's SMC proposal: an AR `LanguageModel` fine-tuned for smc, or an EAGLE-3 head (its config.json names the
    EAGLE architecture) trained with a Rényi objective (`experiments/train/eagle.py --renyi-weight`)."""
    return load_proposal_dir(drafter_dir(pair, name), target, name=f"{pair}/{name}")


def load_proposal_dir(path: str, target, name: str | None = None):
    """A drafter checkpoint directory that is not (yet) shipped, e.g. a proposal a training run wrote: an EAGLE-3
    head (its config.json names the EAGLE architecture) as an `EagleDrafter`, else an AR `LanguageModel` sharing the
    target's tokenizer; bound to / checked against `target` (a checkpoint of another vocabulary raises)."""
    import json
    cfg = os.path.join(str(path), "config.json")
    if not os.path.isfile(cfg):
        raise ValueError(f"{path!r} is not a drafter checkpoint directory (it has no config.json)")
    name = name or os.path.basename(os.path.normpath(str(path)))
    with open(cfg) as f:
        arch = json.load(f).get("architectures") or []
    if any("Eagle" in a for a in arch):
        return EagleDrafter.load(str(path), dtype=target.config.dtype, name=name).bind(target)
    return _model_dir(str(path), name, target, cast=True)


def _loader(cls, **kw):
    """A checkpoint-directory drafter class's loader: `cls.load(dir, dtype=, name=).bind(target)` (the bind raises
    if the checkpoint does not fit the target)."""
    def load(pair, name, target):
        extra = {"tokenizer": target.tokenizer} if kw.get("tokenizer") else {}
        dtype = {} if kw.get("own_dtype") else {"dtype": target.config.dtype}
        return cls.load(drafter_dir(pair, name), name=f"{pair}/{name}", **dtype, **extra).bind(target)
    return load


# The registry, best first within a role: `load(pair)` without a drafter falls back to the first "model" drafter
# the pair has, and `available_drafters` lists the shipped ones in this order, then the parameter-free ones.
DRAFTERS: tuple[DrafterEntry, ...] = (
    DrafterEntry("ar-distilled", "model", _load_model),
    DrafterEntry("ar", "model", _load_model),
    DrafterEntry("smc-proposal", "smc-proposal", _load_proposal),  # drafters fine-tuned for SMC (χ² / Rényi)
    DrafterEntry("dflash-distilled", "block", _loader(DFlashDrafter)),  # trained on the target's own continuations
    DrafterEntry("dflash-dpace", "block", _loader(DFlashDrafter)),
    DrafterEntry("dflash", "block", _loader(DFlashDrafter)),
    DrafterEntry("specblock", "block", _loader(SpecBlockDrafter)),
    DrafterEntry("eagle", "eagle", _loader(EagleDrafter)),  # EAGLE-3 heads, EAGLE / SpecForge checkpoint layout
    DrafterEntry("d2sd", "tree", lambda pair, name, target: _load_d2sd(pair, name, target)),
    DrafterEntry("pard2", "mask", _loader(PARD2Drafter, tokenizer=True)),
    DrafterEntry("dels", "fused", lambda pair, name, target: _load_fused(pair, name, target)),
    DrafterEntry("flex", "flex", _loader(FlexDrafter, own_dtype=True)),  # mask adapters the target drafts with
    DrafterEntry("prompt-lookup", "param-free", lambda pair, name, target: PromptLookup(), shipped=False),
)
ENTRIES: dict[str, DrafterEntry] = {e.name: e for e in DRAFTERS}


def names_of_role(*roles: str) -> tuple[str, ...]:
    """The registry's drafter names of these roles, best first (e.g. `names_of_role("model")`)."""
    return tuple(e.name for e in DRAFTERS if e.role in roles)


MODEL_DRAFTERS = names_of_role("model")  # what load(pair) falls back to, best first
PARAM_FREE = {e.name: (lambda e=e: e.load(None, e.name, None)) for e in DRAFTERS if not e.shipped}


def available_drafters(pair: str = "tiny-code") -> list[str]:
    """Drafter names `load(pair, drafter=...)` accepts, the pair's best model drafter first."""
    _check_pair(pair)
    return [e.name for e in DRAFTERS if e.shipped and drafter_dir(pair, e.name)] \
        + sorted(e.name for e in DRAFTERS if not e.shipped)


def load(pair: str = "tiny-code", drafter: str | None = None, dtype: str | None = None):
    """`(target, drafter)` of a pair. `drafter=None` gives the pair's default drafter: the one its
    `decode_defaults.json` measured fastest on this backend (`smcsd.defaults.default_drafter`), else its best model
    drafter (None when it has none, so `decode` runs `ar`); a name from `available_drafters(pair)` gives that one. Model drafters come back as
    their `LanguageModel` (what `decode(draft=...)` wraps in `ARDrafter`), the others as their `Drafter` bound to the
    target (`DRAFTERS` says how each name loads).
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
    return target, ENTRIES[drafter].load(pair, drafter, target)


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


def pair_drafter(target, name: str):
    """(target, its pair's drafter `name`) or None when the target's pair has no such drafter (a method's
    `pair_draft` when decode is called without draft=; a target of None loads the default pair's)."""
    from .defaults import identify
    pair = "tiny-code" if target is None else identify(target)[0]
    if pair is None or name not in available_drafters(pair):
        return None
    dtype = target.config.dtype if target is not None and pair in FETCHABLE else None  # shipped toys: their own
    t, drafter = load(pair, drafter=name, dtype=dtype)
    return (t if target is None else target), drafter
