"""The SMC engine's shared prompt prefix (models.KVCache.share_prefix, cascade attention in
models.transformer.attend): rows that continue one prompt read its keys/values from one copy, and resampling
moves only what follows the prompt. A pure speed change: the same logits, the same particles."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import smcsd
from smcsd.models import forward_cached, init_cache, init_model
from smcsd.models.transformer import unstack_layers
from smcsd.decode import prepare
from smcsd.drafters import DFlashDrafter
from smcsd.methods.smc import prefix_sharing

from toys import tiny_config, tiny_pair


def _prefilled(cfg, params, prompt, plen, width, per_layer):
    cache = init_cache(cfg.num_hidden_layers, prompt.shape[0], width, cfg.num_key_value_heads, cfg.head_dim,
                       per_layer=per_layer)
    return forward_cached(cfg, params, prompt, cache, num_valid=plen)[1]


@pytest.mark.parametrize("per_layer", [pytest.param(False, marks=pytest.mark.slow),
                                       pytest.param(True, marks=pytest.mark.slow)])  # default-run budget
def test_shared_prefix_forward_matches_copied_rows(per_layer):
    """Three calls with gathers among each request's rows (resampling) and a window copy (sd-multi's winner):
    the shared-prefix cache gives the logits of a cache that copies the prompt into every row."""
    cfg = tiny_config(vocab=50, hidden=32, layers=2, heads=4, kv_heads=2, max_pos=128)
    model = init_model(cfg, 3, init_std=0.3)
    params = unstack_layers(model.params) if per_layer else model.params
    B, N, Tp = 2, 3, 9
    prompt = jax.random.randint(jax.random.PRNGKey(1), (B, Tp), 0, cfg.vocab_size)
    plen = jnp.array([9, 5], jnp.int32)  # ragged: request 1's prompt is padded
    copied = _prefilled(cfg, params, prompt, plen, 40, per_layer).repeat(N)
    shared = _prefilled(cfg, params, prompt, plen, Tp, per_layer).share_prefix(N, 24)
    assert shared.prefix.group == N and shared.slots == 24 and shared.max_len == 24 + Tp
    np.testing.assert_array_equal(shared.lengths, copied.lengths)
    forward = jax.jit(lambda p, t, c: forward_cached(cfg, p, t, c))  # one compile per cache form
    gathers = [jnp.array([2, 2, 0, 4, 3, 3]), jnp.array([1, 0, 2, 5, 5, 4]), None]
    for step, idx in enumerate(gathers):
        toks = jax.random.randint(jax.random.PRNGKey(10 + step), (B * N, 4), 0, cfg.vocab_size)
        a, copied = forward(params, toks, copied)
        b, shared = forward(params, toks, shared)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        assert float(jnp.max(jnp.abs(a))) > 0.1  # not trivially equal
        if idx is not None:
            copied, shared = copied.gather(idx), shared.gather(idx)
    # sd-multi's move: rows take row src's last 4 slots (positions from start on)
    src, start = jnp.array([1, 1, 1, 3, 3, 3]), copied.lengths - 4
    copied, shared = copied.copy_window(src, start, 4), shared.copy_window(src, start, 4)
    toks = jnp.ones((B * N, 4), jnp.int32)
    np.testing.assert_allclose(forward(params, toks, copied)[0], forward(params, toks, shared)[0],
                               rtol=1e-5, atol=1e-5)


def test_shared_prefix_is_stored_once():
    cfg = tiny_config(vocab=50, hidden=32, layers=2, heads=4, kv_heads=2, max_pos=128)
    model = init_model(cfg, 3)
    prompt = jnp.zeros((2, 16), jnp.int32)
    pre = _prefilled(cfg, model.params, prompt, jnp.array([16, 7]), 16, False)
    shared = pre.share_prefix(8, 4)
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4  # k and v, float32
    assert shared.nbytes == per_token * (2 * 16 + 16 * 4)  # the two prompts once + 16 rows x 4 slots of their own
    assert shared.prefix.k is pre.k  # not copied
    with pytest.raises(ValueError, match="already"):
        shared.repeat(2)
    with pytest.raises(ValueError, match="already has a shared prefix"):
        shared.share_prefix(2, 4)
    with pytest.raises(ValueError, match="slots"):
        pre.share_prefix(2, 0)


def _smc(target, draft, shared, **kw):
    with prefix_sharing(shared):
        return smcsd.decode([[1, 2, 3, 4, 5, 1, 2], [3, 1]], target=target, draft=draft, method="smc",
                            return_particles=True, eos_id=[], **kw)


@pytest.mark.parametrize("kind", [pytest.param("ar", marks=pytest.mark.slow),
                                  pytest.param("block", marks=pytest.mark.slow)])  # default-run budget
def test_smc_particles_do_not_depend_on_prefix_sharing(kind):
    """Same seed, same particles and weights with the prompt shared or copied per particle (always-resample, so
    every cycle gathers rows), for an AR drafter and a block drafter (whose context cache shares the prompt too)."""
    target, draft = tiny_pair(vocab=6)
    if kind == "block":
        draft = DFlashDrafter.create(target, block_size=4, seed=1, init_std=0.5)
    kw = dict(num_particles=4, num_speculative_tokens=3, max_new_tokens=11, ess_threshold=1.0, seed=5)
    on, off = _smc(target, draft, True, **kw), _smc(target, draft, False, **kw)
    assert on.particles == off.particles
    np.testing.assert_allclose(on.log_weights, off.log_weights, rtol=1e-4, atol=1e-4)
    assert on.stats.num_resamples == off.stats.num_resamples > 0
    assert len({tuple(p) for p in on.particles[0]}) > 1  # particles differ: a real test of the gathers


def _program_bytes(target, draft, num_particles, shared, prompt_len):
    """Temporary bytes of the compiled smc program (XLA's buffer assignment)."""
    with prefix_sharing(shared):
        p = prepare([[1] * prompt_len], target=target, draft=draft, method="smc", num_particles=num_particles,
                    num_speculative_tokens=2, max_new_tokens=8, eos_id=[])
        program = p.method.build(target.config, p.draft, p.spec)
        return jax.jit(program).lower(*p.args).compile().memory_analysis().temp_size_in_bytes, p.spec


@pytest.mark.slow  # ~50 s of compiles (four 2000-token programs); default-run budget
def test_smc_holds_one_copy_of_a_long_prompt():
    """A 2000-token prompt and N=64: the compiled program's memory grows with N by the particles' own slots only.
    Copying the prompt's KV per particle would add 63 copies (measured below as the contrast)."""
    cfg = tiny_config(vocab=6, hidden=32, layers=2, heads=2, kv_heads=2, max_pos=4096)
    target = init_model(cfg, 0, name="long-target")
    draft = init_model(tiny_config(vocab=6, hidden=16, layers=1, heads=1, kv_heads=1, max_pos=4096), 1)
    P = 2000
    one_n, spec = _program_bytes(target, draft, 1, True, P)
    many_n, _ = _program_bytes(target, draft, 64, True, P)
    copy = sum(2 * m.num_hidden_layers * m.num_key_value_heads * m.head_dim * 4 * spec.prompt_len
               for m in (target.config, draft.config))  # one copy of the prompt's KV, both models
    assert many_n - one_n < 0.25 * 63 * copy, (many_n - one_n, copy)
    one_c, _ = _program_bytes(target, draft, 1, False, P)
    many_c, _ = _program_bytes(target, draft, 64, False, P)
    assert many_c - one_c > 0.9 * 63 * copy, (many_c - one_c, copy)
