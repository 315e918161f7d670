"""The drafter contract: a drafter proposes, a method (`sd`, `sd-multi`, `smc`, ...) verifies.

A `Drafter` is a *static* object: a frozen dataclass whose compared fields fix the compiled program (so it
is part of the compile-cache key), with pure, jit-traceable functions over `(params, state)`. Its params
(`drafter_params()`, a pytree or None) are a traced argument of the decode program, like the target's.

Inside a program (DESIGN.md, "Drafters"):

    state = d.init(params, prompt, prompt_len, cache_len, rows_per_prompt, target_hidden)
    loop:
        prop = d.propose(params, state, feed, feed_count, key, sampling, K)    # x_1..x_K and log q
        ... one target call on [x_0, x_1..x_K] (with hidden states of `d.hidden_layers`) ...
        state = d.observe(params, prop.state, block, hidden, start, num_valid)  # what was committed
        state = d.feedback(state, p, q, n_acc, live)   # sd only, when d.learns_online (opt-in online adaptation)
        state = d.set_lengths(state, new_lengths)   # roll back to the accepted prefix
        (sd-multi: d.copy_window; smc: d.gather by ancestors)

Pending tokens ("feed"): after a cycle a row's drafter state may lag its sequence by one or two tokens
(the last drafted x_K was never fed, plus the new pending token). Each row hands in up to two tokens
`feed [R, 2]` with `feed_count [R]` in {1, 2}; `propose` takes them in first. The arithmetic every method
keeps: drafter length = committed target length + 1 − feed_count.

Exactness: `propose` returns, for each drafted token, the full processed log-distribution it was really
sampled from (`logq [R, K, V]`). Rejection sampling (`sd`, `sd-multi`) is exact for *any* such q; `smc`'s
importance weights are consistent when q covers p_T's support (`full_support`).

State: any pytree whose rows follow the batch axis, with per-row `lengths`; the default row operations
delegate to the state's own `lengths` / `set_lengths` / `copy_window` / `gather` / `repeat` methods
(`models.KVCache` has them; `TokenHistory` is the token-buffer twin). A drafter with a compound state
overrides the row operations.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
from flax import struct

from ..runtime.engine import write_tokens


class Proposal(NamedTuple):
    """A chain of K drafted tokens per row."""

    tokens: jax.Array  # int32[R, K]: proposed x_1..x_K
    logq: jax.Array  # float32[R, K, V]: processed log-distribution each token was sampled from
    state: Any  # drafter state holding the fed tokens and x_1..x_{K-1} (x_K is not yet fed)
    # float32[R, K] or None: log of the drafter's top-1 probability at temperature 1 at each position
    # (`top1_confidence`; the AR and feature drafters report it), for `sd`'s confidence cut
    # (`SD(confidence_cut=...)`); None: the cut reads max log q (so at T=0 it never cuts)
    confidence: Any = None


def top1_confidence(logits):
    """log of the top-1 probability at temperature 1 of raw `logits [..., V]`: a drafter's `Proposal.confidence`."""
    x = logits.astype(jnp.float32)
    return jnp.max(x, axis=-1) - jax.nn.logsumexp(x, axis=-1)  # no [..., V] log-softmax materialised


class TreeProposal(NamedTuple):
    """A token tree of M nodes per row (`propose_tree`; verified by `sd-tree`, smcsd/methods/sd_tree.py).

    Node m has parent `parents[r, m]` (< m; −1: a child of the pending token x_0) and depth `depths[r, m]` (1 = a
    child of x_0). `logq[r, m]` is node m's *trial distribution*: the law it was drawn from given its parent's
    context and its earlier siblings (q itself for i.i.d. children; see smcsd/drafters/tree.py). Nodes with
    `valid` False (a slot the tree did not fill) are never tried. Siblings are tried in index order."""

    tokens: jax.Array  # int32[R, M]
    parents: jax.Array  # int32[R, M]
    depths: jax.Array  # int32[R, M]
    logq: jax.Array  # float32[R, M, V]
    valid: jax.Array  # bool[R, M]
    state: Any


@struct.dataclass
class TokenHistory:
    """Token ids `[R, S]` with per-row `lengths`: a drafter state that mirrors `models.KVCache`'s row
    operations (rollback by lengths, windows, gathers), for drafters that read the sequence itself."""

    tokens: jax.Array
    lengths: jax.Array

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def max_len(self) -> int:
        return self.tokens.shape[1]

    def write(self, new, count) -> "TokenHistory":
        """Append the first `count[r]` of `new [R, T]` to each row (writes past max_len are dropped)."""
        return TokenHistory(tokens=write_tokens(self.tokens, self.lengths, new, count), lengths=self.lengths + count)

    def gather(self, index) -> "TokenHistory":
        index = jnp.asarray(index, jnp.int32)
        return TokenHistory(tokens=jnp.take(self.tokens, index, axis=0), lengths=jnp.take(self.lengths, index))

    def copy_window(self, src, start, width: int) -> "TokenHistory":
        src = jnp.asarray(src, jnp.int32)
        pos = jnp.asarray(start, jnp.int32)[:, None] + jnp.arange(width, dtype=jnp.int32)[None, :]
        rows = jnp.arange(self.batch_size)[:, None]
        moved = self.tokens[src[:, None], jnp.minimum(pos, self.max_len - 1)]
        return self.replace(tokens=self.tokens.at[rows, pos].set(moved, mode="drop"))

    def compact(self, start, index, count) -> "TokenHistory":
        """Slot start + j <- slot start + index[r, j] for j < count[r] (`models.KVCache.compact`'s twin)."""
        index = jnp.asarray(index, jnp.int32)
        D = index.shape[1]
        rows = jnp.arange(self.batch_size)[:, None]
        start = jnp.asarray(start, jnp.int32)[:, None]
        src = jnp.clip(start + index, 0, self.max_len - 1)
        dst = jnp.where(jnp.arange(D)[None, :] < jnp.asarray(count)[:, None], start + jnp.arange(D)[None, :],
                        self.max_len)
        return self.replace(tokens=self.tokens.at[rows, dst].set(self.tokens[rows, src], mode="drop"))

    def set_lengths(self, lengths) -> "TokenHistory":
        return self.replace(lengths=jnp.broadcast_to(jnp.asarray(lengths, jnp.int32), self.lengths.shape))

    def repeat(self, n: int) -> "TokenHistory":
        return self.gather(jnp.repeat(jnp.arange(self.batch_size), n))


class Drafter:
    """Base class of every drafter kind (subclasses are frozen dataclasses; see the module docstring).

    Class attributes a kind sets: `kind` (its name in `smcsd.available_drafters`), `hidden_layers` (target
    layers whose hidden states `init`/`observe` receive; empty: none are computed), `full_support` (every
    proposal `smc` runs, `importance_proposal()`'s, gives every token positive probability, so `smc` stays
    consistent), `max_tokens_per_proposal`
    (the largest K it drafts; None: any), `supports_mesh`, `shares_prefix` (`init` takes `suffix_len`),
    `tree_shapes` (the `TreeSpec.shape`s its `propose_tree` builds), `learns_online` (`feedback` changes its state),
    `only_method` (the one decoding method it drafts for; None: any that takes a drafter), `param_free` (no
    weights: every pair has it, named by its kind), `preferred_method` (what `decode` runs with it when no method
    is named and no measured choice is stored; None: the generic default), and `default_tree` (the tree `sd-tree` runs with it when `tree=` is left out).
    A kind overrides them (as attributes or properties) in its own file; the methods only ask.
    """

    kind: str = "drafter"
    hidden_layers: tuple[int, ...] = ()
    full_support: bool = True
    max_tokens_per_proposal: int | None = None  # the largest K `propose` can draft (None: any)
    supports_mesh: bool = True  # decode(mesh=...) can shard its params and state
    shares_prefix: bool = False  # init(..., suffix_len=S) keeps the prompt once per request (smc's particles)
    only_method: str | None = None  # the one method it drafts for (None: any method that takes a drafter)
    preferred_method: str | None = None  # decode's method for it when none is named or stored (None: generic)
    param_free: bool = False  # no weights: works with any target, and every pair lists it under its `kind`

    def default_tree(self, depth: int, branching: tuple[int, ...], branches: int):
        """The `TreeSpec` `sd-tree` runs with this drafter when `tree=` is left out, from the backend's defaults
        (`smcsd.defaults.TREE_DEFAULTS`): a product tree with `branching` children at the first depths and single
        children below (`branches` is for kinds that re-anchor branches on a chain)."""
        from .tree import TreeSpec
        head = tuple(branching[:depth])
        return TreeSpec(head + (1,) * (depth - len(head)), "sample")

    # ------------------------------------------------------------------ host side
    def drafter_params(self):
        """The pytree the decode program receives as the drafter's params (None: no params)."""
        return None

    def sharded_params(self):
        """The params as a mesh shards them (`decode(mesh=...)`, `sd-overlap`'s drafter group on several devices),
        where `drafter_params()` may lay them out for one device. Default: `drafter_params()`."""
        return self.drafter_params()

    @property
    def language_model(self):
        """The `models.LanguageModel` this drafter runs whole, if any (decode's warning about its dtype), else None."""
        return None

    def bind(self, target) -> "Drafter":
        """Check this drafter against the target (`models.LanguageModel`) and return the drafter to run with it
        (e.g. with the target's vocabulary filled in). Raises ValueError naming the mismatch."""
        return self

    @property
    def vocab_size(self) -> int | None:
        return None

    @property
    def max_len(self) -> int | None:
        """Longest sequence the drafter can hold (None: unbounded)."""
        return None

    @property
    def config(self):
        """The drafter's model config where it has one (mesh sharding of its params), else None."""
        return None

    @property
    def dtype(self) -> str | None:
        return None

    def describe(self) -> str:
        return self.kind

    def importance_proposal(self) -> "Drafter":
        """The drafter `smc` runs. smc weights particles by p_T/q, so q must be > 0 wherever p_T is (`full_support`);
        the exact methods need no such thing. Default: this drafter itself. A drafter whose plain proposal leaves
        tokens out (a reduced draft vocabulary, smcsd/drafters/vocab.py) returns its twin with a floor mixed in."""
        return self

    def calls_per_proposal(self, num_tokens: int) -> int:
        """Batched drafter forward calls per `propose` of `num_tokens` (stats.num_draft_calls)."""
        return num_tokens

    def tree_calls(self, tree) -> int:
        """Batched drafter forward calls per `propose_tree` (stats.num_draft_calls of `sd-tree`)."""
        return self.calls_per_proposal(tree.depth)

    # ------------------------------------------------------------------ traced
    def init(self, params, prompt, prompt_len, cache_len: int, rows_per_prompt: int, target_hidden=None,
             suffix_len: int | None = None):
        """State from the prefilled context: `prompt [B, Tp]` right-padded with `prompt_len [B]`, fanned out to
        `rows_per_prompt` rows per request; `target_hidden [B, Tp, H]` if `hidden_layers` (the prompt's).

        `suffix_len` (passed by `smc` to kinds with `shares_prefix`): the rows of a request will only ever be
        gathered among each other, so the state keeps the prompt's part once per request and gives each row
        `suffix_len` slots for the positions after its prompt (`models.KVCache.share_prefix`)."""
        raise NotImplementedError

    def propose(self, params, state, feed, feed_count, key, sampling, num_tokens: int) -> Proposal:
        raise NotImplementedError

    def propose_tree(self, params, state, feed, feed_count, key, sampling, tree) -> TreeProposal:
        """A token tree of shape `tree` (`smcsd.drafters.tree.TreeSpec`) per row, for `sd-tree`. Nodes the drafter
        writes into its state sit at slots `base + m` (base = the position after x_0), so the method can keep
        the accepted path with `compact`."""
        raise ValueError(f"{self.describe()} drafts chains only; sd-tree needs a drafter with tree proposals "
                         f"({', '.join(tree_drafters())}): use method='sd' or 'sd-multi' with this one")

    def check_tree(self, tree) -> None:
        """Host-side: raise ValueError (naming the fix) unless `propose_tree` can build `tree`."""
        if type(self).propose_tree is Drafter.propose_tree:
            self.propose_tree(None, None, None, None, None, None, tree)  # raises: chains only
        if tree.shape not in self.tree_shapes:
            raise ValueError(f"tree {str(tree)!r} {tree.needs}; {self.describe()} builds "
                             f"{' and '.join(self.tree_shapes)} trees only")
        limit = self.max_tokens_per_proposal
        if limit is not None and tree.depth > limit:
            raise ValueError(f"tree depth {tree.depth} is more than {self.describe()} drafts per proposal (at most "
                             f"{limit}); use a shallower tree")

    learns_online: bool = False  # `feedback` adapts the state (methods that cannot pass it refuse the drafter)
    tree_shapes: tuple[str, ...] = ("product",)  # the `TreeSpec.shape`s `propose_tree` builds

    def feedback(self, state, p, q, n_acc, live):
        """`sd`'s free feedback after every verification, for drafters that learn online (`learns_online`): the
        target's processed probabilities `p [R, K+1, V]` at the verified positions, the proposal's `q [R, K, V]`,
        the accepted counts `n_acc [R]` and live rows. Returns the new state (default: unchanged, which costs
        nothing in the compiled program)."""
        del p, q, n_acc, live
        return state

    def observe(self, params, state, tokens, target_hidden, start, num_valid):
        """After verification: `tokens [R, T]` were verified at target positions `start[r]..start[r]+T-1` and the
        first `num_valid[r]` of them are now committed context; `target_hidden [R, T, H]` (None unless
        `hidden_layers`) are the target's hidden states there, from the verification call itself."""
        del params, tokens, target_hidden, start, num_valid
        return state

    # ------------------------------------------------------------------ row operations on the state
    def lengths(self, state):
        return state.lengths

    def set_lengths(self, state, lengths):
        return state.set_lengths(lengths)

    def copy_window(self, state, src, start, width: int):
        return state.copy_window(src, start, width)

    def gather(self, state, index):
        return state.gather(index)

    def compact(self, state, start, index, count):
        """After a tree cycle: the accepted path's node slots `start + index[r, j]` -> `start + j`, j < count[r]."""
        return state.compact(start, index, count)


def tree_drafters() -> list[str]:
    """The class names of the drafter kinds (imported so far) whose `propose_tree` builds trees, for messages."""
    found, todo = set(), list(Drafter.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.propose_tree is not Drafter.propose_tree and not cls.__name__.startswith("_"):
            found.add(cls.__name__)
    return sorted(found)


def initial_feed(first_token):
    """`(feed [R, 2], feed_count [R])` for rows whose drafter state holds exactly the prompt."""
    R = first_token.shape[0]
    feed = jnp.stack([first_token, jnp.zeros_like(first_token)], axis=1)
    return feed, jnp.ones((R,), jnp.int32)


def check_hidden_layers(layers: Sequence[int], num_layers: int, who: str) -> tuple[int, ...]:
    layers = tuple(int(i) for i in layers)
    bad = [i for i in layers if not 0 <= i < num_layers]
    if bad:
        raise ValueError(f"{who} asks for target hidden layers {bad}, but the target has {num_layers} layers "
                         f"(valid: 0..{num_layers - 1})")
    return layers


def field_static(**kw):
    """A dataclass field that is part of the drafter's identity (compile-cache key)."""
    return dataclasses.field(**kw)


def field_runtime(**kw):
    """A dataclass field excluded from equality/hash (e.g. the model holding the params)."""
    return dataclasses.field(compare=False, hash=False, repr=False, **kw)
