"""The drafter layer (smcsd/drafters): `ARDrafter` wraps today's draft models without changing a token,
`PromptLookup` keeps `sd` / `sd-multi` exact (chi-square against the enumerated p_T) and `smc` on its exact
finite-N law (computed from an independent NumPy reference of the lookup's q), a drafter that misreports its
q is caught by the same test, the target's hidden states reach `observe` from the verification call itself
and sit at the right positions, and bad drafters get clear errors."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

import smcsd
from smcsd.models import KVCache, forward_full
from smcsd.runtime import engine
from smcsd.methods import smc as smc_mod
from smcsd.drafters import ARDrafter, Drafter, PromptLookup, TokenHistory, as_drafter
from smcsd.drafters.base import Proposal
from toys import chi_square_pvalue, exact_distribution, sample_counts, tiny_pair, total_variation

P_MIN = 1e-3  # a correct sampler fails a chi-square test with probability 1e-3 (seeds are fixed anyway)
P_BROKEN = 1e-6  # a broken one must be rejected decisively


# ----------------------------------------------------------------------------- a NumPy reference of the lookup

def ref_lookup(seq, max_n, min_n):
    """The token after the latest earlier occurrence of the longest suffix n-gram (n = max_n..min_n), or None."""
    seq = list(seq)
    for n in range(max_n, min_n - 1, -1):
        if len(seq) < n + 1:
            continue
        suffix = seq[-n:]
        for j in range(len(seq) - 2, n - 2, -1):
            if seq[j - n + 1:j + 1] == suffix:
                return seq[j + 1]
    return None


def ref_logq(seq, V, max_n=3, min_n=1, floor=0.01):
    c = ref_lookup(seq, max_n, min_n)
    if c is None:
        return np.full(V, -math.log(V))
    q = np.full(V, floor / V)
    q[c] += 1 - floor
    return np.log(q)


def test_lookup_matches_reference():
    rng = np.random.default_rng(0)
    d = PromptLookup(max_ngram=3, min_ngram=1)
    rows = [rng.integers(0, 4, size=rng.integers(1, 14)).tolist() for _ in range(200)]
    rows += [[1, 2, 3, 9, 1, 2, 3], [5], [5, 5], [1, 2, 1, 3, 1, 2]]
    S = 16
    toks = np.full((len(rows), S), -1, np.int32)
    for i, r in enumerate(rows):
        toks[i, :len(r)] = r
    hist = TokenHistory(tokens=jnp.asarray(toks), lengths=jnp.asarray([len(r) for r in rows], jnp.int32))
    found, cand = jax.jit(d.lookup)(hist)
    for i, r in enumerate(rows):
        want = ref_lookup(r, 3, 1)
        assert bool(found[i]) == (want is not None), (r, want)
        if want is not None:
            assert int(cand[i]) == want, (r, want, int(cand[i]))
    assert ref_lookup([1, 2, 3, 9, 1, 2, 3], 3, 1) == 9 and ref_lookup([1, 2, 1, 3, 1, 2], 3, 1) == 1


def test_propose_samples_from_its_q():
    """Draws from `propose` follow the q it reports (each position, 20k rows), and the history advances like a
    KV cache (fed tokens + K-1 drafted)."""
    V, K, R = 5, 3, 20_000
    d = PromptLookup(floor=0.3, vocab=V)
    prompt = jnp.asarray([[0, 1, 2, 0, 1, 2, 0]] * R, jnp.int32)
    hist = d.init(None, prompt, jnp.full((R,), 6, jnp.int32), 16, 1)
    feed = jnp.stack([prompt[:, 6], jnp.zeros((R,), jnp.int32)], 1)
    prop = jax.jit(lambda h, k: d.propose(None, h, feed, jnp.ones((R,), jnp.int32), k, None, K))(
        hist, jax.random.PRNGKey(3))
    assert prop.tokens.shape == (R, K) and prop.logq.shape == (R, K, V)
    np.testing.assert_array_equal(np.asarray(prop.state.lengths), 7 + K - 1)
    np.testing.assert_allclose(np.exp(np.asarray(prop.logq)).sum(-1), 1.0, atol=1e-5)
    toks = np.asarray(prop.tokens)
    # position 1: the lookup on [0,1,2,0,1,2,0] proposes 1 with prob 0.7 + 0.3/5 (n-gram "2 0" -> "1")
    np.testing.assert_allclose(np.exp(np.asarray(prop.logq[0, 0])), [0.06, 0.76, 0.06, 0.06, 0.06], atol=1e-6)
    freq = np.bincount(toks[:, 0], minlength=V) / R
    assert np.abs(freq - [0.06, 0.76, 0.06, 0.06, 0.06]).max() < 5 * math.sqrt(0.25 / R)  # 5 sd of a frequency
    # position 2 given position 1: q rows agree with the reference on the drafted history
    for r in range(50):
        seq = [0, 1, 2, 0, 1, 2, 0] + toks[r, :1].tolist()
        np.testing.assert_allclose(np.asarray(prop.logq[r, 1]), ref_logq(seq, V, floor=0.3), atol=1e-5)


# ----------------------------------------------------------------------------- exactness of sd / sd-multi

V, SEED = 6, 2
SD_PROMPT, SD_LENGTH, SD_K = (0, 1, 2, 0, 1), 3, 2


@pytest.mark.parametrize("method,floor,setting", [
    ("sd", 0.2, dict(temperature=1.0)),
    pytest.param("sd-multi", 0.2, dict(temperature=0.7, top_k=3), marks=pytest.mark.slow),  # default-run budget
])
def test_prompt_lookup_is_exact(method, floor, setting):
    """Outputs of sd / sd-multi with PromptLookup match the enumerated p_T (20k samples, chi-square): the
    repetitive prompt makes the lookup hit (most drafts are the match) and the floor makes it miss."""
    target, _ = tiny_pair(V, SEED)
    counts = sample_counts(method, target, PromptLookup(floor=floor), SD_PROMPT, SD_LENGTH, 20_000, batch=5000,
                           seed=77, num_speculative_tokens=SD_K, num_particles=3, **setting)
    probs = exact_distribution(target, SD_PROMPT, SD_LENGTH, **setting)
    p = chi_square_pvalue(counts, probs)
    assert p > P_MIN, (method, p, total_variation(counts, probs))


@dataclasses.dataclass(frozen=True)
class MisreportingLookup(PromptLookup):
    """Samples like PromptLookup but reports a uniform q: verification then accepts the match too often."""

    def propose(self, params, state, feed, feed_count, key, sampling, num_tokens):
        prop = super().propose(params, state, feed, feed_count, key, sampling, num_tokens)
        return prop._replace(logq=jnp.full_like(prop.logq, -math.log(self.vocab)))


@pytest.mark.slow
def test_misreported_q_is_caught():
    target, _ = tiny_pair(V, SEED)
    counts = sample_counts("sd", target, MisreportingLookup(floor=0.2), SD_PROMPT, SD_LENGTH, 20_000, batch=5000,
                           seed=77, num_speculative_tokens=SD_K)
    assert chi_square_pvalue(counts, exact_distribution(target, SD_PROMPT, SD_LENGTH)) < P_BROKEN


@pytest.mark.slow
def test_prompt_lookup_greedy_equals_ar():
    target, _ = tiny_pair(V, SEED)
    prompts = [[0, 1, 2, 0, 1], [3, 4, 3, 4, 3]]
    kw = dict(target=target, max_new_tokens=12, temperature=0.0, eos_id=[])
    ref = smcsd.decode(prompts, method="ar", **kw).tokens
    for method in ("sd", "sd-multi"):
        res = smcsd.decode(prompts, draft=PromptLookup(floor=0.0), method=method, num_speculative_tokens=3,
                           num_particles=2, **kw)
        assert res.tokens == ref, method
        assert res.stats.num_draft_calls == 0 and res.stats.num_accepted_tokens > 0


# ----------------------------------------------------------------------------- smc: its exact finite-N law

@pytest.mark.slow  # default-run budget
def test_prompt_lookup_smc_matches_finite_n_law():
    """One SMC cycle (K = 1) with PromptLookup(floor=0.5) as the proposal: the output follows the SIR law
    L_N computed from the enumerated p_T and the NumPy reference q (chi-square at N = 4, where L_4 is far from
    p_T, so a wrong q in the weights shows), and TV to p_T is smaller at N = 32 than at N = 4."""
    import test_smc as ts
    target, _ = ts._pair()
    floor = 0.5
    conts = np.array(list(itertools.product(range(ts.V), repeat=ts.LENGTH)), np.int32)
    lq = np.zeros((len(conts), ts.LENGTH, ts.V))
    for i, y in enumerate(conts):
        for t in range(ts.LENGTH):
            lq[i, t] = ref_logq(list(ts.PROMPT) + y[:t].tolist(), ts.V, floor=floor)
    target_law, laws = ts.single_cycle_laws(ts.PROMPT, ts.LENGTH, (4, 32), lq=lq)
    tv = {}
    for N in (4, 32):
        out, _, _ = ts.smc_outputs(N, ts.LENGTH, 10_000, seed=31 * N, draft=PromptLookup(floor=floor))
        counts = ts.counts_of(out, ts.LENGTH)
        assert chi_square_pvalue(counts, laws[N]) > P_MIN, N
        tv[N] = total_variation(counts, target_law)
    assert 0.5 * np.abs(laws[4] - target_law).sum() > 0.05  # L_4 is visibly biased: the test has power
    assert tv[32] < tv[4], tv


def test_smc_refuses_a_proposal_without_full_support():
    target, _ = tiny_pair(V, SEED)
    with pytest.raises(ValueError, match="positive probability"):
        smcsd.decode([[0, 1]], target=target, draft=PromptLookup(floor=0.0), method="smc", max_new_tokens=4)


# ----------------------------------------------------------------------------- ARDrafter wraps the old seam

def test_ar_drafter_wraps_a_model():
    target, draft = tiny_pair()
    wrapped = as_drafter(draft)
    assert isinstance(wrapped, ARDrafter) and wrapped.model is draft and ARDrafter(draft) == wrapped
    assert hash(wrapped) == hash(ARDrafter(draft.config))  # static identity: the config
    kw = dict(target=target, method="sd", max_new_tokens=10, num_speculative_tokens=2, seed=4, eos_id=[])
    a = smcsd.decode([[1, 2, 3]], draft=draft, **kw)
    b = smcsd.decode([[1, 2, 3]], draft=ARDrafter(draft), **kw)
    assert a.tokens == b.tokens and b.stats.compile_time_s == 0.0  # one program for both spellings
    with pytest.raises(TypeError, match="LanguageModel"):
        ARDrafter("not a model")


@pytest.mark.parametrize("kw,exc,match", [
    (dict(max_ngram=0), ValueError, "max_ngram"),
    (dict(min_ngram=3, max_ngram=2), ValueError, "min_ngram"),
    (dict(floor=1.5), ValueError, "floor"),
    (dict(floor="x"), ValueError, "floor"),
])
def test_prompt_lookup_bad_config(kw, exc, match):
    with pytest.raises(exc, match=match):
        PromptLookup(**kw)


def test_bad_draft_type_and_vocab_mismatch():
    target, _ = tiny_pair(V, SEED)
    with pytest.raises(TypeError, match="Drafter"):
        smcsd.decode([[0, 1]], target=target, draft="lookup", method="sd", max_new_tokens=4)
    other, _ = tiny_pair(7, SEED)
    with pytest.raises(ValueError, match="vocabularies differ"):
        smcsd.decode([[0, 1]], target=target, draft=other, method="sd", max_new_tokens=4)


# ----------------------------------------------------------------------------- hidden states reach observe

@struct.dataclass
class ProbeState:
    cache: KVCache
    hidden: jax.Array  # float32[R, S, H]: the target hidden state observed at each committed position

    @property
    def lengths(self):
        return self.cache.lengths


@dataclasses.dataclass(frozen=True, init=False)
class HiddenProbe(ARDrafter):
    """An AR drafter that records the target hidden states it is handed (prompt at init, verified blocks at
    observe) at their sequence positions — so a test can check them against a full forward."""

    layers: tuple = (0, 1)
    shares_prefix = False  # its init (below) keeps whole rows, so smc must not ask for a shared prefix

    @property
    def hidden_layers(self):
        return self.layers

    def __init__(self, model, layers=(0, 1)):
        super().__init__(model)
        object.__setattr__(self, "layers", tuple(layers))

    def init(self, params, prompt, prompt_len, cache_len, rows_per_prompt, target_hidden=None):
        cache = super().init(params, prompt, prompt_len, cache_len, rows_per_prompt)
        B, Tp, H = target_hidden.shape
        buf = jnp.zeros((B, cache_len, H), jnp.float32).at[:, :Tp].set(target_hidden)
        return ProbeState(cache, jnp.repeat(buf, rows_per_prompt, axis=0))

    def propose(self, params, state, feed, feed_count, key, sampling, num_tokens):
        prop = super().propose(params, state.cache, feed, feed_count, key, sampling, num_tokens)
        return Proposal(prop.tokens, prop.logq, state.replace(cache=prop.state))

    def observe(self, params, state, tokens, target_hidden, start, num_valid):
        R, T, H = target_hidden.shape
        pos = start[:, None] + jnp.arange(T)[None, :]
        pos = jnp.where(jnp.arange(T)[None, :] < num_valid[:, None], pos, state.hidden.shape[1])
        return state.replace(hidden=state.hidden.at[jnp.arange(R)[:, None], pos].set(target_hidden, mode="drop"))

    def set_lengths(self, state, lengths):
        return state.replace(cache=state.cache.set_lengths(lengths))

    def gather(self, state, index):
        return ProbeState(state.cache.gather(index), jnp.take(state.hidden, index, axis=0))


@pytest.mark.slow  # default-run budget (the block drafters' exactness tests use the same path in the default run)
def test_target_hidden_states_reach_observe():
    """SMC with resampling every cycle (tau = 1): after 3 cycles each particle's recorded hidden states equal
    the target's full-sequence hidden states of layers (0, 1) of its own committed tokens — so verification
    returned them from the same forward, at the right positions, and they moved with the particles."""
    target, draft = tiny_pair()
    probe = HiddenProbe(draft, layers=(0, 1))
    prompts, B, N, K = [[1, 2, 3, 4], [5, 4]], 2, 3, 2
    spec = engine.StaticSpec(method="smc", batch=B, prompt_len=8, cache_len=24, out_len=16, num_stop=1,
                             num_speculative_tokens=K, num_particles=N)
    init, cycle, _ = smc_mod.program_parts(target.config, probe, spec)
    prompt = np.zeros((B, 8), np.int32)
    for b, p in enumerate(prompts):
        prompt[b, :len(p)] = p
    sp = smcsd.SamplingParams.make(1.0, 0, 1.0)
    inp = engine.ProgramInputs(prompt=jnp.asarray(prompt), prompt_len=jnp.asarray([4, 2], jnp.int32),
                               key=jax.random.PRNGKey(5), sampling=sp, draft_sampling=sp,
                               max_new_tokens=jnp.int32(12), stop_ids=jnp.asarray([-1], jnp.int32),
                               ess_threshold=jnp.float32(1.0), alpha=jnp.float32(1.0))
    state = jax.jit(init)(target.params, draft.params, inp)
    step = jax.jit(cycle)
    for _ in range(3):
        state = step(target.params, draft.params, inp, state)
    assert np.any(np.asarray(state.ancestors) != np.arange(B * N))  # resampling moved particles
    n, out = np.asarray(state.n), np.asarray(state.out)
    L = np.asarray(state.cache_t.lengths)
    H = np.asarray(state.cache_d.hidden)
    for r in range(B * N):
        seq = prompts[r // N] + out[r, :n[r] - 1].tolist()  # committed: all but the pending token
        assert len(seq) == L[r]
        _, hid = forward_full(target.config, target.params, jnp.asarray([seq]), hidden_layers=(0, 1))
        want = np.transpose(np.asarray(hid)[:, 0], (1, 0, 2)).reshape(len(seq), -1)
        np.testing.assert_allclose(H[r, :len(seq)], want, atol=1e-4)


def test_drafter_protocol_defaults():
    d = Drafter()
    assert d.hidden_layers == () and d.full_support and d.drafter_params() is None
    with pytest.raises(NotImplementedError):
        d.propose(None, None, None, None, None, None, 1)


# ----------------------------------------------------------------------------- pairs, load, CLI

def test_available_drafters_and_load():
    names = smcsd.available_drafters("tiny-code")
    assert names[:2] == ["ar-distilled", "ar"] and "prompt-lookup" in names  # best model drafter first
    target, draft = smcsd.load("tiny-code")
    distilled = smcsd.load("tiny-code", drafter="ar-distilled")[1]
    assert draft.name == distilled.name == "tiny-code/ar-distilled"  # the pair's best model drafter by default
    assert draft.tokenizer is target.tokenizer and draft.config.vocab_size == target.config.vocab_size
    assert smcsd.load("tiny-code", drafter="ar")[1].name != draft.name
    _, lookup = smcsd.load("tiny-code", drafter="prompt-lookup")
    assert isinstance(lookup, PromptLookup)
    with pytest.raises(ValueError, match="no drafter 'no-such-drafter'.*prompt-lookup"):
        smcsd.load("tiny-code", drafter="no-such-drafter")
    from smcsd.drafters import D2SDDrafter, PARD2Drafter
    d2sd = smcsd.load("tiny-code", drafter="d2sd")[1]
    assert isinstance(d2sd, D2SDDrafter) and d2sd.main.name == "tiny-code/dflash-dpace"
    if "pard2" in names:
        pard = smcsd.load("tiny-code", drafter="pard2")[1]
        assert isinstance(pard, PARD2Drafter) and pard.model.tokenizer is target.tokenizer
    from smcsd.drafters import FlexDrafter, DeLSDrafter, SpecBlockDrafter
    for name, kind in (("dels", DeLSDrafter), ("specblock", SpecBlockDrafter), ("flex", FlexDrafter)):
        if name in names:  # the later papers' drafters, where the pair ships them
            assert isinstance(smcsd.load("tiny-code", drafter=name)[1], kind), name
    from smcsd.drafters import DFlashDrafter
    for name in ("dflash-distilled", "dflash", "dflash-dpace"):  # the shipped block drafters, bound to the target
        assert name in names
        block = smcsd.load("tiny-code", drafter=name)[1]
        assert isinstance(block, DFlashDrafter) and block.name == f"tiny-code/{name}"
        assert block.shared["embed"] is target.params["embed_tokens"]["embedding"]
    with pytest.raises(ValueError, match="unknown model pair"):
        smcsd.available_drafters("no-such-pair")
    assert "prompt-lookup" in smcsd.available_drafters("smollm2-135m")  # works for any target, nothing to fetch


def test_cli_drafter_flag(capsys):
    from smcsd import cli
    code = cli.main(["generate", "ab ab ab ab", "--drafter", "prompt-lookup", "--method", "sd", "-K", "3",
                     "--max-new-tokens", "6", "--temperature", "0", "--json"])
    out, _ = capsys.readouterr()
    assert code == 0
    assert json.loads(out)["stats"]["num_draft_calls"] == 0  # no draft model ran: the lookup drafted
    code = cli.main(["generate", "x", "--drafter", "nope", "--method", "sd"])
    _, err = capsys.readouterr()
    assert code != 0 and "--drafter nope" in err and "prompt-lookup" in err
