"""`DeLSDrafter` (DeLS-Spec, arXiv 2607.07409): a frozen block drafter plus a tiny *local head* that restores
left-to-right dependence inside the block.

A block drafter (DFlash, `DFlashDrafter`) predicts block position k without seeing the tokens it drafts at positions
1..k-1 of the same block, so later positions drift. The local head (`LocalHead`) is a one-layer GRU (no bias) over
the target's (frozen) token embeddings of the tokens drafted so far in the block — the anchor is not fed, the state
starts at zero — followed by a low-rank vocabulary head (hidden -> rank -> vocab). It is trained alone by next-token
prediction on a corpus (`smcsd.train.train_local_head`: neither the block drafter nor the target is touched), and it
is not tied to one block-drafter checkpoint: any block drafter of the same target can be fused with it.

Decoding (one block forward, then K-1 small sequential steps): x_1 ~ softmax(l_block[1]) (DFlash alone); for
k >= 2 the GRU consumes x_{k-1} and

    l_k = l_block[k] + alpha_k * l_local(h_{k-1}) - beta_k * l_prior,

with l_prior = log((c_v + 1) / sum(c + 1)) the unigram log-prior of the training corpus (alpha = beta = 0.3 by
default; a tuple gives one weight per position 2, 3, ...; its last entry repeats). The processed distribution of
l_k (temperature, top-k, top-p) is what x_k is drawn from and what `Proposal.logq` reports, so `sd` / `sd-multi` /
`sd-tree` stay exact and `smc` weights with the proposal really used (every fused logit is finite: full support
wherever the sampling settings keep it). The drafter state is the block drafter's (context K/V of target features);
the GRU state lives only inside one proposal. `propose_tree` builds product trees: each node's GRU state follows its
own path, so siblings' children get different local logits.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from ..sampling import process_logits, sample
from .base import Drafter, Proposal, TreeProposal
from .dflash import DFlashDrafter
from .tree import product_tree

FORMAT = "smcsd-dels-local-head"


@dataclasses.dataclass(frozen=True)
class LocalHeadConfig:
    """Shape of a local head: `vocab_size` and `embed_dim` are the target's (it reads the target's token embedding),
    `hidden` the GRU width, `rank` the low-rank vocabulary head's inner width."""

    vocab_size: int
    embed_dim: int
    hidden: int = 256
    rank: int = 256

    def __post_init__(self):
        for k in ("vocab_size", "embed_dim", "hidden", "rank"):
            v = getattr(self, k)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise ValueError(f"LocalHeadConfig.{k} must be a positive int, got {v!r}")

    @property
    def num_params(self) -> int:
        return 3 * self.hidden * (self.embed_dim + self.hidden) + self.hidden * self.rank + self.rank * self.vocab_size


def init_local_params(config: LocalHeadConfig, seed: int = 0) -> dict:
    """Random params: GRU input/recurrent matrices `w_x [E, 3G]`, `w_h [G, 3G]` (gates r, z, n; no bias), the head
    `down [G, r]`, `out [r, V]` (scaled so that initial logits are O(1))."""
    k = jax.random.split(jax.random.PRNGKey(seed), 4)
    E, G, r, V = config.embed_dim, config.hidden, config.rank, config.vocab_size
    n = jax.random.normal
    return {"w_x": n(k[0], (E, 3 * G), jnp.float32) / np.sqrt(E),
            "w_h": n(k[1], (G, 3 * G), jnp.float32) / np.sqrt(G),
            "down": n(k[2], (G, r), jnp.float32) / np.sqrt(G),
            "out": n(k[3], (r, V), jnp.float32) / np.sqrt(r)}


def gru_step(params, h, x):
    """One GRU step (PyTorch's gate equations, no bias): `h [..., G]`, input `x [..., E]` -> new `h`."""
    gx = x.astype(jnp.float32) @ params["w_x"]
    gh = h @ params["w_h"]
    xr, xz, xn = jnp.split(gx, 3, axis=-1)
    hr, hz, hn = jnp.split(gh, 3, axis=-1)
    r = jax.nn.sigmoid(xr + hr)
    z = jax.nn.sigmoid(xz + hz)
    cand = jnp.tanh(xn + r * hn)
    return (1.0 - z) * cand + z * h


def local_logits(params, h):
    """Vocabulary logits `[..., V]` of GRU states `h [..., G]` (float32)."""
    return (h @ params["down"]) @ params["out"]


def run_gru(params, x):
    """GRU states `[R, T, G]` after each of the inputs `x [R, T, E]`, from a zero state (training, references)."""
    G = params["w_h"].shape[0]

    def step(h, xt):
        h = gru_step(params, h, xt)
        return h, h
    _, hs = jax.lax.scan(step, jnp.zeros((x.shape[0], G), jnp.float32), jnp.swapaxes(x, 0, 1))
    return jnp.swapaxes(hs, 0, 1)


def unigram_log_prior(rows, vocab_size: int) -> np.ndarray:
    """l_prior = log((c_v + 1) / sum_v (c_v + 1)) from the token counts of `rows` (any int array)."""
    c = np.bincount(np.asarray(rows, np.int64).ravel(), minlength=vocab_size)[:vocab_size].astype(np.float64) + 1.0
    return np.log(c / c.sum()).astype(np.float32)


class LocalHead:
    """A trained (or random) local head: `config`, `params`, `log_prior [V]`, `name`. `save` / `load` a directory
    (config.json + local_head.safetensors [+ training.json]); fuse it with a block drafter by `DeLSDrafter`."""

    def __init__(self, config: LocalHeadConfig, params: dict, log_prior, name: str = "local-head"):
        if not isinstance(config, LocalHeadConfig):
            raise TypeError(f"LocalHead takes a LocalHeadConfig, got {type(config).__name__}")
        log_prior = np.asarray(log_prior, np.float32)
        if log_prior.shape != (config.vocab_size,):
            raise ValueError(f"log_prior must have shape ({config.vocab_size},), got {log_prior.shape}")
        self.config, self.params, self.log_prior, self.name = config, params, log_prior, name

    def __repr__(self):
        c = self.config
        return f"LocalHead({self.name!r}, hidden={c.hidden}, rank={c.rank}, vocab={c.vocab_size})"

    @classmethod
    def create(cls, target, *, hidden: int = 256, rank: int = 256, seed: int = 0, log_prior=None,
               name: str = "local-head") -> "LocalHead":
        """A randomly initialised head for `target` (a `models.LanguageModel`); uniform prior unless given."""
        tc = target.config
        config = LocalHeadConfig(int(tc.vocab_size), int(tc.hidden_size), hidden, rank)
        prior = np.full((tc.vocab_size,), -np.log(tc.vocab_size), np.float32) if log_prior is None else log_prior
        return cls(config, init_local_params(config, seed), prior, name)

    @property
    def num_params(self) -> int:
        return int(sum(np.size(x) for x in jax.tree_util.tree_leaves(self.params)))

    def with_params(self, params) -> "LocalHead":
        return LocalHead(self.config, params, self.log_prior, self.name)

    def check_target(self, target_config) -> None:
        c, tc = self.config, target_config
        if c.vocab_size != tc.vocab_size or c.embed_dim != tc.hidden_size:
            raise ValueError(f"this local head was made for a target with vocab_size={c.vocab_size} and embedding "
                             f"width {c.embed_dim}; the target has {tc.vocab_size} and {tc.hidden_size} (a local head "
                             "reads the target's token embedding: train one for this target with train_local_head)")

    def save(self, path: str, dtype: str = "float32", info: dict | None = None) -> None:
        from safetensors.numpy import save_file
        if dtype not in ("float32", "bfloat16"):
            raise ValueError(f"save dtype must be 'float32' or 'bfloat16', got {dtype!r}")
        os.makedirs(path, exist_ok=True)
        flat = {k: np.asarray(v, np.float32) for k, v in self.params.items()}
        if dtype == "bfloat16":
            import ml_dtypes
            flat = {k: v.astype(ml_dtypes.bfloat16) for k, v in flat.items()}
        flat["log_prior"] = self.log_prior.astype(np.float32)  # kept in float32: it is small and sums matter
        save_file(flat, os.path.join(path, "local_head.safetensors"), metadata={"format": FORMAT})
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump({"drafter": "dels-local-head", **dataclasses.asdict(self.config)}, f, indent=2)
        if info is not None:
            with open(os.path.join(path, "training.json"), "w") as f:
                json.dump(info, f, indent=2)

    @classmethod
    def load(cls, path: str, name: str | None = None) -> "LocalHead":
        from smcsd.models.shipped import read_tensors
        cfg_path = os.path.join(path, "config.json")
        if not os.path.isfile(cfg_path):
            raise ValueError(f"no local head at {path!r} (config.json missing)")
        with open(cfg_path) as f:
            d = json.load(f)
        if d.pop("drafter", None) != "dels-local-head":
            raise ValueError(f"{cfg_path} is not a DeLS-Spec local head's config")
        config = LocalHeadConfig(**d)
        t = {k: np.asarray(v, np.float32) for k, v in read_tensors(os.path.join(path, "local_head.safetensors")).items()}
        prior = t.pop("log_prior", None)
        expected = jax.eval_shape(lambda: init_local_params(config))
        if prior is None or set(t) != set(expected) or any(t[k].shape != expected[k].shape for k in expected):
            raise ValueError(f"the weights in {path} do not match its config.json (tensor names or shapes differ)")
        return cls(config, {k: jnp.asarray(v) for k, v in t.items()}, prior,
                   name or os.path.basename(os.path.normpath(path)))


def _weights(w, who: str) -> tuple[float, ...]:
    w = (w,) if isinstance(w, (int, float, np.floating, np.integer)) else tuple(w)
    if not w or not all(isinstance(x, (int, float, np.floating, np.integer)) and np.isfinite(x) for x in w):
        raise ValueError(f"{who} must be a finite number or a non-empty sequence of them (one per position 2, 3, "
                         f"...), got {w!r}")
    return tuple(float(x) for x in w)


@dataclasses.dataclass(frozen=True, init=False)
class DeLSDrafter(Drafter):
    """`DeLSDrafter(block, head, alpha=0.3, beta=0.3)`: DeLS-Spec's fusion of a `DFlashDrafter` and a `LocalHead`
    (module docstring). `alpha` / `beta`: a number, or one per block position 2, 3, ... (the last repeats)."""

    block: DFlashDrafter
    head_config: LocalHeadConfig
    alpha: tuple
    beta: tuple
    head: LocalHead = dataclasses.field(compare=False, hash=False, repr=False)
    name: str = dataclasses.field(compare=False, hash=False, default="dels")

    kind = "dels"
    shares_prefix = True
    supports_mesh = False

    def __init__(self, block: DFlashDrafter, head: LocalHead, alpha=0.3, beta=0.3, name: str = "dels"):
        if not isinstance(block, DFlashDrafter):
            raise TypeError(f"DeLSDrafter fuses a DFlashDrafter (DFlash) with a local head, got {type(block).__name__}"
                            " as block")
        if not isinstance(head, LocalHead):
            raise TypeError(f"head must be a LocalHead (smcsd.drafters.LocalHead.load(path)), got {type(head).__name__}")
        if head.config.vocab_size != block.vocab_size:
            raise ValueError(f"the local head's vocabulary ({head.config.vocab_size}) is not the block drafter's "
                             f"({block.vocab_size}); both must be made for the same target")
        object.__setattr__(self, "block", block)
        object.__setattr__(self, "head_config", head.config)
        object.__setattr__(self, "alpha", _weights(alpha, "alpha"))
        object.__setattr__(self, "beta", _weights(beta, "beta"))
        object.__setattr__(self, "head", head)
        object.__setattr__(self, "name", name)

    def __repr__(self):
        return f"DeLSDrafter({self.name!r}, block={self.block!r}, head={self.head!r}, alpha={self.alpha}, beta={self.beta})"

    def with_weights(self, alpha=None, beta=None) -> "DeLSDrafter":
        return DeLSDrafter(self.block, self.head, self.alpha if alpha is None else alpha,
                            self.beta if beta is None else beta, self.name)

    # ------------------------------------------------------------------ host side
    def bind(self, target) -> "DeLSDrafter":
        self.head.check_target(target.config)
        return DeLSDrafter(self.block.bind(target), self.head, self.alpha, self.beta, self.name)

    def drafter_params(self):
        return {"block": self.block.drafter_params(), "local": self.head.params,
                "log_prior": jnp.asarray(self.head.log_prior)}

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        return self.block.hidden_layers

    @property
    def vocab_size(self) -> int:
        return self.block.vocab_size

    @property
    def dtype(self) -> str:
        return self.block.dtype

    @property
    def max_len(self) -> int:
        return self.block.max_len

    @property
    def max_tokens_per_proposal(self) -> int:
        return self.block.max_tokens_per_proposal

    def describe(self) -> str:
        return f"dels:{self.name}"

    def calls_per_proposal(self, num_tokens: int) -> int:
        return 1  # one block forward; the local head's K-1 GRU steps are a few small matmuls, not model calls

    # ------------------------------------------------------------------ traced
    def _fused(self, params, lb, h, k: int):
        """Fused logits at block position k+1 (k >= 1: the GRU has consumed x_1..x_k) from block logits `lb`."""
        a = self.alpha[min(k - 1, len(self.alpha) - 1)]
        b = self.beta[min(k - 1, len(self.beta) - 1)]
        return lb + a * local_logits(params["local"], h) - b * params["log_prior"]

    def _embed(self, params, tokens):
        return jnp.take(params["block"]["embed"], tokens, axis=0)

    def init(self, params, prompt, prompt_len, cache_len, rows_per_prompt, target_hidden=None, suffix_len=None):
        return self.block.init(params["block"], prompt, prompt_len, cache_len, rows_per_prompt, target_hidden,
                               suffix_len)

    def observe(self, params, state, tokens, target_hidden, start, num_valid):
        return self.block.observe(params["block"], state, tokens, target_hidden, start, num_valid)

    def compact(self, state, start, index, count):
        return self.block.compact(state, start, index, count)

    def _block_logits(self, params, state, feed, feed_count, depth: int):
        self.block._check_depth(depth)
        anchors = jnp.take_along_axis(feed, (feed_count - 1)[:, None], axis=1)[:, 0]
        return self.block.block_logits_at(params["block"], state, anchors, state.lengths + feed_count - 1, depth)

    def propose(self, params, state, feed, feed_count, key, sampling, num_tokens: int) -> Proposal:
        lb = self._block_logits(params, state, feed, feed_count, num_tokens)  # [R, K, V]
        keys = jax.random.split(key, num_tokens)
        h = jnp.zeros((lb.shape[0], self.head_config.hidden), jnp.float32)
        toks, logqs = [], []
        for k in range(num_tokens):
            if k == 0:
                logits = lb[:, 0]
            else:
                h = gru_step(params["local"], h, self._embed(params, toks[-1]))
                logits = self._fused(params, lb[:, k], h, k)
            lq = process_logits(logits, sampling)
            toks.append(sample(keys[k], lq))
            logqs.append(lq)
        return Proposal(jnp.stack(toks, 1), jnp.stack(logqs, 1),
                        state.set_lengths(state.lengths + feed_count + num_tokens - 1))

    def propose_tree(self, params, state, feed, feed_count, key, sampling, tree) -> TreeProposal:
        if tree.branches:
            raise ValueError("D²SD branches (tree '+B') need a D2SDDrafter; a fused (DeLS-Spec) drafter builds "
                             "product trees only")
        lb = self._block_logits(params, state, feed, feed_count, tree.depth)  # [R, D, V]
        R = lb.shape[0]
        hs = [jnp.zeros((R, 1, self.head_config.hidden), jnp.float32)]  # GRU state per node of the level above

        def level(d, toks):
            if d == 0:
                return process_logits(lb[:, 0:1], sampling)
            # nodes at depth d (toks[d-1], [R, w_d]) each extend their parent's GRU state by their own token
            h = gru_step(params["local"], jnp.repeat(hs[-1], tree.branching[d - 1], axis=1),
                         self._embed(params, toks[d - 1]))
            hs.append(h)
            return process_logits(self._fused(params, lb[:, d:d + 1], h, d), sampling)

        tokens, trial, valid = product_tree(key, tree, level)
        parents, depths = tree.product_layout()
        M = len(parents)
        return TreeProposal(tokens, jnp.broadcast_to(jnp.asarray(parents), (R, M)),
                            jnp.broadcast_to(jnp.asarray(depths), (R, M)), trial, valid,
                            state.set_lengths(state.lengths + feed_count + tree.depth - 1))


def fused_reference_logq(drafter: DeLSDrafter, block_logits, drafted, sampling):
    """Reference of one proposal's distributions, cache-free: `block_logits [R, K, V]` of the block and the drafted
    tokens `drafted [R, K]`; returns the processed fused log q `[R, K, V]` position by position (tests)."""
    p = drafter.drafter_params()
    R, K, _ = block_logits.shape
    out = [process_logits(block_logits[:, 0], sampling)]
    if K > 1:
        emb = jnp.take(p["block"]["embed"], drafted[:, :K - 1], axis=0)
        hs = run_gru(p["local"], emb)  # [R, K-1, G]
        for k in range(1, K):
            out.append(process_logits(drafter._fused(p, block_logits[:, k], hs[:, k - 1], k), sampling))
    return jnp.stack(out, 1)


__all__ = ["DeLSDrafter", "LocalHead", "LocalHeadConfig", "fused_reference_logq", "gru_step", "init_local_params",
           "local_logits", "run_gru", "unigram_log_prior"]
