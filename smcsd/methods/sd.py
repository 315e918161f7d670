"""The exact speculative baseline `sd` (one draft, rejection sampling), and the cycle pieces the chain methods share
(`sd-multi` in sd_multi.py, `sd-tree`, `flex` and `sd-overlap` reuse the state, the start and the cycle's finish).

It keeps the output distribution equal to `ar`'s (the processed target p_T, top-k/top-p and
temperature 0 included) and run as one jitted program: prefill, then a `lax.while_loop` of cycles

    draft K tokens (`drafter.propose`) -> one target call on [x0, x1..xK] -> accept a prefix of
    n tokens plus one correction/bonus token c -> `drafter.observe` the committed tokens (with the target's
    hidden states from that call, if the drafter asks) -> roll both back by setting lengths.

Cache bookkeeping per row, with T the target length before the cycle (it excludes the pending x0):
target length -> T + 1 + n and pending -> c; draft: if n == K the draft never saw x_K, so feed
[x_K, c] next cycle (count 2) and keep its length at T + K, else set it to T + 1 + n and feed [c].
In both cases draft length = new target length + 1 - feed count. Rows that are done keep every
length, pending token and feed as they were (their cache writes land past the length: stale).

With a confidence cut (`SD(confidence_cut=c)`, `StaticSpec.confidence_cut`) only the first L drafts are verified,
L from the drafter's own confidences (`confidence_lengths`), in the narrowest static width holding every live row's
L (`verify_cut`); a row's accepted count never passes its L, so the bookkeeping above is unchanged.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from smcsd.models import KVCache

from ..drafters import as_drafter, initial_feed
from .base import ChainMethod
from ..runtime.engine import MethodDef, ProgramInputs, ProgramParts, StaticSpec, first_stop_count, is_stop, loop_program, \
    prefill, register_method, verify_call, write_tokens
from ..sampling import process_logits, sample
from ..verify import chain_accept, sample_probs


# ----------------------------------------------------------------------------- shared loop pieces

class SDState(NamedTuple):
    """The loop state of the chain methods (`sd`, `sd-multi`, `sd-tree`; `flex` and `sd-overlap` reuse it)."""

    target_cache: KVCache
    draft_state: Any  # the drafter's state (a KVCache for ARDrafter)
    tok: jax.Array  # int32[B]: pending token x0 (emitted, not yet in the target cache)
    feed: jax.Array  # int32[B, 2]: tokens the draft cache still has to take (pending x_K and/or x0)
    feed_count: jax.Array  # int32[B] in {1, 2}
    out: jax.Array  # int32[B, out_len]
    n: jax.Array  # int32[B]: tokens emitted so far
    done: jax.Array  # bool[B]
    key: jax.Array
    calls: jax.Array  # int32[]: batched target calls in the loop
    live_calls: jax.Array  # int32[B]
    drafts: jax.Array  # int32[]: draft blocks (one per live request per cycle)
    accepted: jax.Array  # int32[]
    per_position: jax.Array  # int32[K]
    verified: Any = None  # int32[] drafts verified (sd with a confidence cut; None: every cycle verifies all K)


def start_drafting(target_cfg, drafter, target_params, draft_params, inp: ProgramInputs, spec: StaticSpec, rows: int,
                   suffix_len: int | None = None):
    """Prefill the target (`rows` cache rows per request) and build the drafter's state from the prompt (with
    the target's hidden states of the prompt, if the drafter asks). With `suffix_len` both keep the prompt once
    per request as a shared prefix (`engine.prefill`). Returns (last logits [B*rows, V], target cache, drafter
    state)."""
    hl = drafter.hidden_layers
    pre = prefill(target_cfg, target_params, inp.prompt, inp.prompt_len, spec.cache_len, rows, hidden_layers=hl,
                  suffix_len=suffix_len)
    last, tcache = pre[0], pre[1]
    share = suffix_len is not None and drafter.shares_prefix
    dstate = drafter.init(draft_params, inp.prompt, inp.prompt_len, spec.cache_len, rows, pre[2] if hl else None,
                          **({"suffix_len": suffix_len} if share else {}))
    return last, tcache, dstate


def start(target_cfg, drafter, target_params, draft_params, inp: ProgramInputs, spec: StaticSpec, rows: int):
    """Prefill the target and the drafter (`rows` rows per request) and sample the first token per request."""
    last, tcache, dcache = start_drafting(target_cfg, drafter, target_params, draft_params, inp, spec, rows)
    return initial_state(inp, spec, last, tcache, dcache, rows)


def initial_state(inp: ProgramInputs, spec: StaticSpec, last, tcache, dstate, rows: int = 1) -> SDState:
    """The loop's first state after the prefill: the first token per request sampled from the prefill's last logits
    `last [B*rows, V]` with `inp.key`, outputs, feeds and zeroed counters."""
    B, K = spec.batch, spec.num_speculative_tokens
    key, sub = jax.random.split(inp.key)
    tok = sample(sub, process_logits(last[::rows], inp.sampling))  # one first token per request
    out = jnp.full((B, spec.out_len), -1, jnp.int32).at[:, 0].set(tok)
    n = jnp.ones((B,), jnp.int32)
    done = is_stop(tok, inp.stop_ids) | (n >= inp.max_new_tokens)
    feed, feed_count = initial_feed(tok)
    zero = jnp.int32(0)
    return SDState(tcache, dstate, tok, feed, feed_count, out, n, done, key, zero, jnp.zeros((B,), jnp.int32),
                  zero, zero, jnp.zeros((K,), jnp.int32))


def finish_cycle(s: SDState, inp: ProgramInputs, K: int, n_acc, path, c, tlen_before, dlen_before):
    """Emit path[:n] + [c] for live rows (clipped to max_new_tokens and the first stop token), update
    pending token / feed / done / stats. Returns (state without caches updated, new target lengths,
    new draft lengths), all per request."""
    live = ~s.done
    new = jnp.concatenate([path, jnp.zeros_like(path[:, :1])], axis=1)  # [B, K+1]
    new = jnp.where(jnp.arange(K + 1)[None, :] == n_acc[:, None], c[:, None], new)
    count = jnp.minimum(n_acc + 1, inp.max_new_tokens - s.n)
    count, stopped = first_stop_count(new, count, inp.stop_ids)
    count = jnp.where(live, count, 0)
    out = write_tokens(s.out, s.n, new, count)
    n = s.n + count
    done = s.done | (live & stopped) | (n >= inp.max_new_tokens)

    full = n_acc == K
    tlen = jnp.where(live, tlen_before + 1 + n_acc, tlen_before)
    feed_count = jnp.where(live, jnp.where(full, 2, 1), s.feed_count)
    next_feed = jnp.where(full[:, None], jnp.stack([path[:, K - 1], c], axis=1),
                          jnp.stack([c, jnp.zeros_like(c)], axis=1))
    feed = jnp.where(live[:, None], next_feed, s.feed)
    dlen = jnp.where(live, tlen + 1 - feed_count, dlen_before)
    tok = jnp.where(live, c, s.tok)

    n_live = jnp.sum(live.astype(jnp.int32))
    acc_live = jnp.where(live, n_acc, 0)
    per_position = s.per_position + jnp.sum(
        (live[:, None] & (n_acc[:, None] > jnp.arange(K)[None, :])).astype(jnp.int32), axis=0)
    s = s._replace(tok=tok, feed=feed, feed_count=feed_count, out=out, n=n, done=done, calls=s.calls + 1,
                   live_calls=s.live_calls + live, drafts=s.drafts + n_live,
                   accepted=s.accepted + jnp.sum(acc_live), per_position=per_position)
    return s, tlen, dlen


def program_result(s: SDState, K: int, drafter):
    """The program's output dict (tokens, lengths, stats) from the final state, as `decode` unpacks it."""
    return {"tokens": s.out, "lengths": s.n,
            "stats": {"num_target_calls": s.calls, "live_calls": s.live_calls,
                      "num_draft_calls": drafter.calls_per_proposal(K) * s.calls,  # batched drafter calls
                      "num_drafts": s.drafts,
                      "num_draft_tokens": K * s.drafts if s.verified is None else s.verified,
                      "num_accepted_tokens": s.accepted, "accepted_per_position": s.per_position}}


def verify_chain(target_cfg, target_params, target_cache, tok, x, logq, live, k_accept, k_corr, sampling,
                 hidden_layers=()):
    """One `sd` verification: the target's call on [x0, x1..xK] for live rows, the acceptance test on each drafted
    token and the correction/bonus token. `x [B, K]` was drafted with log q `logq [B, K, V]`.

    Returns (n accepted [B], correction c [B], the verified block [B, K+1], the target cache after the call,
    the target's hidden states of `hidden_layers` (or None), p [B, K+1, V], q [B, K, V])."""
    B, K = x.shape
    block = jnp.concatenate([tok[:, None], x], axis=1)
    logits, tcache, hidden = verify_call(target_cfg, target_params, block, target_cache,
                                         jnp.where(live, K + 1, 0), hidden_layers)
    p = jnp.exp(process_logits(logits, sampling))  # [B, K+1, V]
    q = jnp.exp(logq)  # [B, K, V]
    n_acc, r = chain_accept(p, q, x, jax.random.uniform(k_accept, (B, K)))
    c = sample_probs(k_corr, r)
    return n_acc, c, block, tcache, hidden, p, q


def verify_widths(K: int) -> tuple[int, ...]:
    """The static verification widths a cut cycle may use (flex's; `sd` adds 0: `cut_widths`): 1, 2, 4, ... below K,
    and K. A cycle verifies min{w : w >= max L over live rows} drafts, so one compiled program covers every cut (no
    recompiles)."""
    widths, w = [], 1
    while w < K:
        widths.append(w)
        w *= 2
    return tuple(widths) + (K,)


def width_index(L, live, widths):
    """Index into `widths` of the narrowest width holding every live row's L (0 when no row is live)."""
    need = jnp.max(jnp.where(live, L, 0))
    return jnp.sum(jnp.asarray(widths, jnp.int32) < need).astype(jnp.int32)


def pad_to(x, n, axis=1):
    """`x` zero-padded along `axis` to length n (a narrow call's outputs in a wide branch's shape)."""
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, n - x.shape[axis])
    return jnp.pad(x, pad)


def cut_widths(K: int) -> tuple[int, ...]:
    """The static verification widths of `sd`'s confidence cut: 0 (a plain target step), 1, 2, 4, ... below K, and
    K. A cycle verifies the narrowest that holds every live row's cut length, so one program covers every cut."""
    return (0,) + verify_widths(K)


def confidence_lengths(prop, cut: float):
    """Drafts to verify per row `[B]` in [0, K]: L = #{i : prod_{j<=i} c_j >= cut}, with c_j the drafter's top-1
    probability at temperature 1 at position j (`Proposal.confidence`), or max q_j where the drafter reports none.
    It reads the drafter only, never the target, so verifying a prefix of the drafts leaves `sd` exact."""
    conf = prop.confidence if prop.confidence is not None else jnp.max(prop.logq, axis=-1)
    cum = jnp.cumsum(conf.astype(jnp.float32), axis=1)
    return jnp.sum(cum >= jnp.log(jnp.float32(cut)), axis=1).astype(jnp.int32)


def verify_cut(target_cfg, target_params, target_cache, tok, x, logq, live, lengths, k_accept, k_corr, sampling,
               hidden_layers=()):
    """`verify_chain` with only each row's first `lengths[r]` drafts tried: the target's call covers the narrowest of
    `cut_widths(K)` holding every live row's length (one `lax.switch` branch per width; width 0 is a plain target
    step on x0). Returns what `verify_chain` returns, padded to K + 1 positions."""
    B, K = x.shape
    widths = cut_widths(K)
    block = jnp.concatenate([tok[:, None], x], axis=1)

    def branch(w):
        def call(cache):
            logits, cache, hidden = verify_call(target_cfg, target_params, block[:, :w + 1], cache,
                                                jnp.where(live, w + 1, 0), hidden_layers)
            return pad_to(logits, K + 1), cache, (None if hidden is None else pad_to(hidden, K + 1))
        return call

    logits, tcache, hidden = jax.lax.switch(width_index(lengths, live, widths), [branch(w) for w in widths],
                                            target_cache)
    p = jnp.exp(process_logits(logits, sampling))  # [B, K+1, V]: positions past the width are padding (never read)
    q = jnp.exp(logq)
    n_acc, r = chain_accept(p, q, x, jax.random.uniform(k_accept, (B, K)), lengths=lengths)
    c = sample_probs(k_corr, r)
    return n_acc, c, block, tcache, hidden, p, q


# ----------------------------------------------------------------------------- sd

def program_parts(target_cfg, drafter, spec: StaticSpec) -> ProgramParts:
    """Speculative decoding with one draft per request (Leviathan et al. 2023; Chen et al. 2023), as
    init / cycle / finish (`smcsd.runtime.ProgramParts`)."""
    K = spec.num_speculative_tokens
    cut = spec.confidence_cut
    drafter = as_drafter(drafter)

    def init(target_params, draft_params, inp: ProgramInputs) -> SDState:
        s = start(target_cfg, drafter, target_params, draft_params, inp, spec, rows=1)
        return s._replace(verified=jnp.int32(0)) if cut else s

    def cycle(target_params, draft_params, inp: ProgramInputs, s: SDState) -> SDState:
        key, k_draft, k_accept, k_corr = jax.random.split(s.key, 4)
        live = ~s.done
        tlen_before, dlen_before = s.target_cache.lengths, drafter.lengths(s.draft_state)
        prop = drafter.propose(draft_params, s.draft_state, s.feed, s.feed_count, k_draft, inp.draft_sampling, K)
        x = prop.tokens  # [B, K]
        if cut:  # verify only the drafts the drafter is confident in (0..K of them)
            L = confidence_lengths(prop, cut)
            n_acc, c, block, tcache, hidden, p, q = verify_cut(target_cfg, target_params, s.target_cache, s.tok, x,
                                                               prop.logq, live, L, k_accept, k_corr, inp.sampling,
                                                               drafter.hidden_layers)
            s = s._replace(verified=s.verified + jnp.sum(jnp.where(live, L, 0)))
        else:
            n_acc, c, block, tcache, hidden, p, q = verify_chain(target_cfg, target_params, s.target_cache, s.tok,
                                                                 x, prop.logq, live, k_accept, k_corr, inp.sampling,
                                                                 drafter.hidden_layers)

        s = s._replace(key=key)
        s, tlen, dlen = finish_cycle(s, inp, K, n_acc, x, c, tlen_before, dlen_before)
        dstate = drafter.observe(draft_params, prop.state, block, hidden, tlen_before,
                                 jnp.where(live, n_acc + 1, 0))
        dstate = drafter.feedback(dstate, p, q, n_acc, live)  # online adaptation, for drafters that learn
        return s._replace(target_cache=tcache.set_lengths(tlen), draft_state=drafter.set_lengths(dstate, dlen))

    def finish(inp: ProgramInputs, s: SDState) -> dict:
        del inp
        return program_result(s, K, drafter)

    return ProgramParts(init, cycle, finish)


def build_sd(target_cfg, drafter, spec: StaticSpec):
    return loop_program(program_parts(target_cfg, drafter, spec))


def headroom(num_speculative_tokens, num_particles, tree=None):
    """A cycle writes K+1 target tokens (and emits up to K+1) past a live row's position."""
    del num_particles, tree
    return num_speculative_tokens + 1


DEFINITION = register_method(MethodDef(name="sd", build=build_sd, needs_draft=True, headroom=headroom,
                                       parts=program_parts, takes_cut=True))


def check_cut(owner: str, value):
    """None, or a confidence cut in [0, 1) as a float, else a ValueError naming `owner(confidence_cut=...)`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < 1:
        raise ValueError(f"{owner}(confidence_cut={value!r}): confidence_cut must be a number in [0, 1) (0 verifies "
                         "all K drafts every cycle; 0.3 verifies drafts while the product of the drafter's top-1 "
                         "probabilities stays >= 0.3)")
    return float(value)


@dataclasses.dataclass(frozen=True, repr=False)
class SD(ChainMethod):
    """`sd`: exact speculative decoding with one chain of `num_speculative_tokens` drafts per cycle, of which only
    the first L are verified when `confidence_cut` > 0 (L = the drafts whose cumulative top-1 confidence under the
    drafter stays >= the cut, 0..K; the target's call shrinks with L: docs/methods.md)."""

    name: ClassVar[str] = "sd"
    confidence_cut: float | None = None

    def __post_init__(self):
        super().__post_init__()
        check_cut("SD", self.confidence_cut)
