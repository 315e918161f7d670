"""`FlexDrafter` (FlexDraft, arXiv 2605.20022): the target drafts for itself through attention-tuned mask tokens.

Holds what FlexDraft adds to a target (`models.flex`): mask-token adapters (own q/k/v/o projections in the last
`adapter_layers` layers, everything else shared and frozen), the mask vector, and the bonus-guided calibration MLP.
It does not propose on its own: method `flex` (smcsd/methods/flex.py) drafts and verifies in one target forward with it.
`FlexDrafter.create(target, adapter_layers=2, group_size=4)` starts from the target's own attention weights;
training (`smcsd.train.train_flex`) fits the adapters and the calibration MLP with the target frozen.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from smcsd.models import ModelConfig
from smcsd.models.flex import FlexConfig, FlexParams, init_flex_params

from .base import Drafter

MODES = ("parallel", "sequential", "auto")


@dataclasses.dataclass(frozen=True, init=False)
class FlexDrafter(Drafter):
    """FlexDraft's mask adapters for one target (module docstring)."""

    flex_config: FlexConfig
    target_config: ModelConfig
    params: FlexParams | None = dataclasses.field(compare=False, hash=False, repr=False)
    name: str = dataclasses.field(compare=False, hash=False, default="flex")
    mode: str = "auto"  # "parallel" | "sequential" | "auto" (parallel up to `switch_batch` requests)
    switch_batch: int = 4
    tau: float = 0.0  # confidence cut: verify drafts while their cumulative top-1 probability stays >= tau (0: off)
    token_budget: int | None = None  # sequential mode: drafts verified per call across the batch, packed (None: B·K)

    kind = "flex"
    supports_mesh = False
    only_method = "flex"  # its adapters draft inside the target's own forward (smcsd/methods/flex.py)

    def __init__(self, flex_config: FlexConfig, target_config: ModelConfig, params: FlexParams | None = None,
                 name: str = "flex", mode: str = "auto", switch_batch: int = 4, tau: float = 0.0,
                 token_budget: int | None = None):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if not isinstance(switch_batch, int) or isinstance(switch_batch, bool) or switch_batch < 1:
            raise ValueError(f"switch_batch must be an int >= 1, got {switch_batch!r}")
        if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0 <= tau < 1:
            raise ValueError(f"tau (the confidence cut) must be in [0, 1), got {tau!r}")
        if token_budget is not None and (not isinstance(token_budget, int) or isinstance(token_budget, bool)
                                         or token_budget < 1):
            raise ValueError(f"token_budget (drafts verified per call across the batch) must be an int >= 1 or None, "
                             f"got {token_budget!r}")
        if token_budget is not None and mode == "parallel":
            raise ValueError("token_budget packs the sequential mode's verify pass; the parallel mode does not pack "
                             "(use mode='sequential' or 'auto', or token_budget=None)")
        object.__setattr__(self, "token_budget", token_budget)
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "switch_batch", switch_batch)
        object.__setattr__(self, "tau", float(tau))
        if not isinstance(flex_config, FlexConfig):
            raise TypeError(f"FlexDrafter takes a models.flex.FlexConfig, got {type(flex_config).__name__}")
        flex_config.check(target_config)
        object.__setattr__(self, "flex_config", flex_config)
        object.__setattr__(self, "target_config", target_config)
        object.__setattr__(self, "params", params)
        object.__setattr__(self, "name", name)

    def __repr__(self):
        f = self.flex_config
        return (f"FlexDrafter({self.name!r}, adapter_layers={f.adapter_layers}, group_size={f.group_size}, "
                f"mode={self.mode!r}, tau={self.tau}, token_budget={self.token_budget})")

    @classmethod
    def create(cls, target, *, adapter_layers: int = 2, group_size: int = 4, calib_hidden: int = 256, seed: int = 0,
               std: float = 0.02, name: str = "flex") -> "FlexDrafter":
        fc = FlexConfig(adapter_layers, group_size, calib_hidden)
        return cls(fc, target.config, init_flex_params(target.config, target.params, fc, seed, std), name)

    def with_params(self, params: FlexParams) -> "FlexDrafter":
        return FlexDrafter(self.flex_config, self.target_config, params, self.name, self.mode, self.switch_batch,
                           self.tau, self.token_budget)

    _UNSET = object()

    def with_options(self, mode: str | None = None, switch_batch: int | None = None,
                     tau: float | None = None, token_budget=_UNSET) -> "FlexDrafter":
        """The same adapters run in another mode ("parallel": draft and verify in one forward; "sequential": a
        draft pass, then a verify pass; "auto": parallel up to `switch_batch` requests), with a confidence cut
        `tau` (verify drafts only while the product of their top-1 probabilities stays >= tau), or with a
        `token_budget`: the sequential mode's verify pass then packs the batch's ragged rows into one call of that
        many tokens (the most confident drafts across rows, each row's first draft before any second one; None:
        no packing)."""
        return FlexDrafter(self.flex_config, self.target_config, self.params, self.name,
                           self.mode if mode is None else mode,
                           self.switch_batch if switch_batch is None else switch_batch, self.tau if tau is None else tau,
                           self.token_budget if token_budget is FlexDrafter._UNSET else token_budget)

    def mode_for(self, batch: int) -> str:
        if self.mode != "auto":
            return self.mode
        return "parallel" if batch <= self.switch_batch else "sequential"

    @property
    def num_params(self) -> int:
        return int(sum(np.size(x) for x in jax.tree_util.tree_leaves(self.params)))

    # ------------------------------------------------------------------ host side
    def bind(self, target) -> "FlexDrafter":
        tc, mine = target.config, self.target_config
        same = dataclasses.replace(tc, dtype=mine.dtype) == mine
        if not same:
            raise ValueError("these FlexDraft adapters were made for another target (model configs differ); train "
                             "adapters for this target (smcsd.train.train_flex) or load the pair's own")
        if self.params is None:
            raise ValueError("this FlexDrafter has no params; build it with FlexDrafter.create or FlexDrafter.load")
        return self

    def drafter_params(self):
        return self.params

    @property
    def vocab_size(self) -> int:
        return self.target_config.vocab_size

    @property
    def max_tokens_per_proposal(self) -> int:
        return self.flex_config.group_size

    def describe(self) -> str:
        return f"flex:{self.name}"

    def calls_per_proposal(self, num_tokens: int) -> int:
        return 0  # drafts come out of the target's own verification forward

    def init(self, *args, **kwargs):
        raise ValueError("a FlexDrafter drafts inside the target's forward: use method='flex'")

    # ------------------------------------------------------------------ files
    def save(self, path: str, dtype: str = "float32", info: dict | None = None) -> None:
        """`config.json` (the FlexConfig and the target's config) + `flex.safetensors` (+ `training.json`)."""
        from safetensors.numpy import save_file

        from ..models.shipped import flatten_params
        if dtype not in ("float32", "bfloat16"):
            raise ValueError(f"save dtype must be 'float32' or 'bfloat16', got {dtype!r}")
        os.makedirs(path, exist_ok=True)
        tree = {"layers": {str(i): p for i, p in enumerate(self.params.layers)},
                "mask_vector": self.params.mask_vector, "calib": self.params.calib}
        flat = {k: np.asarray(v, np.float32) for k, v in flatten_params(tree).items()}
        if dtype == "bfloat16":
            import ml_dtypes
            flat = {k: v.astype(ml_dtypes.bfloat16) for k, v in flat.items()}
        save_file(flat, os.path.join(path, "flex.safetensors"), metadata={"format": "smcsd-flex"})
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump({"drafter": "flex", "flex": dataclasses.asdict(self.flex_config),
                       "target": self.target_config.to_dict()}, f, indent=2)
        if info is not None:
            with open(os.path.join(path, "training.json"), "w") as f:
                json.dump(info, f, indent=2)

    @classmethod
    def load(cls, path: str, name: str | None = None) -> "FlexDrafter":
        from smcsd.models.shipped import read_tensors, unflatten
        cfg_path = os.path.join(path, "config.json")
        if not os.path.isfile(cfg_path):
            raise ValueError(f"no FlexDraft adapters at {path!r} (config.json missing)")
        with open(cfg_path) as f:
            d = json.load(f)
        if d.get("drafter") != "flex":
            raise ValueError(f"{cfg_path} is not a FlexDraft adapters' config")
        fc, tc = FlexConfig(**d["flex"]), ModelConfig.from_dict(d["target"])
        t = unflatten({k: jnp.asarray(np.asarray(v, np.float32))
                        for k, v in read_tensors(os.path.join(path, "flex.safetensors")).items()})
        layers = tuple(t["layers"][str(i)] for i in range(fc.adapter_layers))
        return cls(fc, tc, FlexParams(layers, t["mask_vector"], t["calib"]), name or os.path.basename(os.path.normpath(path)))
