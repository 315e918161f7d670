"""Method `flex` (FlexDraft, arXiv 2605.20022): draft and verify in one target forward, no second model.

Parallel mode, per cycle and request (K = num_speculative_tokens <= the adapters' group size S):
1. one target forward (`smcsd.drafters.flex.forward_flex`) over the clean block [x_0, d_1..d_K] — the pending token and the
   drafts of the previous cycle — plus K + 1 mask groups, group k after candidate k (it assumes exactly k drafts
   will be accepted). The clean part is the plain model's forward (bit for bit: masks never reach it);
2. `sd`'s rejection sampling of d_1..d_K against the target's distributions with the q each draft was drawn from:
   n accepted, the correction / bonus token c from the residual (exact, whatever q is);
3. the next drafts come from group n (the one whose assumption came true): its mask states, with the now known
   bonus c, give logits = LM head(h) + calibration MLP([embed(c); h]) (bonus-guided calibration); d'_j is sampled
   from position j's processed distribution, independently across j, and that q is recorded for step 2 of the next
   cycle. The first drafts come from one group placed after the prompt in the prefill forward.
Sequential mode (`FlexDrafter.with_options(mode="sequential")`, and "auto" above `switch_batch` requests): a draft
pass — the pending token x_0 (written to the cache; its logits are the target's distribution for d_1) plus one mask
group on the last committed token, calibrated with x_0 — then a verify pass over d_1..d_K: two smaller calls per
cycle instead of one with K + 1 groups of masks. Confidence cut (`tau` > 0): only the first L drafts are verified,
L = #{i : prod_{j<=i} max q_j >= tau} (clamped to [1, K]); `stats.num_draft_tokens` counts the verified ones. The
call itself shrinks to the narrowest of the static widths 1, 2, 4, ..., K (`verify_widths`) that holds every live
row's L: one `lax.switch` branch per width inside the one compiled program, so no shape is data-dependent and nothing
recompiles. In parallel mode the width cuts both the verified block and the mask groups (w + 1 of them), and a
batch pays for its most confident row's L. Packing (`token_budget=P`, sequential mode): the verify pass takes the
P most confident drafts across the whole batch — each live row's first draft ranked before any row's second, then
by cumulative confidence, within each row's cut — as one packed call (`forward_cached(..., pack=)`: the projections,
MLPs and LM head, nearly all of its FLOPs, run on P tokens instead of B·K; attention keeps the [B, K] layout). Rows
get ragged lengths L_r (prefixes, Σ L_r <= P; a row left with L_r = 0 takes a plain target step from the draft
pass's logits), and the call's shape is fixed by P, so nothing recompiles. On this CPU a call turns compute-bound
past ~8-16 tokens, which is where packing pays: a batch of 16 at K = 8 verifies 128 tokens unpacked.

Exactness: every draft is drawn from a recorded q that depends only on the past, so the accept/reject step of `sd`
leaves the output law p_T (tested by enumeration); at T = 0 the tokens are `ar`'s. Only the clean tokens write the
cache; rolling back rejected drafts is setting lengths, as in `sd`.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from smcsd.models import forward_cached, init_cache
from smcsd.drafters.flex import draft_logits, forward_flex
from smcsd.models.transformer import layers_unstacked

from .base import ChainMethod
from ..runtime.engine import MethodDef, ProgramParts, StaticSpec, loop_program, register_method
from ..sampling import process_logits, sample
from ..runtime.engine import is_stop
from .sd import SDState, finish_cycle, pad_to, verify_widths, width_index
from ..verify import chain_accept, sample_probs


def cumulative_confidence(dlq):
    """log prod_{j<=i} max q_j `[B, K]` of the drafts' log q `[B, K, V]` (non-increasing along a row)."""
    return jnp.cumsum(jnp.max(dlq, axis=-1), axis=1)


def confidence_length(dlq, tau: float, conf=None):
    """Drafts to verify per row `[B]`: L = #{i : prod_{j<=i} max q_j >= tau}, clamped to [1, K] (FlexDraft's cut)."""
    K = dlq.shape[1]
    if not tau:
        return jnp.full(dlq.shape[:1], K, jnp.int32)
    conf = cumulative_confidence(dlq) if conf is None else conf
    return jnp.clip(jnp.sum(conf >= jnp.log(tau), axis=1), 1, K).astype(jnp.int32)


def budget_lengths(dlq, L, live, budget: int, conf=None):
    """Ragged verify lengths `[B]` within `budget` drafts across the batch: the top-`budget` (row, position)
    candidates with position < L[row] of live rows, ranked first-draft-first, then by cumulative top-1 confidence
    (earlier positions win ties); each row keeps the prefix of as many drafts as it won. Depends on q only, so
    verification stays exact whatever it picks. `conf`: `cumulative_confidence(dlq)` when already computed."""
    B, K = dlq.shape[:2]
    conf = cumulative_confidence(dlq) if conf is None else conf
    ok = live[:, None] & (jnp.arange(K)[None, :] < L[:, None])
    score = jnp.where(jnp.arange(K)[None, :] == 0, 1.0, conf)  # log conf <= 0: every first draft ranks first
    score = jnp.where(ok, score, -jnp.inf).reshape(-1)
    top, idx = jax.lax.top_k(score, min(budget, B * K))
    won = jnp.zeros((B * K,), jnp.int32).at[idx].set((top > -jnp.inf).astype(jnp.int32)).reshape(B, K)
    return jnp.sum(won, axis=1).astype(jnp.int32)


def pack_index(lengths, K: int, budget: int):
    """Flat indices `int32[budget]` (b * K + t for t < lengths[b]; padding B * K) of a packed verify call."""
    B = lengths.shape[0]
    valid = (jnp.arange(K)[None, :] < lengths[:, None]).reshape(-1)
    return jnp.nonzero(valid, size=budget, fill_value=B * K)[0].astype(jnp.int32)


def _accept(key_u, key_c, p, q, x, L):
    """sd's rejection sampling of drafts `x [B, K]` (q `[B, K, V]`) against p `[B, K+1, V]`, only the first `L[r]`
    drafts tried: (accepted n [B], correction / bonus token [B])."""
    n_acc, r = chain_accept(p, q, x, jax.random.uniform(key_u, x.shape), lengths=L)
    return n_acc, sample_probs(key_c, r)


def program_parts(target_cfg, drafter, spec: StaticSpec) -> ProgramParts:
    """FlexDraft's exact one-model drafting as init / cycle / finish (`smcsd.runtime.ProgramParts`)."""
    B, K = spec.batch, spec.num_speculative_tokens
    S = drafter.flex_config.group_size
    mode, tau = drafter.mode_for(B), drafter.tau
    widths = verify_widths(K)
    budget = drafter.token_budget if mode == "sequential" and drafter.token_budget is not None else None
    if budget is not None and budget >= B * K:
        budget = None  # the whole batch fits: the plain (unpacked) verify call

    def next_drafts(key, tp, fp, mask_hidden, bonus, sampling):
        lq = process_logits(draft_logits(target_cfg, tp, fp, mask_hidden[:, :K], bonus), sampling)  # [B, K, V]
        return sample(key, lq), lq

    anchors = jnp.broadcast_to(jnp.arange(K + 1, dtype=jnp.int32), (B, K + 1))

    def init(tp, fp, inp):
        cache = init_cache(target_cfg.num_hidden_layers, B, spec.cache_len, target_cfg.num_key_value_heads,
                           target_cfg.head_dim, target_cfg.jnp_dtype, per_layer=layers_unstacked(tp))
        last = (inp.prompt_len - 1)[:, None]
        key, k_first, k_draft = jax.random.split(inp.key, 3)
        if mode == "parallel":  # the prefill also drafts: one group after the prompt
            logits, cache, mh, _ = forward_flex(target_cfg, tp, fp, inp.prompt, cache, last, S,
                                                num_valid=inp.prompt_len, logit_index=last)
        else:
            logits, cache = forward_cached(target_cfg, tp, inp.prompt, cache, num_valid=inp.prompt_len,
                                           logit_index=last)
        tok = sample(k_first, process_logits(logits[:, 0], inp.sampling))
        if mode == "parallel":
            drafts, dlq = next_drafts(k_draft, tp, fp, mh[:, 0], tok, inp.draft_sampling)
        else:  # drafted at the start of each cycle
            drafts = jnp.zeros((B, K), jnp.int32)
            dlq = jnp.zeros((B, K, target_cfg.vocab_size), jnp.float32)
        out = jnp.full((B, spec.out_len), -1, jnp.int32).at[:, 0].set(tok)
        n = jnp.ones((B,), jnp.int32)
        done = is_stop(tok, inp.stop_ids) | (n >= inp.max_new_tokens)
        zero = jnp.int32(0)
        return SDState(cache, (drafts, dlq, zero), tok, jnp.zeros((B, 2), jnp.int32), jnp.ones((B,), jnp.int32), out,
                       n, done, key, zero, jnp.zeros((B,), jnp.int32), zero, zero, jnp.zeros((K,), jnp.int32))

    def cycle(tp, fp, inp, s: SDState) -> SDState:
        key, k_accept, k_corr, k_draft = jax.random.split(s.key, 4)
        live = ~s.done
        tlen_before = s.target_cache.lengths
        x, dlq, verified = s.draft_state
        if mode == "parallel":
            L = confidence_length(dlq, tau)
            block = jnp.concatenate([s.tok[:, None], x], axis=1)

            def parallel_call(w):  # verify the first w drafts, drafting from the w + 1 groups after them
                def call(cache):
                    lg, cache, mh, _ = forward_flex(target_cfg, tp, fp, block[:, :w + 1], cache,
                                                    anchors[:, :w + 1], S, num_valid=jnp.where(live, w + 1, 0))
                    return pad_to(lg, K + 1), cache, pad_to(mh, K + 1)
                return call

            if tau:  # the cut: the narrowest width that holds every live row's L, one branch per width
                logits, tcache, mh = jax.lax.switch(width_index(L, live, widths),
                                                    [parallel_call(w) for w in widths], s.target_cache)
            else:
                logits, tcache, mh = parallel_call(K)(s.target_cache)
        else:  # draft pass: the pending token (written) + one group on the last committed token; verify pass
            lg0, tcache, mh0, _ = forward_flex(target_cfg, tp, fp, s.tok[:, None], s.target_cache, None, S,
                                               num_valid=live.astype(jnp.int32),
                                               anchor_positions=(tlen_before - 1)[:, None])
            x, dlq = next_drafts(k_draft, tp, fp, mh0[:, 0], s.tok, inp.draft_sampling)
            conf = cumulative_confidence(dlq) if budget is not None else None  # one [B, K, V] pass for both
            L = confidence_length(dlq, tau, conf)
            if budget is not None:  # ragged rows packed into one call of `budget` tokens
                L = budget_lengths(dlq, L, live, budget, conf)

            def verify_call(w):  # the verify pass over the first w drafts
                def call(cache):
                    lg, cache = forward_cached(target_cfg, tp, x[:, :w], cache, num_valid=jnp.where(live, w, 0))
                    return pad_to(lg, K), cache
                return call

            if budget is not None:
                lg1, tcache = forward_cached(target_cfg, tp, x, tcache, num_valid=jnp.where(live, L, 0),
                                             pack=pack_index(jnp.where(live, L, 0), K, budget))
            elif tau:
                lg1, tcache = jax.lax.switch(width_index(L, live, widths), [verify_call(w) for w in widths],
                                             tcache)
            else:
                lg1, tcache = verify_call(K)(tcache)
            logits = jnp.concatenate([lg0, lg1], axis=1)
            tcache = tcache.set_lengths(tlen_before)  # finish_cycle sets the committed length below
        # Positions past a row's L are padding (their logits unused: at most L drafts are accepted).
        p = jnp.exp(process_logits(logits, inp.sampling))  # [B, K+1, V]
        n_acc, c = _accept(k_accept, k_corr, p, jnp.exp(dlq), x, L)
        s = s._replace(key=key, calls=s.calls + (1 if mode == "sequential" else 0))
        s, tlen, _ = finish_cycle(s, inp, K, n_acc, x, c, tlen_before, tlen_before)
        verified = verified + jnp.sum(jnp.where(live, L, 0))
        if mode == "parallel":  # the next drafts: the group whose assumption (n accepted) came true
            group = jnp.take_along_axis(mh, n_acc[:, None, None, None], axis=1)[:, 0]  # [B, S, H]
            new_x, new_lq = next_drafts(k_draft, tp, fp, group, c, inp.draft_sampling)
            x = jnp.where(live[:, None], new_x, x)
            dlq = jnp.where(live[:, None, None], new_lq, dlq)
        return s._replace(target_cache=tcache.set_lengths(tlen), draft_state=(x, dlq, verified))

    def finish(inp, s: SDState) -> dict:
        del inp
        return {"tokens": s.out, "lengths": s.n,
                "stats": {"num_target_calls": s.calls, "live_calls": s.live_calls, "num_draft_calls": jnp.int32(0),
                          "num_drafts": s.drafts, "num_draft_tokens": s.draft_state[2],
                          "num_accepted_tokens": s.accepted, "accepted_per_position": s.per_position}}

    return ProgramParts(init, cycle, finish)


def build_flex(target_cfg, drafter, spec: StaticSpec):
    return loop_program(program_parts(target_cfg, drafter, spec))


def _headroom(num_speculative_tokens, num_particles, tree=None):
    del num_particles, tree
    return num_speculative_tokens + 1


def pair_flex(target):
    """(target, its pair's FlexDraft adapters) for `decode(method="flex")` without a draft."""
    from ..pairs import pair_drafter
    found = pair_drafter(target, "flex")
    if found is None:
        raise ValueError("method 'flex' needs FlexDraft adapters for this target and none ship with it: pass "
                         "draft=smcsd.drafters.FlexDrafter (train one with smcsd.train.train_flex), or use a pair that "
                         "has them (smcsd.available_drafters(pair) lists 'flex')")
    return found


DEFINITION = register_method(MethodDef(
    name="flex", build=build_flex, needs_draft=True, headroom=_headroom, pair_draft=pair_flex, drafter_kind="flex",
    drafter_hint="method 'flex' drafts with FlexDraft adapters (draft=smcsd.drafters.FlexDrafter, or "
                 "smcsd.load(pair, drafter='flex')), and a FlexDrafter works with method='flex' only",
    parts=program_parts))


@dataclasses.dataclass(frozen=True, repr=False)
class Flex(ChainMethod):
    """`flex`: FlexDraft's exact one-model drafting, `num_speculative_tokens` per cycle (its adapters' cap)."""

    name: ClassVar[str] = "flex"
