"""`D2SDDrafter` (D²SD, arXiv 2606.04446): a block drafter's chain plus alternative branches placed where the chain
is most likely to be rejected, re-drafted by a second, variable-prefix block drafter, verified as one token tree.

Per proposal (two drafter forwards, whatever the number of branches):
1. the main block drafter (DFlash) drafts x_1..x_D with per-position distributions q_k; confidence c_k = max q_k;
2. the probability that exactly i tokens are accepted is estimated as r(i) = Π_{k≤i} c_k · (1 − c_{i+1}), and the
   `tree.branches` most likely values of i (in 0..D−1) are the re-anchoring points;
3. the variable-prefix drafter (same architecture, trained to see its first p block positions filled with tokens:
   `smcsd.train.train_block_drafter(..., prefix_decay=0.9)`) re-anchors one block per point, showing x_1..x_i and
   masking the rest, all branches in one batched forward that reads the context once (`repeat`);
4. branch b is the chain y_{i+1}..y_D hung under x_i (under x_0 when i = 0): a sibling of x_{i+1} and its subtree.

Exactness (`sd-tree`'s walk): the branch points are a function of the main block's distributions only (not of its
sampled tokens), and each branch token is drawn from its recorded distribution given the path above it, independently
of everything else, so recursive rejection sampling with those distributions is exact. Equal tokens of the chain
and a branch merge in the walk (smcsd/methods/sd_tree.py), which is D²SD's "first still-valid branch" made exact. The
authors verify K + 1 separate rows with cascade attention over the shared prefix; one flattened tree in one row
reads the context once as well and verifies fewer tokens (the branch prefixes are not repeated).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ..sampling import process_logits
from .base import Drafter, Proposal, TreeProposal
from .dflash import DFlashDrafter, head_params
from .tree import draw_children


@dataclasses.dataclass(frozen=True, init=False)
class D2SDDrafter(Drafter):
    """`D2SDDrafter(main, vp)`: two `DFlashDrafter`s reading the same target layers. As a chain drafter (`sd`,
    `sd-multi`, `smc`) it is its main drafter; `sd-tree` adds the branches."""

    main: DFlashDrafter
    vp: DFlashDrafter
    name: str = dataclasses.field(compare=False, hash=False, default="d2sd")

    kind = "d2sd"
    shares_prefix = True
    supports_mesh = False
    tree_shapes = ("product", "branches")  # chains, with or without branches (its own `check_tree`)
    preferred_method = "sd-tree"  # a tree drafter: its branches pay only in sd-tree

    def default_tree(self, depth: int, branching: tuple[int, ...], branches: int):
        """Its chain plus up to `branches` re-anchored branches (D²SD's own tree)."""
        from .tree import TreeSpec
        return TreeSpec((1,) * depth, "sample", min(branches, depth))

    def __init__(self, main: DFlashDrafter, vp: DFlashDrafter, name: str = "d2sd"):
        if not isinstance(main, DFlashDrafter) or not isinstance(vp, DFlashDrafter):
            raise TypeError(f"D2SDDrafter takes two BlockDrafters (main, variable-prefix), got "
                            f"{type(main).__name__}, {type(vp).__name__}")
        if main.block_config.target_layers != vp.block_config.target_layers:
            raise ValueError(f"the main and variable-prefix drafters read different target layers "
                             f"({main.block_config.target_layers} vs {vp.block_config.target_layers}); train the "
                             "variable-prefix drafter from the main one (train_block_drafter.py --variable-prefix)")
        object.__setattr__(self, "main", main)
        object.__setattr__(self, "vp", vp)
        object.__setattr__(self, "name", name)

    def __repr__(self):
        return f"D2SDDrafter({self.name!r}, main={self.main!r}, vp={self.vp!r})"

    # ------------------------------------------------------------------ host side
    def bind(self, target) -> "D2SDDrafter":
        return D2SDDrafter(self.main.bind(target), self.vp.bind(target), self.name)

    def drafter_params(self):
        if self.main.shared is None or self.vp.shared is None:
            raise ValueError("bind the D²SD drafter to its target first (drafter.bind(target))")
        return {"main": self.main.params, "vp": self.vp.params, **self.main.shared}

    @staticmethod
    def _part(params, which):
        return {"net": params[which], "embed": params["embed"], "head": params["head"]}

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        return self.main.hidden_layers

    @property
    def vocab_size(self) -> int:
        return self.main.vocab_size

    @property
    def dtype(self) -> str:
        return self.main.dtype

    @property
    def max_len(self) -> int:
        return min(self.main.max_len, self.vp.max_len)

    @property
    def max_tokens_per_proposal(self) -> int:
        return min(self.main.max_tokens_per_proposal, self.vp.max_tokens_per_proposal)

    def describe(self) -> str:
        return f"d2sd:{self.name}"

    def calls_per_proposal(self, num_tokens: int) -> int:
        return 1

    def tree_calls(self, tree) -> int:
        return 2 if tree.branches else 1

    # ------------------------------------------------------------------ traced
    def init(self, params, prompt, prompt_len, cache_len, rows_per_prompt, target_hidden=None, suffix_len=None):
        return (self.main.init(self._part(params, "main"), prompt, prompt_len, cache_len, rows_per_prompt,
                               target_hidden, suffix_len),
                self.vp.init(self._part(params, "vp"), prompt, prompt_len, cache_len, rows_per_prompt,
                             target_hidden, suffix_len))

    def propose(self, params, state, feed, feed_count, key, sampling, num_tokens: int) -> Proposal:
        prop = self.main.propose(self._part(params, "main"), state[0], feed, feed_count, key, sampling, num_tokens)
        return prop._replace(state=(prop.state, state[1].set_lengths(prop.state.lengths)))

    def check_tree(self, tree) -> None:
        if any(b != 1 for b in tree.branching):
            raise ValueError(f"a D²SD tree is a chain plus branches (tree '1,...,1+B', e.g. '1,1,1,1+2'), got "
                             f"{str(tree)!r}")
        if tree.children == "distinct":
            raise ValueError("D²SD's branches come from a second network: draw them with children 'sample' or 'top' "
                             "(tree '1,1,1,1+2:sample')")
        if tree.depth > self.max_tokens_per_proposal:
            raise ValueError(f"tree depth {tree.depth} is more than this D²SD drafter's blocks predict (at most "
                             f"{self.max_tokens_per_proposal}); use a shallower tree")

    def propose_tree(self, params, state, feed, feed_count, key, sampling, tree) -> TreeProposal:
        self.check_tree(tree)
        D, nb = tree.depth, tree.branches
        self.main._check_depth(D)
        k_main, k_vp = jax.random.split(key)
        R = feed.shape[0]
        anchors = jnp.take_along_axis(feed, (feed_count - 1)[:, None], axis=1)[:, 0]
        ctx_len = state[0].lengths + feed_count - 1
        lq = process_logits(self.main.block_logits_at(self._part(params, "main"), state[0], anchors, ctx_len, D),
                            sampling)  # [R, D, V]
        x, lq_x, _ = draw_children(k_main, lq.reshape(R * D, 1, -1), 1, tree.children)
        x, lq_x = x.reshape(R, D), lq_x.reshape(R, D, -1)
        tokens, logq, parents = x, lq_x, jnp.broadcast_to(jnp.arange(D, dtype=jnp.int32) - 1, (R, D))
        depths = jnp.broadcast_to(jnp.arange(1, D + 1, dtype=jnp.int32), (R, D))
        valid = jnp.ones((R, D), bool)
        if nb:
            conf = jnp.exp(jnp.max(lq, axis=-1))  # [R, D]
            reach = jnp.concatenate([jnp.ones((R, 1)), jnp.cumprod(conf, axis=1)[:, :-1]], axis=1)  # Π_{k≤i} c_k
            _, at = jax.lax.top_k(reach * (1.0 - conf), nb)  # [R, nb]: accepted counts i where rejection is likely
            at = at.astype(jnp.int32)
            vp = self._part(params, "vp")
            vlq = process_logits(self.vp.block_logits_at(
                vp, state[1], jnp.repeat(anchors, nb), ctx_len, D, prefix=jnp.repeat(x, nb, axis=0),
                prefix_len=at.reshape(-1), repeat=nb), sampling)  # [R*nb, D, V]
            y, lq_y, _ = draw_children(k_vp, vlq.reshape(R * nb * D, 1, -1), 1, tree.children)
            y, lq_y = y.reshape(R, nb, D), lq_y.reshape(R, nb, D, -1)
            t = jnp.arange(D, dtype=jnp.int32)
            pos = at[:, :, None] + t  # [R, nb, D]: block position index of branch slot t
            ok = pos < D
            pc = jnp.minimum(pos, D - 1)
            b_tok = jnp.take_along_axis(y, pc, axis=2)
            b_lq = jnp.take_along_axis(lq_y, pc[..., None], axis=2)
            first = D + jnp.arange(nb, dtype=jnp.int32)[None, :, None] * D  # node index of each branch's slot 0
            b_par = jnp.where(t == 0, at[:, :, None] - 1, first + t - 1)
            tokens = jnp.concatenate([tokens, b_tok.reshape(R, nb * D)], axis=1)
            logq = jnp.concatenate([logq, b_lq.reshape(R, nb * D, -1)], axis=1)
            parents = jnp.concatenate([parents, b_par.reshape(R, nb * D)], axis=1)
            depths = jnp.concatenate([depths, (pos + 1).reshape(R, nb * D)], axis=1)
            valid = jnp.concatenate([valid, ok.reshape(R, nb * D)], axis=1)
        moved = state[0].lengths + feed_count + D - 1
        return TreeProposal(tokens, parents, depths, logq, valid, (state[0].set_lengths(moved),
                                                                   state[1].set_lengths(moved)))

    def observe(self, params, state, tokens, target_hidden, start, num_valid):
        return (self.main.observe(self._part(params, "main"), state[0], tokens, target_hidden, start, num_valid),
                self.vp.observe(self._part(params, "vp"), state[1], tokens, target_hidden, start, num_valid))

    # ------------------------------------------------------------------ row operations on the pair of states
    def lengths(self, state):
        return state[0].lengths

    def set_lengths(self, state, lengths):
        return state[0].set_lengths(lengths), state[1].set_lengths(lengths)

    def copy_window(self, state, src, start, width: int):
        return state[0].copy_window(src, start, width), state[1].copy_window(src, start, width)

    def gather(self, state, index):
        return state[0].gather(index), state[1].gather(index)

    def compact(self, state, start, index, count):
        del start, index, count  # target features only, written by observe along the accepted path
        return state


def create_random(target, *, num_layers: int = 1, block_size: int = 8, seed: int = 0) -> D2SDDrafter:
    """A randomly initialised D²SD pair for `target` (tests and enumeration)."""
    main = DFlashDrafter.create(target, num_layers=num_layers, block_size=block_size, seed=seed, name="d2sd-main")
    vp = DFlashDrafter.create(target, num_layers=num_layers, block_size=block_size, seed=seed + 1,
                             target_layers=main.block_config.target_layers, name="d2sd-vp")
    return D2SDDrafter(main, vp)


__all__ = ["D2SDDrafter", "create_random", "head_params"]
