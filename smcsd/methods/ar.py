"""`ar`: autoregressive sampling from the target's processed distribution — the exact reference.

Prefill, then one target call per token in a `lax.while_loop`; rows that hit a stop token or
max_new_tokens stop advancing (their cache length is frozen) while the others go on.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from smcsd.models import forward_cached

from .base import Method
from ..runtime.engine import MethodDef, ProgramInputs, StaticSpec, is_stop, prefill, register_method, write_tokens
from ..sampling import sample_logits


def build_ar(target_cfg, draft_cfg, spec: StaticSpec):
    B, out_len = spec.batch, spec.out_len

    def program(target_params, draft_params, inp: ProgramInputs):
        del draft_params
        last, cache = prefill(target_cfg, target_params, inp.prompt, inp.prompt_len, spec.cache_len)
        key, sub = jax.random.split(inp.key)
        tok, _ = sample_logits(sub, last, inp.sampling)
        out = jnp.full((B, out_len), -1, jnp.int32).at[:, 0].set(tok)
        n = jnp.ones((B,), jnp.int32)
        done = is_stop(tok, inp.stop_ids) | (n >= inp.max_new_tokens)
        zeros = jnp.zeros((B,), jnp.int32)

        def cond(state):
            return ~jnp.all(state[4])

        def body(state):
            cache, tok, out, n, done, key, calls, live_calls = state
            key, sub = jax.random.split(key)
            logits, cache = forward_cached(target_cfg, target_params, tok[:, None], cache,
                                           num_valid=(~done).astype(jnp.int32))
            new, _ = sample_logits(sub, logits[:, 0], inp.sampling)
            live = ~done
            out = write_tokens(out, n, new[:, None], live.astype(jnp.int32))
            n = n + live
            tok = jnp.where(live, new, tok)
            done = done | (live & is_stop(new, inp.stop_ids)) | (n >= inp.max_new_tokens)
            return cache, tok, out, n, done, key, calls + 1, live_calls + live

        state = (cache, tok, out, n, done, key, jnp.int32(0), zeros)
        _, _, out, n, _, _, calls, live_calls = jax.lax.while_loop(cond, body, state)
        return {"tokens": out, "lengths": n,
                "stats": {"num_target_calls": calls, "live_calls": live_calls}}

    return program


DEFINITION = register_method(MethodDef(name="ar", build=build_ar, needs_draft=False, headroom=lambda k, n, tree=None: 0))


@dataclasses.dataclass(frozen=True, repr=False)
class AR(Method):
    """`ar`: exact autoregressive decoding (no options: temperature / top_k / top_p are the target's, on decode)."""

    name: ClassVar[str] = "ar"
