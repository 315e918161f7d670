"""`sd-tree`: a token tree drafted per request, verified in one target call, accepted exactly.

Per cycle (one compiled `lax.while_loop`, like `sd`):

    tree = drafter.propose_tree(...)            # M nodes: tokens, parents, depths, trial log q, valid
    one target call over [x_0, node_1..node_M]  # `models.forward_tree`: node m at slot T+m, RoPE position T+depth,
                                                # attending to the context and its ancestors only
    walk the tree (`verify.tree_walk`)          # recursive rejection sampling, depth by depth
    compact the accepted path's K/V (target and drafter) into consecutive slots; roll back by lengths

The walk is `smcsd.verify.tree_walk` (exact whatever the children's trial distributions; equal tokens merge, so
with `TreeSpec((N, 1, ..., 1))` this method walks `sd-multi`'s draft forest exactly as `sd-multi` does — in one row
of 1 + N·K tokens instead of N rows of K + 1). (`sd-multi` itself stays: its drafts run as N rows, which drafters
without tree proposals need.)
"""

from __future__ import annotations

from typing import ClassVar

import dataclasses

import jax
import jax.numpy as jnp

from smcsd.models import ancestor_mask, forward_tree

from ..drafters import as_drafter
from .base import Method, check_count
from ..runtime.engine import MethodDef, MethodOptions, ProgramParts, StaticSpec, loop_program, register_method
from ..runtime.engine import hidden_concat
from .sd import finish_cycle, start
from ..verify import sample_probs, tree_walk


def program_parts(target_cfg, drafter, spec: StaticSpec) -> ProgramParts:
    """Tree speculative decoding with one tree per request (`spec.tree`, a `TreeSpec`), as init / cycle / finish."""
    tree = spec.tree
    B, D, M = spec.batch, tree.depth, tree.num_nodes
    drafter = as_drafter(drafter)
    hl = drafter.hidden_layers

    def init(target_params, draft_params, inp):
        return start(target_cfg, drafter, target_params, draft_params, inp, spec, rows=1)

    def cycle(target_params, draft_params, inp, s):
        key, k_draft, k_accept, k_corr = jax.random.split(s.key, 4)
        live = ~s.done
        tlen_before, dlen_before = s.target_cache.lengths, drafter.lengths(s.draft_state)
        prop = drafter.propose_tree(draft_params, s.draft_state, s.feed, s.feed_count, k_draft,
                                    inp.draft_sampling, tree)
        block = jnp.concatenate([s.tok[:, None], prop.tokens], axis=1)  # [B, M+1]: root, then the nodes
        blk_parents = jnp.concatenate([jnp.full((B, 1), -1, jnp.int32),
                                       jnp.where(prop.parents < 0, 0, prop.parents + 1)], axis=1)
        blk_depths = jnp.concatenate([jnp.zeros((B, 1), jnp.int32), prop.depths], axis=1)
        out = forward_tree(target_cfg, target_params, block, s.target_cache, tlen_before,
                           jnp.broadcast_to(jnp.arange(M + 1, dtype=jnp.int32), (B, M + 1)), blk_depths,
                           ancestor_mask(blk_parents), hidden_layers=hl)
        logits, tcache = out[0], out[1]
        u = jax.random.uniform(k_accept, (B, D, tree.max_candidates))
        n_acc, path, path_idx, r_final = tree_walk(prop.tokens, prop.parents, prop.depths, prop.valid, prop.logq,
                                                   logits, inp.sampling, u, tree.max_candidates)
        c = sample_probs(k_corr, r_final)

        s = s._replace(key=key)
        s, tlen, dlen = finish_cycle(s, inp, D, n_acc, path, c, tlen_before, dlen_before)
        moved = jnp.where(live, n_acc, 0)
        tcache = tcache.compact(tlen_before + 1, path_idx, moved).set_lengths(tlen)
        dstate = drafter.compact(prop.state, tlen_before + 1, path_idx, moved)
        hidden = None
        if hl:  # the target's hidden states along the accepted path: root, then its nodes
            h = hidden_concat(out[2])
            pos = jnp.concatenate([jnp.zeros((B, 1), jnp.int32), path_idx + 1], axis=1)
            hidden = jnp.take_along_axis(h, pos[:, :, None], axis=1)
        dstate = drafter.observe(draft_params, dstate, jnp.concatenate([block[:, :1], path], axis=1),
                                 hidden, tlen_before, jnp.where(live, n_acc + 1, 0))
        return s._replace(target_cache=tcache, draft_state=drafter.set_lengths(dstate, dlen))

    def finish(inp, state):
        del inp
        return {"tokens": state.out, "lengths": state.n,
                "stats": {"num_target_calls": state.calls, "live_calls": state.live_calls,
                          "num_draft_calls": drafter.tree_calls(tree) * state.calls,
                          "num_drafts": state.drafts, "num_draft_tokens": M * state.drafts,
                          "num_accepted_tokens": state.accepted, "accepted_per_position": state.per_position}}

    return ProgramParts(init, cycle, finish)


def build_sd_tree(target_cfg, drafter, spec: StaticSpec):
    return loop_program(program_parts(target_cfg, drafter, spec))


def _headroom(num_speculative_tokens, num_particles, tree=None):
    """A cycle writes 1 + M target slots past a live row's position and emits up to D + 1 tokens."""
    del num_particles
    return (num_speculative_tokens if tree is None else tree.num_nodes) + 1


def parse_tree(tree):
    """A `TreeSpec` from `tree=` (a TreeSpec, or a string like '2,2,1,1:sample')."""
    from ..drafters.tree import TreeSpec
    if isinstance(tree, TreeSpec):
        return tree
    if isinstance(tree, str):
        return TreeSpec.parse(tree)
    raise TypeError(f"tree must be a smcsd.TreeSpec or a string like '2,2,1,1:sample', got {type(tree).__name__}")


def configure(options: MethodOptions, drafter) -> MethodOptions:
    """sd-tree's K is its tree's depth: the tree given (checked against num_speculative_tokens= when both are
    passed), else the pair's default tree (smcsd.defaults.default_tree) of the K passed, or of its own depth."""
    from .. import defaults
    K = options.num_speculative_tokens
    given = options.num_speculative_tokens_given
    tree = defaults.default_tree(drafter, K if given else None) if options.tree is None else parse_tree(options.tree)
    if given and K != tree.depth:
        raise ValueError(f"num_speculative_tokens={K} disagrees with the tree's depth "
                         f"{tree.depth} (tree={str(tree)!r}); pass one of them")
    if drafter is not None:
        drafter.check_tree(tree)
    if options.mesh is not None:
        raise ValueError("sd-tree runs on one device for now; call decode without mesh=")
    draft_temperature = options.draft_temperature
    if tree.children == "top" and draft_temperature == 0:
        # "top" children are tried as point masses, so the walk is exact whatever ranks them; ranked by a draft
        # processed at temperature 0 (one-hot) every child after the first would be no token at all (a chain that
        # verifies padding), so they are ranked by the drafter's own distribution (temperature 1; its first child
        # is still the argmax)
        draft_temperature = 1.0
    return dataclasses.replace(options, num_speculative_tokens=tree.depth, tree=tree,
                               draft_temperature=draft_temperature)


DEFINITION = register_method(MethodDef(name="sd-tree", build=build_sd_tree, needs_draft=True, headroom=_headroom,
                                    takes_tree=True, configure=configure, parts=program_parts))


@dataclasses.dataclass(frozen=True, repr=False)
class SDTree(Method):
    """`sd-tree`: exact speculative decoding over a draft tree (a `smcsd.TreeSpec` or its string form, e.g.
    '2,1:top'; None: the pair's default tree). Its K is the tree's depth: pass one of them, or both agreeing."""

    name: ClassVar[str] = "sd-tree"
    tree: object = None
    num_speculative_tokens: int | None = None

    def __post_init__(self):
        check_count("SDTree", "num_speculative_tokens", self.num_speculative_tokens)
        if self.tree is not None:
            try:
                spec = parse_tree(self.tree)
            except (TypeError, ValueError) as e:
                raise type(e)(f"SDTree(tree={self.tree!r}): {e}") from None
            if self.num_speculative_tokens is not None and self.num_speculative_tokens != spec.depth:
                raise ValueError(f"SDTree(tree={self.tree!r}, num_speculative_tokens={self.num_speculative_tokens}): "
                                 f"the tree's depth is {spec.depth}; pass one of them")
