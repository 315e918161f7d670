"""`sd-multi`: multi-draft speculative decoding, exact. N independent drafts per request are verified in one target
call and accepted by recursive rejection sampling down the draft tree (`smcsd.verify.rrs_walk`); the cycle's
bookkeeping is `sd`'s (smcsd/methods/sd.py), so `mean_acceptance_length` compares directly with it.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from ..drafters import as_drafter
from .base import Method, check_count
from ..runtime.engine import MethodDef, ProgramInputs, ProgramParts, StaticSpec, loop_program, register_method, verify_call
from ..sampling import process_logits
from ..verify import rrs_walk, sample_probs
from .sd import SDState, finish_cycle, headroom, program_result, start


def program_parts(target_cfg, drafter, spec: StaticSpec) -> ProgramParts:
    """Multi-draft speculative decoding: N independent drafts per request (rows b*N .. b*N+N-1), all
    B·N·(K+1) tokens verified in one target call, accepted by `verify.rrs_walk`; the winner's caches are
    then gathered to all N rows of its request and rolled back by lengths like `sd`."""
    B, K, N = spec.batch, spec.num_speculative_tokens, spec.num_particles
    drafter = as_drafter(drafter)

    def init(target_params, draft_params, inp: ProgramInputs) -> SDState:
        return start(target_cfg, drafter, target_params, draft_params, inp, spec, rows=N)

    def cycle(target_params, draft_params, inp: ProgramInputs, s: SDState) -> SDState:
        key, k_draft, k_accept, k_corr = jax.random.split(s.key, 4)
        live = ~s.done
        tlen_before, dlen_before = s.target_cache.lengths[::N], drafter.lengths(s.draft_state)[::N]
        prop = drafter.propose(draft_params, s.draft_state, jnp.repeat(s.feed, N, axis=0),
                               jnp.repeat(s.feed_count, N), k_draft, inp.draft_sampling, K)
        block = jnp.concatenate([jnp.repeat(s.tok, N)[:, None], prop.tokens], axis=1)  # [R, K+1]
        logits, tcache, hidden = verify_call(target_cfg, target_params, block, s.target_cache,
                                             jnp.repeat(jnp.where(live, K + 1, 0), N), drafter.hidden_layers)
        V = logits.shape[-1]
        p = jnp.exp(process_logits(logits, inp.sampling)).reshape(B, N, K + 1, V)
        q = jnp.exp(prop.logq).reshape(B, N, K, V)
        X = prop.tokens.reshape(B, N, K)
        u = jax.random.uniform(k_accept, (B, K, N))
        n_acc, path, r_final, winner = rrs_walk(X, p, q, u)
        c = sample_probs(k_corr, r_final)

        s = s._replace(key=key)
        # num_drafts counts one draft *tree* per live request per cycle (not N), so
        # mean_acceptance_length = 1 + accepted / num_drafts compares directly with `sd`.
        s, tlen, dlen = finish_cycle(s, inp, K, n_acc, path, c, tlen_before, dlen_before)
        # Every row of a request <- its winner. The rows share all slots before this cycle's
        # writes, so only the K+1 slots written this cycle are copied, not whole cache rows.
        rows = jnp.repeat(jnp.arange(B) * N + winner, N)
        tcache = tcache.copy_window(rows, jnp.repeat(tlen_before, N), K + 1).set_lengths(jnp.repeat(tlen, N))
        dstate = drafter.copy_window(prop.state, rows, jnp.repeat(dlen_before, N), K + 1)
        # The drafter observes the accepted path (the winner's block) on every row of the request.
        dstate = drafter.observe(draft_params, dstate, block[rows], None if hidden is None else hidden[rows],
                                 jnp.repeat(tlen_before, N), jnp.repeat(jnp.where(live, n_acc + 1, 0), N))
        return s._replace(target_cache=tcache, draft_state=drafter.set_lengths(dstate, jnp.repeat(dlen, N)))

    def finish(inp: ProgramInputs, s: SDState) -> dict:
        del inp
        return program_result(s, K, drafter)

    return ProgramParts(init, cycle, finish)


def build_sd_multi(target_cfg, drafter, spec: StaticSpec):
    return loop_program(program_parts(target_cfg, drafter, spec))


DEFINITION = register_method(MethodDef(name="sd-multi", build=build_sd_multi, needs_draft=True, headroom=headroom,
                                     uses_particles=True, parts=program_parts))


@dataclasses.dataclass(frozen=True, repr=False)
class SDMulti(Method):
    """`sd-multi`: exact, `num_particles` independent chains of `num_speculative_tokens` per request, verified
    together by recursive rejection sampling."""

    name: ClassVar[str] = "sd-multi"
    num_speculative_tokens: int | None = None  # K, draft tokens per cycle (None: the pair's default)
    num_particles: int | None = None  # N drafts per request (None: the pair's default)

    def __post_init__(self):
        check_count("SDMulti", "num_speculative_tokens", self.num_speculative_tokens)
        check_count("SDMulti", "num_particles", self.num_particles)
