import pytest
import os
import sys

# Tests share helpers (tests/toys.py) by plain import.
sys.path.insert(0, os.path.dirname(__file__))

# XLA:CPU compile time dominates this suite (5-12 s per decode program even for a one-layer toy). A persistent
# compilation cache lets the subprocesses (CLI, notebooks, experiments) and the later `-m slow` run reuse the programs
# an earlier process compiled. Set SMCSD_TEST_JAX_CACHE="" to turn it off. Environment variables, not jax.config, so
# the subprocesses inherit it.
_cache = os.environ.get("SMCSD_TEST_JAX_CACHE",
                        os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                     ".pytest_cache", "jax-compile"))
if _cache:
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _cache)
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")


@pytest.fixture
def accept_always(monkeypatch):
    """A broken acceptance rule (accept every draft token) for the exactness tests of sd, sd-multi and sd-tree to
    reject; programs compiled with it are dropped afterwards."""
    import jax.numpy as jnp

    from smcsd.runtime import engine
    from smcsd.verify import chain
    engine.clear_compile_cache()
    monkeypatch.setattr(chain, "accept_test", lambda u, p_x, q_x: jnp.ones(jnp.shape(u), bool))
    yield
    monkeypatch.undo()
    engine.clear_compile_cache()
