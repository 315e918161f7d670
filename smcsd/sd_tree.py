"""`sd-tree`: a token tree drafted per request, verified in one target call, accepted exactly.

Per cycle (one compiled `lax.while_loop`, like `sd`):

    tree = drafter.propose_tree(...)            # M nodes: tokens, parents, depths, trial log q, valid
    one target call over [x_0, node_1..node_M]  # `models.forward_tree`: node m at slot T+m, RoPE position T+depth,
                                                # attending to the context and its ancestors only
    walk the tree (`tree_walk`)                 # recursive rejection sampling, depth by depth
    compact the accepted path's K/V (target and drafter) into consecutive slots; roll back by lengths

The walk: at the accepted node of depth d (first the root x_0) the residual r starts as the target's processed
p there; the candidates of depth d+1 are tried in index order — accept x w.p. min(1, r(x)/q_i(x)), else
r <- norm(max(0, r − q_i)) — with q_i the candidate's *trial distribution* (q for i.i.d. children, q without the
earlier siblings for children drawn without replacement, a point mass for deterministic top-k children;
smcsd/drafters/tree.py). When every candidate fails, the correction token is drawn from r; below an accepted leaf
the bonus token from p. Each step outputs exactly p whatever the candidates were (SpecInfer's multi-round
rejection sampling, Miao et al. 2023; Jeon et al. 2024 for the without-replacement rule), so the output law is
`ar`'s; at temperature 0 p is a point mass and the output is `ar`'s greedy tokens.

Equal tokens merge: after accepting x at depth d, *every* candidate node holding x stays alive, and the next
candidates are the children of all of them (their contexts are the same token path, so p and the drafts' laws
agree). That is `sd-multi`'s rule for N chains that share a prefix, and with `TreeSpec((N, 1, ..., 1))` this
method walks `sd-multi`'s draft forest exactly as `sd-multi` does — in one row of 1 + N·K tokens instead of N
rows of K + 1. (`sd-multi` itself stays: its drafts run as N rows, which drafters without tree proposals need.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from smcsd.models import ancestor_mask, forward_tree

from . import sd as _sd
from .drafters import as_drafter
from .engine import MethodDef, StaticSpec, register_method
from .engine import _hidden_concat
from .sampling import process_logits
from .sd import _finish_cycle, _sample_probs, _start, _take, residual


def tree_walk(tokens, parents, depths, valid, logq, target_logits, sampling, u, max_candidates: int, accept=None):
    """Exact acceptance down a token tree (module docstring).

    tokens / parents / depths / valid `[B, M]`, logq `[B, M, V]` trial log-distributions, target_logits
    `[B, M+1, V]` (position 0: the root x_0, m+1: node m), u `[B, D, C]` uniforms with C = `max_candidates` (the
    most nodes of one depth). Returns (accepted count n [B], accepted tokens [B, D] (valid up to n), the node index
    of each accepted token [B, D] (one representative per depth, each a child of the previous one), the
    distribution of the correction/bonus token [B, V])."""
    accept = _sd.accept_test if accept is None else accept  # looked up at trace time: tests swap in a broken rule
    B, M = tokens.shape
    D, C = u.shape[1], max_candidates
    bi = jnp.arange(B)
    order_key = jnp.arange(M)[None, :]
    alive = jnp.zeros((B, M + 1), bool).at[:, 0].set(True)  # block positions on the accepted path's depth
    rep = jnp.zeros((B,), jnp.int32)  # a block position holding the accepted path (0: the root)
    active = jnp.ones((B,), bool)
    n_acc = jnp.zeros((B,), jnp.int32)
    path = jnp.zeros((B, D), jnp.int32)
    path_idx = jnp.zeros((B, D), jnp.int32)
    r_final = jnp.zeros((B, target_logits.shape[-1]), jnp.float32)
    parent_pos = jnp.where(parents < 0, 0, parents + 1)
    for d in range(D):
        p = jnp.exp(process_logits(target_logits[bi, rep], sampling))  # [B, V]
        cand = valid & (depths == d + 1) & jnp.take_along_axis(alive, parent_pos, axis=1)  # [B, M]
        order = jnp.argsort(jnp.where(cand, order_key, M + order_key), axis=1)[:, :C]  # first C candidates
        ok = jnp.take_along_axis(cand, order, axis=1)
        r, acc, tok = p, jnp.zeros((B,), bool), jnp.zeros((B,), jnp.int32)
        for i in range(C):
            m = order[:, i]
            x = tokens[bi, m]
            q = jnp.exp(logq[bi, m])
            trial = active & ok[:, i] & ~acc
            a = trial & accept(u[:, d, i], _take(r, x), _take(q, x))
            tok = jnp.where(a, x, tok)
            acc = acc | a
            r = jnp.where((trial & ~a)[:, None], residual(r, q), r)
        r_final = jnp.where((active & ~acc)[:, None], r, r_final)
        step = active & acc
        same = cand & (tokens == tok[:, None])  # every candidate holding the accepted token stays alive
        first = jnp.argmax(same, axis=1).astype(jnp.int32)
        alive = jnp.where(step[:, None], jnp.concatenate([jnp.zeros((B, 1), bool), same], axis=1), alive)
        rep = jnp.where(step, first + 1, rep)
        path = path.at[:, d].set(tok)
        path_idx = path_idx.at[:, d].set(first)
        n_acc = n_acc + step
        active = step
    bonus = jnp.exp(process_logits(target_logits[bi, rep], sampling))
    r_final = jnp.where(active[:, None], bonus, r_final)
    return n_acc, path, path_idx, r_final


def build_sd_tree(target_cfg, drafter, spec: StaticSpec):
    """Tree speculative decoding with one tree per request (`spec.tree`, a `TreeSpec`)."""
    tree = spec.tree
    B, D, M = spec.batch, tree.depth, tree.num_nodes
    drafter = as_drafter(drafter)
    hl = drafter.hidden_layers

    def program(target_params, draft_params, inp):
        state = _start(target_cfg, drafter, target_params, draft_params, inp, spec, rows=1)

        def body(s):
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
            c = _sample_probs(k_corr, r_final)

            s = s._replace(key=key)
            s, tlen, dlen = _finish_cycle(s, inp, D, n_acc, path, c, tlen_before, dlen_before)
            moved = jnp.where(live, n_acc, 0)
            tcache = tcache.compact(tlen_before + 1, path_idx, moved).set_lengths(tlen)
            dstate = drafter.compact(prop.state, tlen_before + 1, path_idx, moved)
            hidden = None
            if hl:  # the target's hidden states along the accepted path: root, then its nodes
                h = _hidden_concat(out[2])
                pos = jnp.concatenate([jnp.zeros((B, 1), jnp.int32), path_idx + 1], axis=1)
                hidden = jnp.take_along_axis(h, pos[:, :, None], axis=1)
            dstate = drafter.observe(draft_params, dstate, jnp.concatenate([block[:, :1], path], axis=1),
                                     hidden, tlen_before, jnp.where(live, n_acc + 1, 0))
            return s._replace(target_cache=tcache, draft_state=drafter.set_lengths(dstate, dlen))

        state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
        return {"tokens": state.out, "lengths": state.n,
                "stats": {"num_target_calls": state.calls, "live_calls": state.live_calls,
                          "num_draft_calls": drafter.tree_calls(tree) * state.calls,
                          "num_drafts": state.drafts, "num_draft_tokens": M * state.drafts,
                          "num_accepted_tokens": state.accepted, "accepted_per_position": state.per_position}}

    return program


def _headroom(num_speculative_tokens, num_particles, tree=None):
    """A cycle writes 1 + M target slots past a live row's position and emits up to D + 1 tokens."""
    del num_particles
    return (num_speculative_tokens if tree is None else tree.num_nodes) + 1


SD_TREE = register_method(MethodDef(name="sd-tree", build=build_sd_tree, needs_draft=True, headroom=_headroom))
