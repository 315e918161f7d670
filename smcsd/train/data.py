"""Drafter training data: a packed token corpus, and the target run teacher-forced over it.

- `TextCorpus`: texts (strings, or files / directories read as UTF-8) tokenized with the target's
  tokenizer, each document `[BOS] + ids + [EOS]`, concatenated and cut into fixed `seq_len` rows. The
  last `heldout_frac` of the rows are held out. Training batches are a pure function of (seed, step):
  epoch e = step // batches_per_epoch visits the training rows in the permutation drawn from
  rng(seed, e), so a resumed run sees exactly the batches the uninterrupted run would have.
- `TeacherStream`: the target's jitted `forward_full` over those batches -> dicts with `tokens [B, T]`,
  the target's next-token log-probs at every position (top-k: `topk_ids, topk_logp [B, T, k]`, or
  full: `logp [B, T, V]`), and optionally hidden states of chosen layers concatenated on the feature
  axis, `hidden [B, T, len(layers) * D]` (the state *after* each layer). With `cache_dir` the outputs are
  computed once per shard of rows and stored as float16 `.npy` files keyed by a hash of everything they
  depend on (target config and params, corpus rows, seq_len, k, layers), so a second epoch or a
  resumed run reads them back instead of running the target again. With a cache, every batch is
  served from the stored float16 values (also the first time), so computed and re-read batches are
  bitwise equal and a resume stays exact. With `mesh` (a training run's `("data", "model")` mesh) the
  target runs on *this process's own devices*, weights split over "model" as for decoding and rows over
  the process's data indices, for the rows this process feeds (`batch(step, rows)`): under
  `jax.distributed` each process computes (and caches) the teacher for its own rows, with no collective
  across processes, so processes need not compute in lockstep.
- `check_vocab`: a drafter must share its target's vocabulary.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
from typing import Iterable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from smcsd.models import ModelConfig, forward_full

__all__ = ["DEFAULT_EXTENSIONS", "TeacherStream", "TextCorpus", "check_vocab", "params_fingerprint", "read_texts",
           "teacher_mesh"]

DEFAULT_EXTENSIONS = (".txt", ".md", ".rst", ".py")
_CACHE_VERSION = 1


# ----------------------------------------------------------------------------------------------- corpus

def read_texts(paths: Iterable[str], extensions: Sequence[str] = DEFAULT_EXTENSIONS) -> list[tuple[str, str]]:
    """(path, text) of each file, sorted; directories are walked recursively for files with `extensions`.

    Files named explicitly are always read (a UTF-8 error names the file); files found in a directory
    that are not valid UTF-8 are skipped.
    """
    out = []
    for path in paths:
        if os.path.isdir(path):
            found = []
            for dirpath, dirnames, filenames in os.walk(path):
                dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
                found += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(tuple(extensions))]
            for f in found:
                try:
                    with open(f, encoding="utf-8") as fh:
                        out.append((f, fh.read()))
                except UnicodeDecodeError:
                    continue
        elif os.path.isfile(path):
            try:
                with open(path, encoding="utf-8") as fh:
                    out.append((path, fh.read()))
            except UnicodeDecodeError as e:
                raise ValueError(f"corpus file {path} is not UTF-8 text ({e})") from None
        else:
            raise FileNotFoundError(f"corpus path {path} does not exist")
    return out


class TextCorpus:
    """Texts tokenized and packed into `seq_len` rows, with a held-out tail and step-deterministic batches.

    texts: strings (documents); files: paths of files or directories (see `read_texts`). Each document
    becomes `tokenizer.encode(text)` (BOS included when the tokenizer adds one) + `[EOS]`. `max_tokens`
    truncates the packed stream (a budget for huge directories). `pack=False`: one document per row instead,
    right-padded with the tokenizer's `pad_id` (which the training losses mask), for short documents that should be
    seen in the context they are decoded in (a chat turn, an arithmetic problem) rather than after other documents.
    """

    train_masks = heldout_masks = None  # per-token loss masks: TokenCorpus(masks=) only

    def __init__(self, texts: Sequence[str] = (), *, tokenizer, seq_len: int, batch_size: int,
                 files: Sequence[str] = (), seed: int = 0, heldout_frac: float = 0.05,
                 extensions: Sequence[str] = DEFAULT_EXTENSIONS, max_tokens: int | None = None, pack: bool = True):
        if isinstance(texts, str):
            raise TypeError("texts must be a list of strings (documents), not one string")
        if tokenizer is None:
            raise ValueError("TextCorpus needs a tokenizer (the target's: model.tokenizer)")
        for name, v in (("seq_len", seq_len), ("batch_size", batch_size)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if seq_len < 2:
            raise ValueError(f"seq_len must be >= 2 (a token and its successor), got {seq_len}")
        if not 0 <= heldout_frac < 1:
            raise ValueError(f"heldout_frac must be in [0, 1), got {heldout_frac!r}")
        self.seq_len, self.batch_size, self.seed, self.heldout_frac = seq_len, batch_size, seed, heldout_frac
        files = [files] if isinstance(files, (str, os.PathLike)) else list(files)
        docs = list(texts) + [t for _, t in read_texts(files, extensions)]
        self.num_documents = len(docs)
        eos = getattr(tokenizer, "eos_id", None)
        parts = []
        for d in docs:
            ids = list(tokenizer.encode(d)) + ([eos] if eos is not None else [])
            parts.append(np.asarray(ids, np.int32))
        self.pack = bool(pack)
        if pack:
            stream = np.concatenate(parts) if parts else np.zeros((0,), np.int32)
            if max_tokens is not None:
                stream = stream[:max_tokens]
            self.num_tokens = int(len(stream))
            need = batch_size * seq_len
            if self.num_tokens < need:
                raise ValueError(f"corpus has {self.num_tokens} tokens, fewer than one batch of batch_size*seq_len = "
                                 f"{need}; add text or lower batch_size/seq_len")
            n_rows = self.num_tokens // seq_len
            rows = stream[:n_rows * seq_len].reshape(n_rows, seq_len)
        else:  # one document per row, right-padded: short documents keep the context they will be decoded in
            pad = getattr(tokenizer, "pad_id", None)
            if pad is None:
                raise ValueError("TextCorpus(pack=False) pads rows with the tokenizer's pad_id, and this tokenizer "
                                 "has none; use pack=True")
            long = [i for i, ids in enumerate(parts) if len(ids) > seq_len]
            if long:
                raise ValueError(f"TextCorpus(pack=False): document {long[0]} has {len(parts[long[0]])} tokens, more "
                                 f"than seq_len={seq_len} ({len(long)} such); raise seq_len or use pack=True")
            if max_tokens is not None:
                keep, total = [], 0
                for ids in parts:
                    if total + len(ids) > max_tokens:
                        break
                    keep.append(ids)
                    total += len(ids)
                parts = keep
            rows = np.full((len(parts), seq_len), pad, np.int32)
            for i, ids in enumerate(parts):
                rows[i, :len(ids)] = ids
            self.num_tokens = int(sum(len(ids) for ids in parts))
            n_rows = len(rows)
        n_held = min(n_rows - 1, max(1, round(heldout_frac * n_rows))) if heldout_frac > 0 else 0
        self.train_rows, self.heldout_rows = rows[:n_rows - n_held], rows[n_rows - n_held:]
        if len(self.train_rows) < batch_size:
            raise ValueError(f"corpus has {self.num_tokens} tokens: {len(self.train_rows)} training rows of seq_len "
                             f"{seq_len} after holding out {n_held} (heldout_frac={heldout_frac}), fewer than one "
                             f"batch of batch_size = {batch_size}; add text or lower batch_size/seq_len/heldout_frac")
        self.batches_per_epoch = len(self.train_rows) // batch_size

    @functools.cached_property
    def fingerprint(self) -> str:
        """A hash of the packed rows and the split (what a teacher cache of this corpus depends on)."""
        h = hashlib.blake2b(digest_size=16)
        h.update(json.dumps([self.seq_len, len(self.train_rows), len(self.heldout_rows)]).encode())
        h.update(np.ascontiguousarray(self.train_rows).tobytes())
        h.update(np.ascontiguousarray(self.heldout_rows).tobytes())
        for m in (self.train_masks, self.heldout_masks):  # a TokenCorpus's loss masks (unchanged hash without)
            if m is not None:
                h.update(np.packbits(np.asarray(m, bool)).tobytes())
        return h.hexdigest()

    def train_indices(self, step: int) -> np.ndarray:
        """Training-row indices of the batch of `step` (a pure function of seed and step)."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        epoch, i = divmod(int(step), self.batches_per_epoch)
        return np.sort(self._permutation(epoch)[i * self.batch_size:(i + 1) * self.batch_size])

    def _permutation(self, epoch: int) -> np.ndarray:
        cached = self.__dict__.get("_perm")
        if cached is None or cached[0] != epoch:
            cached = (epoch, np.random.default_rng([self.seed, epoch, 0x7EAC]).permutation(len(self.train_rows)))
            self.__dict__["_perm"] = cached
        return cached[1]

    def batch(self, step: int) -> np.ndarray:
        """int32 `[batch_size, seq_len]` training tokens of `step`."""
        return self.train_rows[self.train_indices(step)]

    def heldout_indices(self, max_rows: int | None = None) -> list[np.ndarray]:
        """Held-out row indices in chunks of at most batch_size (the first `max_rows` rows)."""
        n = len(self.heldout_rows) if max_rows is None else min(max_rows, len(self.heldout_rows))
        return [np.arange(i, min(i + self.batch_size, n)) for i in range(0, n, self.batch_size)]

    def describe(self) -> dict:
        return {"documents": self.num_documents, "tokens": self.num_tokens, "seq_len": self.seq_len,
                "train_rows": int(len(self.train_rows)), "heldout_rows": int(len(self.heldout_rows)),
                "batch_size": self.batch_size, "seed": self.seed, "heldout_frac": self.heldout_frac,
                "fingerprint": self.fingerprint}


# ----------------------------------------------------------------------------------------------- teacher

def _config_of(model) -> ModelConfig:
    if isinstance(model, ModelConfig):
        return model
    config = getattr(model, "config", None)
    if isinstance(config, ModelConfig):
        return config
    raise TypeError(f"expected a ModelConfig or a model with a .config, got {type(model).__name__}")


def check_vocab(target, drafter_config) -> None:
    """Raise ValueError unless the drafter (config or model) has the target's vocabulary size."""
    vt, vd = _config_of(target).vocab_size, _config_of(drafter_config).vocab_size
    if vt != vd:
        raise ValueError(f"vocab mismatch: the target has vocab_size {vt} but the drafter config has {vd}; a drafter "
                         f"must share its target's vocabulary (set the drafter's vocab_size={vt})")


def _host(x) -> np.ndarray:
    """numpy value of a leaf; a global array split across processes is gathered first."""
    if isinstance(x, jax.Array) and not (x.is_fully_addressable or x.is_fully_replicated):
        from jax.experimental import multihost_utils
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def params_fingerprint(params) -> str:
    """A hash of every leaf (path, dtype, shape, bytes) of a params pytree."""
    h = hashlib.blake2b(digest_size=16)
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        a = np.ascontiguousarray(_host(leaf))
        h.update(f"{jax.tree_util.keystr(path)}|{a.dtype}|{a.shape}".encode())
        h.update(a.view(np.uint8).data)
    return h.hexdigest()


@functools.lru_cache(maxsize=8)
def _teacher_program(config: ModelConfig, topk: int | None, layers: tuple[int, ...], mesh=None):
    """jit(params, tokens[B, T]) -> {"logp"} or {"topk_ids", "topk_logp"}, plus {"hidden"} when layers are given.
    With `mesh` (a process-local teacher mesh) the outputs come back split by rows over "data"."""
    def run(params, tokens):
        if layers:
            logits, hidden = forward_full(config, params, tokens, hidden_layers=layers)
        else:
            logits = forward_full(config, params, tokens)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        out = {}
        if topk:
            vals, ids = jax.lax.top_k(logp, topk)
            out["topk_ids"], out["topk_logp"] = ids.astype(jnp.int32), vals
        else:
            out["logp"] = logp
        if layers:
            L, B, T, D = hidden.shape
            out["hidden"] = jnp.transpose(hidden, (1, 2, 0, 3)).reshape(B, T, L * D).astype(jnp.float32)
        return out
    if mesh is None:
        return jax.jit(run)
    from jax.sharding import NamedSharding, PartitionSpec as P
    return jax.jit(run, out_shardings=NamedSharding(mesh, P("data")))


def teacher_mesh(mesh):
    """The devices of `mesh` on this process, as a ("data", "model") mesh the teacher runs on: this process's data
    indices x the whole model axis when each of its model groups lies on this process (the usual layout: tensor
    parallelism inside a host, data parallelism across hosts), else all its devices on "model"."""
    from jax.sharding import Mesh
    names = list(mesh.axis_names)
    devs = np.moveaxis(mesh.devices, [names.index("data"), names.index("model")], [0, 1])
    devs = devs.reshape(devs.shape[0], devs.shape[1])
    me = jax.process_index()
    mine = [d for d in range(devs.shape[0]) if any(x.process_index == me for x in devs[d])]
    if all(x.process_index == me for d in mine for x in devs[d]):
        local = devs[mine]
    else:
        local = np.asarray([x for x in mesh.devices.flat if x.process_index == me], object).reshape(1, -1)
    return Mesh(local, ("data", "model"))


def _localize(params, config: ModelConfig, mesh):
    """The target's params on the process-local teacher mesh (decoding layout over its "model" axis). A global
    array already in that layout is rebuilt from this process's shards (no transfer)."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    from smcsd.models.sharding import axis_size, param_specs, put
    specs = param_specs(params, axis_size(mesh, "model"), config)

    def place(x, spec):
        sh = NamedSharding(mesh, spec)
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            by_dev = {s.device: s.data for s in x.addressable_shards}
            idx = sh.addressable_devices_indices_map(x.shape)
            if all(d in by_dev and by_dev[d].shape == sh.shard_shape(x.shape) for d in idx):
                return jax.make_array_from_single_device_arrays(x.shape, sh, [by_dev[d] for d in idx])
            x = _host(x)
        return put(x, sh)
    return jax.tree_util.tree_map(place, params, specs, is_leaf=lambda s: isinstance(s, P))


class TeacherStream:
    """Target outputs (teacher-forced) over a `TextCorpus`; `stream(step)` / `stream.batch(step)` is a dict.

    target: a `LanguageModel` (or anything with `.config` and `.params`). topk: keep the k largest
    target log-probs per position (`topk_ids`, `topk_logp`); None or 0 keeps the full `logp [B, T, V]`.
    layers: indices of the layers whose output hidden states to return, concatenated as
    `hidden [B, T, len(layers) * D]` (layer-major: features of layers[0] first). cache_dir: store the
    outputs as float16 `.npy` shards of `shard_rows` rows (default 1) under `cache_dir/<key>/`, computed
    lazily the first time a batch draws a row (a batch's new rows in one call) and re-read afterwards (see the
    module docstring). mesh: a training run's ("data", "model") mesh: the target then runs on this process's
    devices of it (`teacher_mesh`), weights split over "model", for the rows `batch(step, rows)` asks for; the
    outputs equal the single-device ones up to float reduction order. None: one device. Each process computes (and caches) only the rows it
    feeds.
    """

    def __init__(self, target, corpus: TextCorpus, *, topk: int | None = 32, layers: Sequence[int] = (),
                 cache_dir: str | None = None, shard_rows: int | None = None, mesh=None):
        self.config: ModelConfig = _config_of(target)
        self.params = target.params
        self.corpus = corpus
        self.mesh = None
        if mesh is not None:
            from ..runtime.mesh import check_mesh
            mesh = check_mesh(mesh)
            self.mesh = teacher_mesh(mesh)
        V = self.config.vocab_size
        if topk is not None and topk != 0 and not (isinstance(topk, int) and 1 <= topk <= V):
            raise ValueError(f"topk must be an int in [1, vocab_size={V}] or None/0 for full log-probs, got {topk!r}")
        self.topk = int(topk) if topk else None
        self.layers = tuple(int(i) for i in layers)
        for i in self.layers:
            if not 0 <= i < self.config.num_hidden_layers:
                raise ValueError(f"layers: {i} is not a layer index of the target "
                                 f"(0..{self.config.num_hidden_layers - 1})")
        if corpus.seq_len > self.config.max_position_embeddings:
            raise ValueError(f"seq_len {corpus.seq_len} exceeds the target's max_position_embeddings "
                             f"{self.config.max_position_embeddings}")
        self._program = _teacher_program(self.config, self.topk, self.layers, self.mesh)
        self._run_params = self.params if self.mesh is None else _localize(self.params, self.config, self.mesh)
        self.cache_dir = None
        if cache_dir is not None:
            per_row = corpus.seq_len * 2 * ((2 * self.topk if self.topk else V) + len(self.layers) * self.config.hidden_size)
            # one row per shard by default: a row is computed when a batch first draws it (with that batch's other
            # new rows, in one call), so a run's first epoch costs what running the target on each batch costs; a
            # larger shard is computed whole on first use (rows no batch has drawn yet: a run shorter than an
            # epoch pays for them, which on a CPU is hours on a million-token corpus)
            self.shard_rows = int(shard_rows or 1)
            if not 1 <= self.shard_rows <= max(1, (1 << 30) // max(per_row, 1)):
                raise ValueError(f"shard_rows must be in [1, {max(1, (1 << 30) // max(per_row, 1))}] (a shard of at "
                                 f"most 1 GiB), got {shard_rows!r}")
            self.key = self._cache_key()
            self.cache_dir = os.path.join(cache_dir, self.key)
            os.makedirs(self.cache_dir, exist_ok=True)
            meta = os.path.join(self.cache_dir, "meta.json")
            if not os.path.exists(meta):
                tmp = f"{meta}.{os.getpid()}.tmp"  # per process: several may create the same cache at once
                with open(tmp, "w") as f:
                    json.dump(self.describe(), f, indent=2)
                os.replace(tmp, meta)
        self._eval: dict[int | None, list[dict]] = {}

    # -- fields ---------------------------------------------------------------------------------------
    @property
    def fields(self) -> tuple[str, ...]:
        """Names of the teacher arrays in each batch (besides `tokens`)."""
        f = ("topk_ids", "topk_logp") if self.topk else ("logp",)
        return f + (("hidden",) if self.layers else ())

    def describe(self) -> dict:
        d = {"version": _CACHE_VERSION, "target_config": self.config.to_dict(),
             "target_params": self.params_fingerprint, "corpus": self.corpus.fingerprint,
             "seq_len": self.corpus.seq_len, "topk": self.topk, "layers": list(self.layers)}
        if self.cache_dir is not None:
            d.update(shard_rows=self.shard_rows, dtype="float16", key=self.key)
        return d

    @functools.cached_property
    def params_fingerprint(self) -> str:
        return params_fingerprint(self.params)

    def _cache_key(self) -> str:
        d = {"version": _CACHE_VERSION, "target_config": self.config.to_dict(), "target_params": self.params_fingerprint,
             "corpus": self.corpus.fingerprint, "seq_len": self.corpus.seq_len, "topk": self.topk,
             "layers": list(self.layers), "shard_rows": self.shard_rows, "dtype": "float16"}
        return hashlib.blake2b(json.dumps(d, sort_keys=True).encode(), digest_size=10).hexdigest()

    # -- compute ----------------------------------------------------------------------------------------
    def compute(self, tokens: np.ndarray) -> dict[str, np.ndarray]:
        """Run the target on `tokens [n, T]` in chunks of the corpus batch size (padded to one shape)."""
        B = self.corpus.batch_size
        if self.mesh is not None:  # a whole number of rows per local data index
            d = self.mesh.devices.shape[0]
            B = -(-B // d) * d
        n = len(tokens)
        outs = []
        for i in range(0, n, B):
            chunk = tokens[i:i + B]
            m = len(chunk)
            if m < B:  # pad with copies of the first row: one compiled shape for every chunk
                chunk = np.concatenate([chunk, np.broadcast_to(chunk[:1], (B - m,) + chunk.shape[1:])])
            if self.mesh is None:
                res = self._program(self.params, jnp.asarray(chunk, jnp.int32))
            else:
                from jax.sharding import NamedSharding, PartitionSpec as P
                toks = jax.device_put(np.asarray(chunk, np.int32), NamedSharding(self.mesh, P("data")))
                res = self._program(self._run_params, toks)
            outs.append({k: np.asarray(v)[:m] for k, v in res.items()})
        return {k: np.concatenate([o[k] for o in outs]) for k in self.fields}

    def _rows(self, split: str, indices: np.ndarray) -> dict[str, np.ndarray]:
        rows = self.corpus.train_rows if split == "train" else self.corpus.heldout_rows
        indices = np.asarray(indices, np.int64)
        out = {"tokens": rows[indices].astype(np.int32)}
        masks = getattr(self.corpus, "train_masks" if split == "train" else "heldout_masks", None)
        if masks is not None:  # which predicted tokens are supervised (`TokenCorpus(masks=)`)
            out["loss_mask"] = np.asarray(masks[indices], bool)
        if self.cache_dir is None:
            out.update(self.compute(out["tokens"]))
            return out
        S = self.shard_rows
        shards = indices // S
        parts = {k: np.empty((len(indices),) + self._field_shape(k), self._field_dtype(k)) for k in self.fields}
        wanted = [int(s) for s in np.unique(shards)]
        missing = [s for s in wanted if not self._stored(split, s)]
        if missing:  # every shard this batch lacks, computed in one padded call (not one call per shard)
            spans = [(s * S, min((s + 1) * S, len(rows))) for s in missing]
            data = self.compute(np.concatenate([rows[a:b] for a, b in spans]))
            at = 0
            for s, (a, b) in zip(missing, spans):
                self._store(split, s, {k: v[at:at + b - a] for k, v in data.items()})
                at += b - a
        for s in wanted:
            data = self._shard(split, s)
            sel = np.nonzero(shards == s)[0]
            for k in self.fields:
                parts[k][sel] = data[k][indices[sel] - s * S]
        out.update({k: (v.astype(np.float32) if v.dtype == np.float16 else v) for k, v in parts.items()})
        return out

    def _field_shape(self, k: str) -> tuple:
        T = self.corpus.seq_len
        if k == "logp":
            return (T, self.config.vocab_size)
        if k == "hidden":
            return (T, len(self.layers) * self.config.hidden_size)
        return (T, self.topk)

    @staticmethod
    def _field_dtype(k: str):
        return np.int32 if k == "topk_ids" else np.float16

    def _shard_path(self, split: str, s: int, field: str) -> str:
        return os.path.join(self.cache_dir, f"{split}-{s:05d}.{field}.npy")

    def _stored(self, split: str, s: int) -> bool:
        return all(os.path.exists(self._shard_path(split, s, k)) for k in self.fields)

    def _store(self, split: str, s: int, data: dict[str, np.ndarray]) -> None:
        for k in self.fields:
            p = self._shard_path(split, s, k)
            tmp = f"{p}.{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                np.save(f, data[k].astype(self._field_dtype(k)))
            os.replace(tmp, p)  # atomic: a reader never sees half a file

    def _shard(self, split: str, s: int) -> dict[str, np.ndarray]:
        """One stored shard's teacher arrays (memory-mapped)."""
        return {k: np.load(self._shard_path(split, s, k), mmap_mode="r") for k in self.fields}

    # -- batches ----------------------------------------------------------------------------------------
    def batch(self, step: int, rows: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """The training batch of `step`: tokens and the teacher's arrays (numpy; float32 / int32). rows: only
        these rows of it (indices into the batch, e.g. `Placement.local_rows(batch_size)`: a process's share)."""
        indices = self.corpus.train_indices(step)
        return self._rows("train", indices if rows is None else indices[np.asarray(rows)])

    __call__ = batch

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        """Batches of steps 0, 1, 2, ... (endless; epochs follow `TextCorpus.train_indices`)."""
        return (self.batch(s) for s in itertools.count())

    def eval_batches(self, max_rows: int | None = None) -> list[dict[str, np.ndarray]]:
        """The held-out rows' batches (the first `max_rows` rows), computed once per stream."""
        if max_rows not in self._eval:
            self._eval[max_rows] = [self._rows("heldout", idx) for idx in self.corpus.heldout_indices(max_rows)]
        return self._eval[max_rows]
