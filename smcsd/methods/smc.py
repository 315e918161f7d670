"""`smc`: SMC speculative decoding (SMC-SD) — N draft particles per request, importance weights,
ESS-triggered resampling, no rollback. Approximate, consistent as N grows (DESIGN.md, "SMC-SD").

Rows: B requests x N particles = R = B*N rows; request b owns rows b*N .. b*N+N-1. Each model
prefills a request once and broadcasts its cache to the N rows. One *cycle* per loop step:

1. draft x_1..x_K ~ q for all R rows (`drafter.propose`, at `inp.draft_sampling`);
2. ONE target call on [x_0..x_K] for all rows (R*(K+1) tokens);
3. weight, in float32 log space, over the tokens the particle *emits* this cycle:
   Δℓ = Σ_k [α·log p_T(x_k|·) − log q(x_k|·)] + log Z_α (bonus step, only when α ≠ 1),
   Z_α = Σ_v p_T(v|·)^α at position K;
4. bonus b ~ normalise(p_T^α) at position K, the next cycle's x_0 — every live particle gains
   K+1 tokens, nothing is rejected or rolled back;
5. per request: ESS test (threshold τ = inp.ess_threshold), resampling by `spec.resampler`
   (`resample.maybe_resample`); particles (output tokens, lengths, both caches, pending tokens,
   draft feeds, done flags) are gathered by ancestor, ℓ resets to 0 and
   log Ẑ_b += logsumexp(ℓ_b) − log N. Only requests with tokens left to emit are resampled: after a
   request's last cycle its output is drawn ∝ exp(ℓ) directly (the same law as resampling and
   then picking uniformly, with less variance; it also keeps select="argmax" and the returned
   weights meaningful). So τ = 1 resamples after every cycle except a request's last. The ESS is
   recorded for every request every cycle (a finished request's weights no longer change).

Conventions (why the weights are right):
- The target is the tempered sequence law π(y) ∝ Π_t p_T(y_t|y_<t)^α over the *emitted* sequence
  y, which ends at its first stop token or at max_new_tokens (exactly `ar`'s output law when α = 1).
  Every emitted token is proposed by q (drafts) or by normalise(p_T^α) (x_0 and bonuses), so the
  weight of an emitted draft token is α·log p_T − log q and of an emitted bonus token log Z_α.
- EOS is absorbing and max_new_tokens truncates: tokens after a particle's first stop token, or
  past max_new_tokens in the last cycle, are not emitted and add nothing to ℓ (they are sampled
  after the emitted ones, so leaving them out is exactly marginalising them away). A done
  particle's weight stops changing; it rides along (its rows keep computing, its output does not).
- The first token x_0 is drawn from normalise(p_T^α) after prefill, independently per particle
  (= p_T at α = 1, as DESIGN.md says). Its normaliser Z_α(prompt) is the same for all N particles
  of a request, so it goes straight into log Ẑ_b instead of ℓ (ℓ starts at 0).
- log Ẑ_b (stats "log_z") = log Z_α(prompt) + Σ_resamplings [logsumexp(ℓ_b) − log N]
  + [logsumexp(ℓ_b,final) − log N]: the final term is always added, so log Ẑ is the complete SMC
  estimate of log Σ_y Π_t p_T(y_t)^α. At α = 1 the target is normalised and E[Ẑ_b] = 1 exactly
  (when q covers p_T's support, e.g. no top-k/top-p); adaptive (ESS) resampling keeps this.
- The returned log_weights are the final ℓ (relative to the request's last resampling).
- A particle whose draft has zero target probability (top-k/top-p, or temperature 0 where p_T is
  one-hot) gets ℓ = −inf and is never resampled or selected. If all N particles of a request are
  −inf, the resampler falls back to uniform (resample/), log Ẑ_b becomes −inf and the request is
  flagged in stats all_weights_neg_inf. ℓ is never +inf and never NaN.
- Temperature 0: p_T is a point mass, so a particle keeps a finite ℓ iff every draft token it
  emitted is the target's argmax (ℓ = 0 with a greedy draft, −Σ log q otherwise), else −inf;
  x_0 and bonuses are the target's argmax. Any request not flagged all_weights_neg_inf therefore
  outputs exactly the target's greedy decode. With a greedy draft all N particles are identical,
  so one disagreement between the draft's and the target's argmax kills the whole request (flagged;
  it then outputs a draft path, never NaN); a stochastic draft (draft_temperature > 0) lets SMC
  search for the greedy path among N particles. For exact greedy decoding use `ar` or `sd`.
- N = 1 reduces to plain "draft blocks plus target bonus tokens": x_0 ~ p_T^α, then per cycle K
  draft tokens from q and one bonus token from p_T^α; no correction at all (ESS = 1 = N always).
- Stats: num_target_calls = cycles (exactly one target call per cycle); num_draft_calls = K per
  cycle; num_drafts / num_draft_tokens / num_accepted_tokens / accepted_per_position count per
  *live particle* (all N of each request). SMC keeps every draft token it proposes, so
  "accepted" = draft tokens that were emitted (all of them, except those cut by EOS/truncation).
  ess_per_cycle / resampled_per_cycle are fixed [out_len // (K+1) + 1, B] buffers; the host keeps
  the first num_target_calls rows.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import contextlib
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp

from typing import Any

from smcsd.models import KVCache
from smcsd.models.sharding import active_layout
from smcsd.resample import maybe_resample, normalize

from ..drafters import as_drafter, initial_feed
from .base import Method, check_count, check_real
from ..runtime.engine import MethodDef, MethodOptions, ProgramInputs, ProgramParts, StaticSpec, first_stop_count, is_stop, \
    loop_program, register_method, verify_call, write_tokens
from .sd import start_drafting
from ..sampling import process_logits, sample


class SMCState(NamedTuple):
    """Everything the decode loop carries; rows are request-major (b*N + i)."""

    cache_t: KVCache  # target cache: prompt + emitted tokens except the pending one
    cache_d: Any  # drafter state (a KVCache for ARDrafter): lags by feed_count tokens
    feed: jax.Array  # int32[R, 2] pending draft feed (x_0, or [x_K, b])
    feed_count: jax.Array  # int32[R] in {1, 2}
    pending: jax.Array  # int32[R] x_0 of the next cycle (already emitted, not yet in the target cache)
    out: jax.Array  # int32[R, out_len] emitted tokens, -1 past n
    n: jax.Array  # int32[R] emitted tokens
    done: jax.Array  # bool[R] stop token emitted or max_new_tokens reached
    log_w: jax.Array  # float32[R] ℓ since the request's last resampling
    log_z: jax.Array  # float32[B] running log Ẑ
    key: jax.Array
    cycle: jax.Array  # int32[] cycles run = target calls
    ancestors: jax.Array  # int32[R] global ancestor rows of the last cycle (identity if none)
    live_calls: jax.Array  # int32[B]
    num_drafts: jax.Array  # int32[B]
    num_draft_tokens: jax.Array  # int32[B]
    num_accepted: jax.Array  # int32[B]
    accepted_per_position: jax.Array  # int32[K]
    ess: jax.Array  # float32[C, B]
    resampled: jax.Array  # bool[C, B]
    num_resamples: jax.Array  # int32[B]
    neg_inf: jax.Array  # bool[B]


_SHARING = [True]  # prefix_sharing's switch


def share_prefix() -> bool:
    """Whether particles read their request's prompt KV from one shared copy (DESIGN.md, "SMC-SD"): always,
    except on a mesh, where a cache's rows are data-sharded and the shared prefix is not (yet), and inside
    `prefix_sharing(False)`."""
    return _SHARING[-1] and active_layout() is None


@contextlib.contextmanager
def prefix_sharing(on: bool):
    """Programs built inside keep the prompt once per request (on) or copy it into every particle (off: the old
    layout, for comparisons in tests and experiments/bench/profile_smc.py). The compile cache is cleared on entry and
    exit, since the switch is not part of a program's key."""
    from ..runtime.engine import clear_compile_cache
    _SHARING.append(bool(on))
    clear_compile_cache()
    try:
        yield
    finally:
        _SHARING.pop()
        clear_compile_cache()


def max_cycles(spec: StaticSpec) -> int:
    """Static size of the per-cycle stat buffers; >= ceil((max_new - 1) / (K+1)) for any max_new <= out_len."""
    return spec.out_len // (spec.num_speculative_tokens + 1) + 1


def tempered_logp(logp, alpha):
    """α·log p_T; exactly log p_T at α = 1 (no float noise), −inf stays −inf (α > 0)."""
    return jnp.where(alpha == 1.0, logp, alpha * logp)


def _log_norm(tempered, alpha):
    """log Z_α = logsumexp(α·log p_T); exactly 0 at α = 1."""
    return jnp.where(alpha == 1.0, 0.0, jax.nn.logsumexp(tempered, axis=-1))


def weight_increment(lp, lq, alpha):
    """Log weight of an emitted draft token, α·log p_T(x) − log q(x): −inf where p_T(x) = 0, never NaN
    (q(x) > 0 for a token sampled from q, so −inf − (−inf) cannot arise; mapped to −inf regardless)."""
    inc = tempered_logp(lp, alpha) - lq
    return jnp.where(jnp.isnan(inc), -jnp.inf, inc)


def program_parts(target_cfg, drafter, spec: StaticSpec) -> ProgramParts:
    """`(init, cycle, finish)`: the program is `finish(while_loop(live, cycle, init(...)))`.

    Exposed separately so tests can run single cycles and inspect the particle state.
    init(target_params, draft_params, inp) -> SMCState
    cycle(target_params, draft_params, inp, state) -> SMCState
    finish(inp, state) -> raw output dict (as `decode._unpack` reads it)
    """
    B, N, K, out_len = spec.batch, spec.num_particles, spec.num_speculative_tokens, spec.out_len
    R, C = B * N, max_cycles(spec)
    # a Drafter, or a draft model's ModelConfig (tests, experiments); the proposal that covers p_T's support
    drafter = as_drafter(drafter).importance_proposal()
    log_n = jnp.log(jnp.float32(N))
    rows_of = (jnp.arange(B, dtype=jnp.int32) * N)[:, None]  # [B, 1]: first global row of each request

    def init(target_params, draft_params, inp: ProgramInputs) -> SMCState:
        # the prompt's KV once per request (shared prefix; not on a mesh, where rows are data-sharded)
        suffix_len = spec.out_len if share_prefix() else None
        last, cache_t, cache_d = start_drafting(target_cfg, drafter, target_params, draft_params, inp, spec, N,
                                                suffix_len)
        key, sub = jax.random.split(inp.key)
        tempered = tempered_logp(process_logits(last, inp.sampling), inp.alpha)  # [R, V]
        x0 = sample(sub, tempered)  # independent per particle
        log_z = _log_norm(tempered, inp.alpha).reshape(B, N)[:, 0]
        feed, feed_count = initial_feed(x0)
        out = jnp.full((R, out_len), -1, jnp.int32).at[:, 0].set(x0)
        n = jnp.ones((R,), jnp.int32)
        done = is_stop(x0, inp.stop_ids) | (n >= inp.max_new_tokens)
        zi = jnp.zeros((B,), jnp.int32)
        return SMCState(cache_t=cache_t, cache_d=cache_d, feed=feed, feed_count=feed_count, pending=x0, out=out,
                        n=n, done=done, log_w=jnp.zeros((R,), jnp.float32), log_z=log_z.astype(jnp.float32),
                        key=key, cycle=jnp.int32(0), ancestors=jnp.arange(R, dtype=jnp.int32), live_calls=zi,
                        num_drafts=zi, num_draft_tokens=zi, num_accepted=zi,
                        accepted_per_position=jnp.zeros((K,), jnp.int32),
                        ess=jnp.zeros((C, B), jnp.float32), resampled=jnp.zeros((C, B), bool),
                        num_resamples=zi, neg_inf=jnp.zeros((B,), bool))

    def cycle(target_params, draft_params, inp: ProgramInputs, s: SMCState) -> SMCState:
        key, k_draft, k_bonus, k_res = jax.random.split(s.key, 4)
        live = ~s.done  # [R] particles live at the start of the cycle
        req_live = jnp.any(live.reshape(B, N), axis=1)

        # 1. draft K tokens on every row
        prop = drafter.propose(draft_params, s.cache_d, s.feed, s.feed_count, k_draft, inp.draft_sampling, K)
        x = prop.tokens  # [R, K]
        # 2. one target call on [x_0 .. x_K] (with the hidden states the drafter asks for)
        block = jnp.concatenate([s.pending[:, None], x], axis=1)  # [R, K+1]
        start = s.cache_t.lengths
        logits, cache_t, hidden = verify_call(target_cfg, target_params, block, s.cache_t,
                                              hidden_layers=drafter.hidden_layers)
        logp = process_logits(logits, inp.sampling)  # [R, K+1, V]
        # 4. bonus from normalise(p_T^α) at position K
        tempered_bonus = tempered_logp(logp[:, K], inp.alpha)
        bonus = sample(k_bonus, tempered_bonus)
        new = jnp.concatenate([x, bonus[:, None]], axis=1)  # [R, K+1] tokens this cycle may emit
        # emitted: live rows only, cut at max_new_tokens, then at the first stop token (inclusive)
        count = jnp.where(live, jnp.clip(inp.max_new_tokens - s.n, 0, K + 1), 0)
        count, stopped = first_stop_count(new, count, inp.stop_ids)
        # 3. weight over the emitted tokens only
        lp = jnp.take_along_axis(logp[:, :K], x[..., None], axis=-1)[..., 0]
        lq = jnp.take_along_axis(prop.logq, x[..., None], axis=-1)[..., 0]
        emitted_draft = jnp.arange(K)[None, :] < count[:, None]  # [R, K]
        delta = jnp.sum(jnp.where(emitted_draft, weight_increment(lp, lq, inp.alpha), 0.0), axis=1)
        delta = delta + jnp.where(count == K + 1, _log_norm(tempered_bonus, inp.alpha), 0.0)
        log_w = s.log_w + delta
        out = write_tokens(s.out, s.n, new, count)
        n = s.n + count
        done = s.done | stopped | (n >= inp.max_new_tokens)
        feed = jnp.stack([x[:, K - 1], bonus], axis=1)
        feed_count = jnp.full((R,), 2, jnp.int32)

        # stats of this cycle
        live_i = live.astype(jnp.int32).reshape(B, N)
        emitted_i = (emitted_draft & live[:, None]).astype(jnp.int32)
        num_drafts = s.num_drafts + live_i.sum(1)
        num_draft_tokens = s.num_draft_tokens + K * live_i.sum(1)
        num_accepted = s.num_accepted + emitted_i.sum(1).reshape(B, N).sum(1)
        accepted_per_position = s.accepted_per_position + emitted_i.sum(0)

        # 5. per-request ESS test and resampling (only requests with a live particle left)
        lw = log_w.reshape(B, N)
        res = jax.vmap(lambda k, l: maybe_resample(k, l, inp.ess_threshold, spec.resampler))(
            jax.random.split(k_res, B), lw)
        still_live = ~jnp.all(done.reshape(B, N), axis=1)
        resampled = res.resampled & still_live
        local = jnp.where(resampled[:, None], res.ancestors, jnp.arange(N, dtype=jnp.int32)[None, :])
        ancestors = (local + rows_of).reshape(R)
        log_z = s.log_z + jnp.where(resampled, jax.nn.logsumexp(lw, axis=1) - log_n, 0.0)
        log_w = jnp.where(resampled[:, None], 0.0, lw).reshape(R)

        # the drafter sees every token of the block (x_0..x_K are all context now; a done row's are stale)
        cache_d = drafter.observe(draft_params, prop.state, block, hidden, start, jnp.where(live, K + 1, 0))
        moved = (cache_t, feed, feed_count, bonus, out, n, done)
        moved, cache_d = jax.lax.cond(
            jnp.any(resampled),
            lambda m, d: (jax.tree_util.tree_map(lambda a: take_rows(a, ancestors), m,
                                                 is_leaf=lambda a: isinstance(a, KVCache)),
                          drafter.gather(d, ancestors)),
            lambda m, d: (m, d), moved, cache_d)
        cache_t, feed, feed_count, pending, out, n, done = moved

        c = s.cycle
        return SMCState(cache_t=cache_t, cache_d=cache_d, feed=feed, feed_count=feed_count, pending=pending,
                        out=out, n=n, done=done, log_w=log_w, log_z=log_z, key=key, cycle=c + 1,
                        ancestors=ancestors, live_calls=s.live_calls + req_live.astype(jnp.int32),
                        num_drafts=num_drafts, num_draft_tokens=num_draft_tokens, num_accepted=num_accepted,
                        accepted_per_position=accepted_per_position,
                        ess=s.ess.at[c].set(res.ess.astype(jnp.float32), mode="drop"),
                        resampled=s.resampled.at[c].set(resampled, mode="drop"),
                        num_resamples=s.num_resamples + resampled.astype(jnp.int32),
                        neg_inf=s.neg_inf | res.degenerate)

    def finish(inp: ProgramInputs, s: SMCState) -> dict:
        lw = s.log_w.reshape(B, N)
        degenerate = jnp.all(lw == -jnp.inf, axis=1)
        log_z = s.log_z + jax.nn.logsumexp(lw, axis=1) - log_n
        if spec.select == "argmax":
            pick = jnp.argmax(lw, axis=1).astype(jnp.int32)  # all −inf -> particle 0 (flagged)
        else:  # "sample": ∝ exp(ℓ); uniform if every particle is −inf (flagged)
            _, k_sel = jax.random.split(s.key)
            pick = jax.random.categorical(k_sel, jax.vmap(normalize)(lw), axis=-1).astype(jnp.int32)
        rows = rows_of[:, 0] + pick
        raw = {"tokens": s.out[rows], "lengths": s.n[rows],
               "stats": {"num_target_calls": s.cycle, "live_calls": s.live_calls,
                         "num_draft_calls": drafter.calls_per_proposal(K) * s.cycle, "num_drafts": s.num_drafts,
                         "num_draft_tokens": s.num_draft_tokens, "num_accepted_tokens": s.num_accepted,
                         "accepted_per_position": s.accepted_per_position,
                         "ess_per_cycle": s.ess, "resampled_per_cycle": s.resampled,
                         "num_resamples": s.num_resamples, "log_z": log_z,
                         "all_weights_neg_inf": s.neg_inf | degenerate}}
        if spec.return_particles:
            raw["particles"] = s.out.reshape(B, N, out_len)
            raw["particle_lengths"] = s.n.reshape(B, N)
            raw["log_weights"] = lw
        return raw

    return ProgramParts(init, cycle, finish)


def take_rows(a, index):
    if isinstance(a, KVCache):
        return a.gather(index)
    return jnp.take(a, index, axis=0)


def build_smc(target_cfg, drafter, spec: StaticSpec):
    return loop_program(program_parts(target_cfg, drafter, spec))


# Cache headroom: the last cycle writes up to K tokens past max_new_tokens (target: x_0..x_K; the
# emitted count is cut, the writes are not), so K extra slots keep every write in bounds.
SMC_PROPOSAL = "smc-proposal"  # the drafter name of a pair's proposal trained for SMC (experiments/train/smc_proposal.py)


def pair_proposal(target):
    """(target, its pair's proposal trained for SMC) for `decode(method="smc")` without a draft, or None when the
    pair ships none (decode then takes the pair's default drafter)."""
    from ..pairs import pair_drafter
    return pair_drafter(target, SMC_PROPOSAL)


def configure(options: MethodOptions, drafter) -> MethodOptions:
    """smc's own checks: a known resampler; a warning when every particle would be the same greedy draft."""
    del drafter
    from smcsd.resample import get_resampler
    get_resampler(options.resampler)  # raises a clear error naming the valid resamplers
    if options.temperature == 0 and options.draft_temperature == 0:
        warnings.warn("smc at temperature 0 with a greedy draft: all particles are identical, and a single "
                      "draft token that differs from the target's argmax gives every particle weight -inf "
                      "(flagged in stats.all_weights_neg_inf). Use method='sd' for exact greedy decoding, or "
                      "set draft_temperature > 0 so particles explore.", stacklevel=3)
    return options


DEFINITION = register_method(MethodDef(name="smc", build=build_smc, needs_draft=True, headroom=lambda k, n, tree=None: k,
                                uses_particles=True, exact=False, resamples=True, pair_draft=pair_proposal,
                                configure=configure, parts=program_parts))


@dataclasses.dataclass(frozen=True, repr=False)
class SMC(Method):
    """`smc`: SMC speculative decoding — `num_particles` draft particles per request, `num_speculative_tokens` per
    cycle, resampled by `resampler` when the ESS falls below `ess_threshold`·N; targets p_T^`alpha`; the output
    particle is drawn ∝ its weight (`select="sample"`) or the heaviest (`"argmax"`). None: decode's default."""

    name: ClassVar[str] = "smc"
    num_particles: int | None = None
    num_speculative_tokens: int | None = None
    ess_threshold: float | None = None
    resampler: str | None = None
    alpha: float | None = None
    select: str | None = None
    return_particles: bool | None = None

    def __post_init__(self):
        check_count("SMC", "num_particles", self.num_particles)
        check_count("SMC", "num_speculative_tokens", self.num_speculative_tokens)
        check_real("SMC", "ess_threshold", self.ess_threshold, 0.0, 1.0, what=" (0 never resamples, 1 always)")
        check_real("SMC", "alpha", self.alpha, 0.0, None, low_open=True, what=" (1 targets p_T itself)")
        if self.resampler is not None:
            from smcsd.resample import get_resampler
            try:
                get_resampler(self.resampler)
            except (TypeError, ValueError, KeyError) as e:
                raise ValueError(f"SMC(resampler={self.resampler!r}): {e}") from None
        if self.select is not None and self.select not in ("sample", "argmax"):
            raise ValueError(f"SMC(select={self.select!r}): select must be 'sample' (a particle drawn by weight) "
                             "or 'argmax' (the heaviest)")
        if self.return_particles is not None and not isinstance(self.return_particles, bool):
            raise TypeError(f"SMC(return_particles={self.return_particles!r}): return_particles must be a bool")
