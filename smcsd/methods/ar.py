"""`ar`: autoregressive sampling from the target's processed distribution — the exact reference.

Prefill, then one target call per token in a `lax.while_loop`; rows that hit a stop token or
max_new_tokens stop advancing (their cache length is frozen) while the others go on.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from smcsd.models import KVCache, forward_cached

from .base import Method
from ..runtime.engine import MethodDef, ProgramInputs, ProgramParts, StaticSpec, is_stop, loop_program, prefill, \
    register_method, write_tokens
from ..sampling import sample_logits


class ARState(NamedTuple):
    """`ar`'s loop state."""

    cache: KVCache
    tok: jax.Array  # int32[B]: the last sampled token (not yet in the cache)
    out: jax.Array  # int32[B, out_len]
    n: jax.Array  # int32[B]: tokens emitted so far
    done: jax.Array  # bool[B]
    key: jax.Array
    calls: jax.Array  # int32[]: target calls in the loop
    live_calls: jax.Array  # int32[B]


def program_parts(target_cfg, draft_cfg, spec: StaticSpec) -> ProgramParts:
    """`ar` as init (prefill and the first token) / cycle (one target call, one token per live row) / finish."""
    del draft_cfg
    B, out_len = spec.batch, spec.out_len

    def init(target_params, draft_params, inp: ProgramInputs) -> ARState:
        del draft_params
        last, cache = prefill(target_cfg, target_params, inp.prompt, inp.prompt_len, spec.cache_len)
        key, sub = jax.random.split(inp.key)
        tok, _ = sample_logits(sub, last, inp.sampling)
        out = jnp.full((B, out_len), -1, jnp.int32).at[:, 0].set(tok)
        n = jnp.ones((B,), jnp.int32)
        done = is_stop(tok, inp.stop_ids) | (n >= inp.max_new_tokens)
        return ARState(cache, tok, out, n, done, key, jnp.int32(0), jnp.zeros((B,), jnp.int32))

    def cycle(target_params, draft_params, inp: ProgramInputs, s: ARState) -> ARState:
        del draft_params
        key, sub = jax.random.split(s.key)
        logits, cache = forward_cached(target_cfg, target_params, s.tok[:, None], s.cache,
                                       num_valid=(~s.done).astype(jnp.int32))
        new, _ = sample_logits(sub, logits[:, 0], inp.sampling)
        live = ~s.done
        out = write_tokens(s.out, s.n, new[:, None], live.astype(jnp.int32))
        n = s.n + live
        tok = jnp.where(live, new, s.tok)
        done = s.done | (live & is_stop(new, inp.stop_ids)) | (n >= inp.max_new_tokens)
        return ARState(cache, tok, out, n, done, key, s.calls + 1, s.live_calls + live)

    def finish(inp: ProgramInputs, s: ARState) -> dict:
        del inp
        return {"tokens": s.out, "lengths": s.n, "stats": {"num_target_calls": s.calls, "live_calls": s.live_calls}}

    return ProgramParts(init, cycle, finish)


def build_ar(target_cfg, draft_cfg, spec: StaticSpec):
    return loop_program(program_parts(target_cfg, draft_cfg, spec))


DEFINITION = register_method(MethodDef(name="ar", build=build_ar, needs_draft=False, headroom=lambda k, n, tree=None: 0,
                                       parts=program_parts))


@dataclasses.dataclass(frozen=True, repr=False)
class AR(Method):
    """`ar`: exact autoregressive decoding (no options: temperature / top_k / top_p are the target's, on decode)."""

    name: ClassVar[str] = "ar"
