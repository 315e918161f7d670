"""A self-distillation corpus: the target's own answers to many diverse requests, plus teacher-forced local text.

EAGLE-3 and DistillSpec train drafters on the target's regenerated answers: what a drafter must predict at decode
time is the target's own continuation, so that is what it should see in training. This module builds such a corpus
resumably and stores it compactly in a directory:

    manifest.json        target / tokenizer fingerprints, settings, the build command, per-shard counts and wall times
    shards/<phase>-NNNNN.npz   compressed uint16 token ids of each generated conversation: prompt (chat template
                         rendered, generation header included) and the target's answer (end-of-turn included),
                         with the messages as JSON text, temperature, finished (stopped by itself), held-out flag
    text-NNNNN.npz       teacher-forced local documents (source code, English prose found offline) as token ids

Generation (`generate`) is continuous batching over a fixed-shape KV cache: `batch_size` slots decode in jitted
chunks of `chunk` steps; a slot whose answer ended is refilled with the next request (prefilled in small groups and
scattered into the cache), so the batch stays full although answers differ in length. Phases, run in this order:

1. ``self-instruct``: the target writes user requests about seed topics; the cleaned ones join the request pool;
2. ``chat``: one-turn requests (templated topic x task, standard-library code requests, self-instruct requests),
   answered at temperature 0.7, every `greedy_every`-th greedily;
3. ``follow-up`` shards, one after every `follow_up_every` chat shards: a follow-up turn appended to finished
   conversations of the chat shards before it (multi-turn).

Each shard is generated from an empty batch and written atomically, so a build killed at any point resumes at the
first missing shard and reproduces the uninterrupted corpus exactly (every input of a shard is a function of the
settings and of the shards before it). `batch_size`, `prefill_rows` and `chunk` only say how the answers are computed
(a request's tokens do not depend on its batch neighbours), so a resume may change them: each shard records the ones
it was built with and its sampler (shards without a ``sampler`` entry drew Gumbel-max, later ones inverse-CDF); the
same values on resume reproduce the same tokens bit for bit, other values up to float rounding. The split is by request: a request whose stable hash falls in the held-out
fraction is held out with every conversation grown from it.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import re
import sys
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from smcsd.models import forward_cached
from smcsd.models.cache import init_cache
from jax.sharding import NamedSharding, PartitionSpec
from smcsd.models.sharding import layout
from smcsd.models.transformer import layers_unstacked

from . import prompts as _prompts
from .data import params_fingerprint
from .loop import placement

__all__ = ["BuildSettings", "SelfDistilledCorpus", "build_corpus", "build_text_shards", "generate",
           "tokenizer_fingerprint"]

_FORMAT = 1


# ----------------------------------------------------------------------------------------------- generation

def _sample_rows(logits, keys, temperature):
    """One token per row: greedy where temperature == 0, else an inverse-CDF draw from softmax(logits / temperature)
    with one uniform from the row's own key (so a row's tokens do not depend on which other rows share its batch).
    One uniform per row instead of a Gumbel per vocabulary entry: 16 ms instead of 67 ms for 64 rows x 49k here."""
    t = jnp.maximum(temperature, 1e-6)[:, None]
    z = logits.astype(jnp.float32) / t
    d = z - jnp.max(z, axis=-1, keepdims=True)
    # probabilities below e^-30 of the top one are 0: under 49k x 1e-13 of the mass, below the cdf's float32
    # resolution, and denormal floats (e^-88 and below) are 100x slower on CPU
    cdf = jnp.cumsum(jnp.where(d > -30.0, jnp.exp(d), 0.0), axis=-1)
    u = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys) * cdf[:, -1]
    drawn = jnp.minimum(jnp.sum(cdf <= u[:, None], axis=-1), logits.shape[-1] - 1)
    return jnp.where(temperature > 0, drawn, jnp.argmax(logits, axis=-1)).astype(jnp.int32)


def _rows_fold(keys, index):
    return jax.vmap(jax.random.fold_in)(keys, index)


_PROGRAMS: dict = {}


def _programs(config, per_layer: bool, B: int, L: int, R: int, P: int, S: int, mesh=None):
    """The jitted (prefill-and-scatter, decode-chunk) pair for these shapes (cached; `release_programs` frees).
    With a mesh, each is traced under its layout (KV caches rows over "data", KV heads over "model") and returns its
    host-bound outputs replicated, so every process can read them."""
    key = (config, per_layer, B, L, R, P, S, mesh)
    if key in _PROGRAMS:
        return _PROGRAMS[key]
    nl, hk, hd = config.num_hidden_layers, config.num_key_value_heads, config.head_dim

    def stopped(tok, stop_ids):
        return jnp.any((tok[:, None] == stop_ids[None, :]) & (stop_ids[None, :] >= 0), axis=-1)

    def prefill(params, cache, tok, n, done, rows, prompt, plen, keys_r, temps_r, max_new, stop_ids):
        P = prompt.shape[1]  # the group's own bucket (<= the program's P): one trace per bucket
        small = init_cache(nl, R, P, hk, hd, config.jnp_dtype, per_layer=per_layer)
        logits, small = forward_cached(config, params, prompt, small, num_valid=plen,
                                       logit_index=(plen - 1)[:, None])
        first = _sample_rows(logits[:, 0], _rows_fold(keys_r, jnp.zeros((R,), jnp.int32)), temps_r)
        if per_layer:  # [B, Hkv, S, D] per layer: the new rows' first P slots (later slots are masked by length)
            k = tuple(b.at[rows, :, :P].set(s, mode="drop") for b, s in zip(cache.k, small.k))
            v = tuple(b.at[rows, :, :P].set(s, mode="drop") for b, s in zip(cache.v, small.v))
        else:  # [layers, B, S, Hkv, D]
            k = cache.k.at[:, rows, :P].set(small.k, mode="drop")
            v = cache.v.at[:, rows, :P].set(small.v, mode="drop")
        cache = cache.replace(k=k, v=v, lengths=cache.lengths.at[rows].set(plen, mode="drop"))
        tok = tok.at[rows].set(first, mode="drop")
        n = n.at[rows].set(1, mode="drop")
        done = done.at[rows].set(stopped(first, stop_ids) | (max_new <= 1), mode="drop")
        return cache, tok, n, done, _replicated(first)

    def chunk(params, cache, tok, n, done, keys, temps, max_new, stop_ids):
        def body(carry, _):
            cache, tok, n, done = carry
            live = ~done
            logits, cache = forward_cached(config, params, tok[:, None], cache, num_valid=live.astype(jnp.int32))
            new = _sample_rows(logits[:, 0], _rows_fold(keys, n), temps)
            n = n + live
            done = done | (live & (stopped(new, stop_ids) | (n >= max_new) | (cache.lengths >= L)))
            return (cache, jnp.where(live, new, tok), n, done), jnp.where(live, new, -1)

        (cache, tok, n, done), out = jax.lax.scan(body, (cache, tok, n, done), None, length=S)
        return cache, tok, n, done, _replicated(out.T), _replicated(done)

    def _replicated(x):
        return x if mesh is None else jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec()))

    def new_cache():
        return init_cache(nl, B, L, hk, hd, config.jnp_dtype, per_layer=per_layer)

    def traced_under_layout(fn):
        jitted = jax.jit(fn) if fn is new_cache else jax.jit(fn, donate_argnums=(1,))
        if mesh is None:
            return jitted

        def call(*args):
            with layout(mesh):  # tracing (first call per shape) sees the layout; later calls hit the cache
                return jitted(*args)
        return call

    progs = (traced_under_layout(prefill), traced_under_layout(chunk), traced_under_layout(new_cache))
    _PROGRAMS[key] = progs
    return progs


def release_programs() -> None:
    """Drop the compiled generation programs (an XLA:CPU executable holds ~1000 memory maps)."""
    _PROGRAMS.clear()
    jax.clear_caches()


def generate(target, requests: Sequence[Sequence[int]], *, keys: Sequence[int], temperatures: Sequence[float],
             max_new_tokens: int, stop_ids: Sequence[int], batch_size: int = 64, prompt_bucket: int | None = None,
             prefill_rows: int = 8, chunk: int = 16, progress: Callable[[int], None] | None = None, mesh=None):
    """The target's answers to token-id `requests`, by continuous batching (see the module docstring).

    keys: one integer seed per request (its sampling stream: a request's tokens do not depend on its batch
    neighbours' contents); temperatures: per request, 0 = greedy. Stops at a stop id (included) or
    `max_new_tokens`. Returns `(answers, finished)`: a list of int32 arrays and whether each stopped by itself.
    `progress(n)` is called with the number of tokens each chunk produced.

    mesh: a `("data", "model")` mesh (`smcsd.make_mesh`), one process or several (`jax.distributed`): the batch
    slots split over "data" (the data axis must divide `batch_size`), the target's weights over "model" with the
    decoding layout (`models.sharding`). Every process passes the same requests and gets all the answers; the
    tokens are the single-device ones (sharding changes float reduction order only, ~1e-7 relative).
    """
    n_req = len(requests)
    if n_req == 0:
        raise ValueError("requests is empty: pass at least one tokenized request")
    if len(keys) != n_req or len(temperatures) != n_req:
        raise ValueError(f"keys ({len(keys)}) and temperatures ({len(temperatures)}) need one entry per request "
                         f"({n_req})")
    for name, v in (("max_new_tokens", max_new_tokens), ("batch_size", batch_size), ("prefill_rows", prefill_rows),
                    ("chunk", chunk)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    lens = [len(r) for r in requests]
    if min(lens) < 1:
        raise ValueError(f"request {lens.index(min(lens))} is empty: each request needs at least one token")
    P = prompt_bucket or -(-max(lens) // 16) * 16
    if max(lens) > P:
        raise ValueError(f"request {int(np.argmax(lens))} has {max(lens)} tokens, more than prompt_bucket={P}")
    B, R = batch_size, min(prefill_rows, batch_size)
    L = P + max_new_tokens
    cfg = target.config
    pl = placement(mesh)
    pl.check_rows(B, "batch_size")
    if pl.mesh is None:
        params = target.decode_params() if hasattr(target, "decode_params") else target.params
    else:  # stacked layers, tensor-parallel over "model" (already there: not copied)
        params = pl.shard_frozen(target.params, cfg)
    per_layer = layers_unstacked(params)
    prefill_fn, chunk_fn, cache_fn = _programs(cfg, per_layer, B, L, R, P, chunk, pl.mesh)
    put = pl.replicate if pl.mesh is not None else jnp.asarray
    stops = put(np.asarray(list(stop_ids) or [-1], np.int32))
    max_new = put(np.int32(max_new_tokens))
    cache = cache_fn()
    tok = put(np.zeros((B,), np.int32))
    n = put(np.zeros((B,), np.int32))
    done = put(np.ones((B,), bool))
    slot_keys = np.zeros((B, 2), np.uint32)
    slot_temps = np.zeros((B,), np.float32)
    slot_job = [-1] * B
    pieces: list[list[np.ndarray]] = [[] for _ in range(n_req)]
    finished = [False] * n_req
    next_job, remaining = 0, n_req
    done_host = np.ones((B,), bool)
    while remaining:
        free = [s for s in range(B) if done_host[s] and slot_job[s] < 0]
        while free and next_job < n_req and (len(free) >= R or n_req - next_job < R or
                                             all(slot_job[s] < 0 for s in range(B))):
            take = free[:R]
            free = free[R:]
            jobs = list(range(next_job, min(next_job + len(take), n_req)))
            take = take[:len(jobs)]
            next_job += len(jobs)
            rows = np.full((R,), B, np.int32)
            prompt = np.zeros((R, P), np.int32)
            plen = np.ones((R,), np.int32)
            kr = np.zeros((R, 2), np.uint32)
            tr = np.zeros((R,), np.float32)
            for i, (s, j) in enumerate(zip(take, jobs)):
                rows[i], plen[i] = s, lens[j]
                prompt[i, :lens[j]] = requests[j]
                kr[i] = np.asarray(jax.random.PRNGKey(int(keys[j]) % (2 ** 63)), np.uint32)
                tr[i] = temperatures[j]
                slot_job[s], slot_keys[s], slot_temps[s] = j, kr[i], tr[i]
            width = min(P, -(-max(int(plen.max()), 1) // 16) * 16)  # prefill only the group's longest prompt
            cache, tok, n, done, first = prefill_fn(params, cache, tok, n, done, put(rows), put(prompt[:, :width]),
                                                    put(plen), put(kr), put(tr), max_new, stops)
            first = pl.to_host(first)
            for i, (s, j) in enumerate(zip(take, jobs)):
                pieces[j].append(first[i:i + 1])
            if progress:
                progress(len(jobs))
        cache, tok, n, done, out, done_rep = chunk_fn(params, cache, tok, n, done, put(slot_keys), put(slot_temps),
                                                      max_new, stops)
        out, done_host = pl.to_host(out), pl.to_host(done_rep)
        produced = 0
        for s in range(B):
            j = slot_job[s]
            if j < 0:
                continue
            row = out[s][out[s] >= 0]
            produced += len(row)
            if len(row):
                pieces[j].append(row)
            if done_host[s]:
                ans = np.concatenate(pieces[j]).astype(np.int32)
                finished[j] = bool(len(ans) and np.isin(ans[-1], list(stop_ids)))
                pieces[j] = [ans]
                slot_job[s] = -1
                remaining -= 1
        if progress:
            progress(produced)
    return [p[0] for p in pieces], finished


# ----------------------------------------------------------------------------------------------- the corpus

@dataclasses.dataclass(frozen=True)
class BuildSettings:
    """What a corpus build depends on (the manifest stores it; a resume must use the same)."""

    seed: int = 0
    batch_size: int = 64
    shard_jobs: int = 512
    max_new_tokens: int = 192
    max_prompt_tokens: int = 112
    temperature: float = 0.7
    greedy_every: int = 5            # every 5th chat request is answered greedily
    self_instruct: int = 1024        # requests the target writes itself (0: none)
    self_instruct_max_new: int = 48
    follow_up_every: int = 4         # a follow-up shard after every 4 chat shards (0: none)
    follow_up_one_in: int = 3        # over one in 3 finished conversations of those shards
    follow_up_max_prompt: int = 320
    heldout_per_mille: int = 20      # requests held out (by stable hash), with their follow-ups
    chunk: int = 16
    prefill_rows: int = 8

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "temperature":
                if not (isinstance(v, (int, float)) and v >= 0 and np.isfinite(v)):
                    raise ValueError(f"temperature must be a finite float >= 0, got {v!r}")
            elif not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{f.name} must be an int >= 0, got {v!r}")
        for name in ("batch_size", "shard_jobs", "max_new_tokens", "max_prompt_tokens", "chunk", "prefill_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.heldout_per_mille > 1000:
            raise ValueError(f"heldout_per_mille must be <= 1000, got {self.heldout_per_mille}")


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of a tokenizer's vocabulary and special ids (a corpus's token ids mean nothing under another)."""
    h = hashlib.blake2b(digest_size=12)
    size = getattr(tokenizer, "vocab_size", None)
    if size is None and hasattr(tokenizer, "_tok"):
        size = tokenizer._tok.get_vocab_size()
    h.update(json.dumps([size, getattr(tokenizer, "bos_id", None), getattr(tokenizer, "eos_id", None)]).encode())
    if hasattr(tokenizer, "id_to_token") and size:
        for i in range(0, int(size), max(1, int(size) // 4096)):
            h.update(str(tokenizer.id_to_token(i)).encode())
    else:
        h.update(repr(tokenizer.encode("The quick brown fox jumps over the lazy dog. 0123456789 def f(x):")).encode())
    return h.hexdigest()


def _render(tokenizer, messages) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
    return list(tokenizer.encode("\n".join(m["content"] for m in messages)))


def _stop_ids(tokenizer) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        return list(tokenizer.end_of_turn_ids)
    return [tokenizer.eos_id] if getattr(tokenizer, "eos_id", None) is not None else []


def _clean_request(text: str) -> str | None:
    """A self-instructed request as a user would type it, or None when it is not one."""
    text = text.strip().strip('"').strip()
    text = re.sub(r"^(question|request|task)\s*:\s*", "", text, flags=re.I).strip()
    text = text.split("\n")[0].strip().strip('"').strip()
    if not 12 <= len(text) <= 220 or len(text.split()) < 3:
        return None
    return text


def _save_npz(path: str, **arrays) -> None:
    tmp = f"{path}.{jax.process_index()}.tmp.npz"  # processes sharing a directory write the same bytes, each its own
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, path)


def _pack(seqs) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.cumsum([0] + [len(s) for s in seqs]).astype(np.int64)
    ids = np.concatenate([np.asarray(s, np.int64) for s in seqs]) if seqs else np.zeros((0,), np.int64)
    dtype = np.uint16 if (len(ids) == 0 or ids.max() < 2 ** 16) else np.int32
    return ids.astype(dtype), offsets


def _unpack(ids, offsets) -> list[np.ndarray]:
    return [ids[offsets[i]:offsets[i + 1]].astype(np.int32) for i in range(len(offsets) - 1)]


def _read_shard(path: str) -> dict:
    with np.load(path, allow_pickle=False) as z:
        d = {k: z[k] for k in z.files}
    return {"messages": [json.loads(m) for m in d["messages"]], "prompts": _unpack(d["prompt_ids"], d["prompt_offsets"]),
            "answers": _unpack(d["answer_ids"], d["answer_offsets"]), "temperature": d["temperature"],
            "finished": d["finished"], "heldout": d["heldout"], "root": list(d["root"])}


class _Plan:
    """The shard sequence of a build: self-instruct shards, then chat shards with a follow-up shard after every
    `follow_up_every` of them. Each shard's jobs are a function of the settings and of the shards before it."""

    def __init__(self, settings: BuildSettings, tokenizer, requests: list[str]):
        self.s, self.tok, self.requests = settings, tokenizer, requests
        self.si = _prompts.self_instruct_requests(settings.self_instruct, settings.seed) if settings.self_instruct else []
        self.n_si = -(-len(self.si) // settings.shard_jobs)

    def name(self, i: int) -> str:
        s = self.s
        if i < self.n_si:
            return f"self-instruct-{i:05d}"
        c = i - self.n_si
        if s.follow_up_every and c % (s.follow_up_every + 1) == s.follow_up_every:
            return f"follow-up-{c // (s.follow_up_every + 1):05d}"
        chat = c - (c // (s.follow_up_every + 1) if s.follow_up_every else 0)
        return f"chat-{chat:05d}"

    def pool(self, out_dir: str) -> list[str]:
        """The one-turn requests: the given pool with the cleaned self-instruct requests woven in (one every
        `len(pool) // len(extra)` places), de-duplicated."""
        extra = []
        for i in range(self.n_si):
            d = _read_shard(os.path.join(out_dir, "shards", f"self-instruct-{i:05d}.npz"))
            for ans, fin in zip(d["answers"], d["finished"]):
                text = _clean_request(self.tok.decode([t for t in ans.tolist() if t not in _stop_ids(self.tok)]))
                if text and fin:
                    extra.append(text)
        base = list(self.requests)
        if extra:
            step = max(1, len(base) // len(extra))
            woven = []
            for i, r in enumerate(base):
                woven.append(r)
                if i % step == step - 1 and extra:
                    woven.append(extra.pop(0))
            base = woven + extra
        return _prompts.dedup(base)

    def jobs(self, i: int, out_dir: str, pool_cache: dict) -> list[tuple[list[dict], str]]:
        """(messages, root request) of shard i's jobs."""
        s, name = self.s, self.name(i)
        if name.startswith("self-instruct"):
            part = self.si[i * s.shard_jobs:(i + 1) * s.shard_jobs]
            return [([{"role": "user", "content": p}], p) for p in part]
        if "pool" not in pool_cache:
            pool_cache["pool"] = self.pool(out_dir)
        pool = pool_cache["pool"]
        if name.startswith("chat"):
            c = int(name.split("-")[-1])
            part = pool[c * s.shard_jobs:(c + 1) * s.shard_jobs]
            return [([{"role": "user", "content": p}], p) for p in part]
        f = int(name.split("-")[-1])
        jobs = []
        for c in range(f * s.follow_up_every, (f + 1) * s.follow_up_every):
            path = os.path.join(out_dir, "shards", f"chat-{c:05d}.npz")
            if not os.path.exists(path):
                continue
            d = _read_shard(path)
            stops = set(_stop_ids(self.tok))
            for msgs, ans, fin, root in zip(d["messages"], d["answers"], d["finished"], d["root"]):
                h = _prompts.stable_hash(root + "|follow-up")
                if not fin or h % s.follow_up_one_in:
                    continue
                text = self.tok.decode([t for t in ans.tolist() if t not in stops]).strip()
                follow = _prompts.FOLLOW_UPS[(h // s.follow_up_one_in) % len(_prompts.FOLLOW_UPS)]
                jobs.append((msgs + [{"role": "assistant", "content": text}, {"role": "user", "content": follow}],
                             root))
        return jobs

    def exhausted(self, i: int, pool_cache: dict, out_dir: str) -> bool:
        name = self.name(i)
        if name.startswith("self-instruct"):
            return False
        if "pool" not in pool_cache:
            pool_cache["pool"] = self.pool(out_dir)
        n_chat = -(-len(pool_cache["pool"]) // self.s.shard_jobs)
        if name.startswith("chat"):
            return int(name.split("-")[-1]) >= n_chat
        return int(name.split("-")[-1]) * self.s.follow_up_every >= n_chat


def _check_requests(requests) -> list[str]:
    if isinstance(requests, str):
        raise TypeError("requests must be a list of strings, not one string")
    requests = list(requests)
    if not requests:
        raise ValueError("requests is empty: pass at least one request, or leave it out for the built-in pool")
    seen = {}
    for i, r in enumerate(requests):
        if not isinstance(r, str) or not r.strip():
            raise ValueError(f"requests[{i}] must be a non-empty string, got {r!r}")
        key = " ".join(r.lower().split())
        if key in seen:
            raise ValueError(f"requests[{i}] duplicates requests[{seen[key]}] ({r!r}): de-duplicate the list")
        seen[key] = i
    return requests


def build_corpus(target, out_dir: str, settings: BuildSettings = BuildSettings(), *, requests: Sequence[str] | None = None,
                 exclude: Sequence[str] = (), max_shards: int | None = None, max_answer_tokens: int | None = None,
                 progress: bool = True, command: str | None = None, log: Callable[[str], None] = print,
                 mesh=None) -> dict:
    """Build (or resume) the self-distillation corpus of `target` in `out_dir`; returns the manifest.

    requests: the one-turn request pool (default: `smcsd.train.prompts.request_pool(seed, exclude)`); `exclude`:
    requests that must not appear (e.g. a benchmark's prompts). Stops after `max_shards` new shards, or once the
    corpus holds `max_answer_tokens` generated tokens; run again to continue. The build is exact under resume.

    mesh: generate on a `("data", "model")` mesh (see `generate`; the data axis must divide `batch_size`). Under
    `jax.distributed` every process runs the same build and writes the same files (to its own disk, or atomically
    to a shared one); only process 0 logs and shows progress.
    """
    if not isinstance(settings, BuildSettings):
        raise TypeError(f"settings must be a smcsd.train.corpus.BuildSettings, got {type(settings).__name__}")
    tok = getattr(target, "tokenizer", None)
    if tok is None:
        raise ValueError("build_corpus needs a target with a tokenizer (its requests are text)")
    pool = _check_requests(requests) if requests is not None else _prompts.request_pool(settings.seed, exclude)
    if requests is not None and exclude:
        excluded = {" ".join(e.lower().split()) for e in exclude}
        pool = [r for r in pool if " ".join(r.lower().split()) not in excluded]
    os.makedirs(os.path.join(out_dir, "shards"), exist_ok=True)
    # half-written files of a killed run: this process's own, and (process 0) the single-process names of older runs
    stale = glob.glob(os.path.join(out_dir, "shards", f"*.{jax.process_index()}.tmp.npz"))
    if jax.process_index() == 0:
        stale += [p for p in glob.glob(os.path.join(out_dir, "shards", "*.npz.tmp.npz"))
                  if not p.rsplit(".npz.", 1)[1].split(".")[0].isdigit()]
    for p in stale:
        os.remove(p)
    mpath = os.path.join(out_dir, "manifest.json")
    ident = {"format": _FORMAT, "target": {"name": getattr(target, "name", None),
                                           "fingerprint": params_fingerprint(target.params),
                                           "config": target.config.to_dict()},
             "tokenizer": tokenizer_fingerprint(tok), "settings": _identity(settings),
             "requests": hashlib.blake2b("\n".join(pool).encode(), digest_size=12).hexdigest()}
    manifest = {**ident, "shards": [], "commands": []}
    if os.path.exists(mpath):
        with open(mpath) as f:
            old = json.load(f)
        old["settings"] = _identity(old.get("settings") or {})
        for k in ident:
            if old.get(k) != ident[k]:
                raise ValueError(f"{out_dir} holds a corpus built with another {k} ({old.get(k)!r} vs {ident[k]!r}); "
                                 "resume with the same target, tokenizer, settings and requests, or use a new out_dir")
        manifest = {**old, **ident}
    manifest["execution"] = {k: getattr(settings, k) for k in _EXECUTION}
    manifest["commands"] = manifest.get("commands", []) + [command or " ".join(sys.argv)]
    done_names = {e["name"] for e in manifest["shards"]}
    plan = _Plan(settings, tok, pool)
    stops = _stop_ids(tok)
    pool_cache: dict = {}
    bar = None
    if jax.process_index() != 0:  # one voice
        progress, log = False, (lambda msg: None)
    if mesh is not None:
        placement(mesh).check_rows(settings.batch_size, "settings.batch_size")
    if progress:
        from tqdm import tqdm
        bar = tqdm(unit="tok", desc="corpus", initial=sum(e["answer_tokens"] for e in manifest["shards"]),
                   dynamic_ncols=True, mininterval=10)
    new = 0
    i = 0
    while True:
        name = plan.name(i)
        path = os.path.join(out_dir, "shards", name + ".npz")
        if os.path.exists(path):
            if name not in done_names:  # written before the manifest was (a kill in between): recount it
                d = _read_shard(path)
                manifest["shards"].append(_entry(name, d, None))
                done_names.add(name)
            i += 1
            continue
        if plan.exhausted(i, pool_cache, out_dir):
            break
        total = sum(e["answer_tokens"] for e in manifest["shards"])
        if (max_shards is not None and new >= max_shards) or (max_answer_tokens is not None and total >= max_answer_tokens):
            break
        jobs = plan.jobs(i, out_dir, pool_cache)
        phase = name.rsplit("-", 1)[0]
        limit = settings.follow_up_max_prompt if phase == "follow-up" else settings.max_prompt_tokens
        rendered = [(m, root, _render(tok, m)) for m, root in jobs]
        rendered = [r for r in rendered if len(r[2]) <= limit]
        t0 = time.time()
        if rendered:
            max_new = settings.self_instruct_max_new if phase == "self-instruct" else settings.max_new_tokens
            job_ids = [_prompts.stable_hash(json.dumps(m)) ^ settings.seed for m, _, _ in rendered]
            temps = [0.0 if (phase != "self-instruct" and settings.greedy_every and
                             h % settings.greedy_every == settings.greedy_every - 1) else float(settings.temperature)
                     for h in job_ids]
            if phase == "self-instruct":
                temps = [max(float(settings.temperature), 0.9)] * len(rendered)
            answers, finished = generate(
                target, [r[2] for r in rendered], keys=[h & 0x7FFFFFFF for h in job_ids], temperatures=temps,
                max_new_tokens=max_new, stop_ids=stops, batch_size=settings.batch_size,
                prompt_bucket=-(-limit // 16) * 16, prefill_rows=settings.prefill_rows, chunk=settings.chunk, mesh=mesh,
                progress=(lambda k: bar.update(k)) if bar is not None else None)
        else:
            answers, finished, temps = [], [], []
        p_ids, p_off = _pack([r[2] for r in rendered])
        a_ids, a_off = _pack(answers)
        held = [_prompts.stable_hash(root) % 1000 < settings.heldout_per_mille for _, root, _ in rendered]
        _save_npz(path, messages=np.asarray([json.dumps(m) for m, _, _ in rendered], dtype=str),
                  root=np.asarray([root for _, root, _ in rendered], dtype=str),
                  prompt_ids=p_ids, prompt_offsets=p_off, answer_ids=a_ids, answer_offsets=a_off,
                  temperature=np.asarray(temps, np.float32), finished=np.asarray(finished, bool),
                  heldout=np.asarray(held, bool))
        entry = {**_entry(name, _read_shard(path), time.time() - t0), **manifest["execution"], "sampler": _SAMPLER}
        manifest["shards"].append(entry)
        done_names.add(name)
        _write_manifest(mpath, manifest)
        log(f"{name}: {entry['jobs']} conversations, {entry['answer_tokens']} answer tokens in {entry['wall_s']:.0f} s "
            f"({entry['answer_tokens'] / max(entry['wall_s'], 1e-9):.0f} tok/s); corpus "
            f"{sum(e['answer_tokens'] for e in manifest['shards'])} answer tokens")
        new += 1
        i += 1
        if phase == "self-instruct":
            pool_cache.clear()
    if bar is not None:
        bar.close()
    _write_manifest(mpath, manifest)
    return manifest


_EXECUTION = ("batch_size", "prefill_rows", "chunk")  # how answers are computed, not what they are
_SAMPLER = "inverse-cdf"


def _identity(settings) -> dict:
    """The settings a corpus's content depends on (a resume must match them)."""
    d = dataclasses.asdict(settings) if isinstance(settings, BuildSettings) else dict(settings)
    return {k: v for k, v in d.items() if k not in _EXECUTION}


def _entry(name: str, d: dict, wall) -> dict:
    return {"name": name, "phase": name.rsplit("-", 1)[0], "jobs": len(d["answers"]),
            "answer_tokens": int(sum(len(a) for a in d["answers"])),
            "prompt_tokens": int(sum(len(p) for p in d["prompts"])), "finished": int(np.sum(d["finished"])),
            "heldout": int(np.sum(d["heldout"])), "wall_s": None if wall is None else round(float(wall), 2)}


def _write_manifest(path: str, manifest: dict) -> None:
    shards = manifest["shards"]
    manifest["totals"] = {"conversations": sum(e["jobs"] for e in shards),
                          "answer_tokens": sum(e["answer_tokens"] for e in shards),
                          "prompt_tokens": sum(e["prompt_tokens"] for e in shards),
                          "wall_s": round(sum(e["wall_s"] or 0 for e in shards), 1)}
    tmp = f"{path}.{jax.process_index()}.tmp"
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------- local text

def _stdlib_code_files() -> list[str]:
    import sysconfig
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__",
                                                               "test", "tests", "idlelib", "lib2to3", "encodings"))
        out += [os.path.join(dirpath, f) for f in sorted(filenames)
                if f.endswith(".py") and 1_000 < os.path.getsize(os.path.join(dirpath, f)) < 120_000]
    return out


def _prose_files() -> list[str]:
    """English prose that exists offline: package documentation (README, NEWS, guides in .md / .rst / .txt)."""
    import site
    roots = ["/usr/share/doc"] + list(site.getsitepackages())
    out = []
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__")))
            for f in sorted(filenames):
                p = os.path.join(dirpath, f)
                low = f.lower()
                if (low.endswith((".md", ".rst", ".txt")) or low in ("readme", "news", "authors")) and \
                        "license" not in low and "copying" not in low and 1_500 < os.path.getsize(p) < 400_000:
                    out.append(p)
    return out


def _docstrings_text() -> list[str]:
    """pydoc's plain-text rendering of common standard-library modules (prose with code)."""
    import pydoc
    out = []
    for m in _prompts.CODE_MODULES:
        try:
            mod = __import__(m, fromlist=["_"])
            out.append(pydoc.plaintext.document(mod))
        except Exception:  # noqa: BLE001 - a module that does not render is skipped
            continue
    return out


def build_text_shards(tokenizer, out_dir: str, *, max_tokens: int = 3_600_000, code_frac: float = 0.5,
                      shard_tokens: int = 1_000_000, log: Callable[[str], None] = print) -> dict:
    """Teacher-forced local text: standard-library source (code) and offline documentation (prose), de-duplicated by
    content, tokenized and stored as `text-NNNNN.npz` in `out_dir` (deterministic given this machine's files)."""
    if not 0 <= code_frac <= 1:
        raise ValueError(f"code_frac must be in [0, 1], got {code_frac!r}")
    eos = getattr(tokenizer, "eos_id", None)
    seen: set = set()

    def collect(texts_with_src, budget):
        docs, total = [], 0
        for src, text in texts_with_src:
            key = hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=8).digest()
            if key in seen or not text.strip():
                continue
            seen.add(key)
            ids = list(tokenizer.encode(text)) + ([eos] if eos is not None else [])
            ids = ids[:20_000]
            docs.append((src, ids))
            total += len(ids)
            if total >= budget:
                break
        return docs, total

    def read(paths):
        for p in paths:
            try:
                with open(p, encoding="utf-8") as f:
                    yield p, f.read()
            except (UnicodeDecodeError, OSError):
                continue

    t0 = time.time()
    code, n_code = collect(read(_stdlib_code_files()), int(max_tokens * code_frac))
    prose_src = list(read(_prose_files())) + [(f"pydoc:{i}", t) for i, t in enumerate(_docstrings_text())]
    prose, n_prose = collect(prose_src, max_tokens - n_code)
    docs = code + prose
    shards, cur, cur_n = [], [], 0
    for d in docs:
        cur.append(d)
        cur_n += len(d[1])
        if cur_n >= shard_tokens:
            shards.append(cur)
            cur, cur_n = [], 0
    if cur:
        shards.append(cur)
    for old in glob.glob(os.path.join(out_dir, "text-*.npz")):
        os.remove(old)
    for i, sh in enumerate(shards):
        ids, off = _pack([d[1] for d in sh])
        _save_npz(os.path.join(out_dir, f"text-{i:05d}.npz"), ids=ids, offsets=off,
                  sources=np.asarray([s for s, _ in sh], dtype=str),
                  kind=np.asarray(["code" if s.endswith(".py") else "prose" for s, _ in sh], dtype=str))
    info = {"documents": len(docs), "code_tokens": n_code, "prose_tokens": n_prose, "tokens": n_code + n_prose,
            "shards": len(shards), "wall_s": round(time.time() - t0, 1), "tokenizer": tokenizer_fingerprint(tokenizer)}
    with open(os.path.join(out_dir, "text.json"), "w") as f:
        json.dump(info, f, indent=1)
    log(f"local text: {info['documents']} documents, {n_code} code + {n_prose} prose tokens in {len(shards)} shards")
    return info


# ----------------------------------------------------------------------------------------------- reading

class SelfDistilledCorpus:
    """A built corpus, read back: conversations (prompt ids, answer ids) by split, local text documents, and the
    answer-token frequencies a draft vocabulary is ranked by.

    tokenizer: checked against the corpus's (ids from another tokenizer would train garbage)."""

    def __init__(self, path: str, tokenizer=None):
        mpath = os.path.join(path, "manifest.json")
        if not os.path.exists(mpath):
            raise FileNotFoundError(f"{path} has no manifest.json: build it with smcsd.train.corpus.build_corpus "
                                    "(python -m experiments.train.build_corpus)")
        with open(mpath) as f:
            self.manifest = json.load(f)
        if tokenizer is not None and tokenizer_fingerprint(tokenizer) != self.manifest["tokenizer"]:
            raise ValueError(f"the corpus in {path} was made with another tokenizer (fingerprint "
                             f"{self.manifest['tokenizer']}, this one {tokenizer_fingerprint(tokenizer)}); "
                             "build a corpus with this target's tokenizer")
        self.path = path
        self._conv = None

    def _load(self):
        if self._conv is None:
            conv, seen = {"train": [], "heldout": []}, set()
            for e in self.manifest["shards"]:
                d = _read_shard(os.path.join(self.path, "shards", e["name"] + ".npz"))
                for i in range(len(d["answers"])):
                    p, a = d["prompts"][i], d["answers"][i]
                    key = hashlib.blake2b(p.tobytes() + b"|" + a.tobytes(), digest_size=12).digest()
                    if key in seen or len(a) == 0:
                        continue
                    seen.add(key)
                    conv["heldout" if d["heldout"][i] else "train"].append(
                        {"phase": e["phase"], "messages": d["messages"][i], "prompt": p, "answer": a,
                         "finished": bool(d["finished"][i]), "temperature": float(d["temperature"][i])})
            self._conv = conv
        return self._conv

    def conversations(self, split: str = "train", phases: Sequence[str] | None = None) -> list[dict]:
        if split not in ("train", "heldout"):
            raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
        out = self._load()[split]
        return out if phases is None else [c for c in out if c["phase"] in phases]

    def heldout_requests(self, phases: Sequence[str] = ("chat",)) -> list[list[dict]]:
        """The held-out conversations' messages (prompts no training split contains)."""
        return [c["messages"] for c in self.conversations("heldout", phases)]

    def text_documents(self) -> list[np.ndarray]:
        out = []
        for p in sorted(glob.glob(os.path.join(self.path, "text-*.npz"))):
            with np.load(p, allow_pickle=False) as z:
                out += _unpack(z["ids"], z["offsets"])
        return out

    def answer_frequencies(self, vocab_size: int, split: str = "train") -> np.ndarray:
        """Counts of each token id among the target's generated answers (what a draft vocabulary ranks)."""
        counts = np.zeros((vocab_size,), np.int64)
        for c in self.conversations(split):
            np.add.at(counts, c["answer"], 1)
        return counts

    def documents(self, split: str = "train", include_text: bool = True, with_masks: bool = False):
        """Token documents: each conversation as prompt + answer; with include_text (train only) the local text.
        with_masks: `(documents, masks)`, a mask per document that is True on the target's answer tokens (a
        conversation's prompt, the user's turns and the template around them, False) and everywhere in local text."""
        convs = self.conversations(split)
        docs = [np.concatenate([c["prompt"], c["answer"]]) for c in convs]
        masks = [np.concatenate([np.zeros(len(c["prompt"]), bool), np.ones(len(c["answer"]), bool)]) for c in convs]
        if include_text and split == "train":
            text = self.text_documents()
            docs += text
            masks += [np.ones(len(d), bool) for d in text]
        return (docs, masks) if with_masks else docs

    def describe(self) -> dict:
        tr, ho = self.conversations("train"), self.conversations("heldout")
        text = self.text_documents()
        return {"train_conversations": len(tr), "heldout_conversations": len(ho),
                "train_answer_tokens": int(sum(len(c["answer"]) for c in tr)),
                "heldout_answer_tokens": int(sum(len(c["answer"]) for c in ho)),
                "prompt_tokens": int(sum(len(c["prompt"]) for c in tr + ho)),
                "text_tokens": int(sum(len(d) for d in text)),
                "phases": {p: sum(1 for c in tr + ho if c["phase"] == p) for p in ("self-instruct", "chat", "follow-up")},
                "wall_s": self.manifest.get("totals", {}).get("wall_s")}
