"""`SpecBlockDrafter` (SpecBlock, arXiv 2605.07243): K_s dependent draft positions per forward through learnable
per-slot queries and a layer-wise shift, blocks chained from the drafter's own hidden state.

Network (`SpecBlockNet`, the target's width, a few decoder layers sharing the target's embedding and LM head):
- context: like DFlash (`DFlashDrafter`), the target's hidden states of `target_layers` -> linear -> RMSNorm, projected
  by each layer into the drafter's own K/V of the committed positions;
- a block of S slots (`block_size` = S, 4 in the paper) anchored at the pending token x_0 (position p): slot k sits
  at position p + k and predicts x_{k+1}. Its input is Linear(3H -> H) over [anchor feature; embedding of x_0;
  learned query of slot k]; the anchor feature is the (projected) target hidden state at p - 1, the last position
  the target has processed;
- layer-wise shift: before every layer l >= 1, x_k <- W_l [x_k ; x_{k-1}] (slot 0 pairs with itself), so each slot
  reads its left neighbour's state directly; attention is causal within the block and reaches the context < p;
- chaining: a block can start from slot M-1 of the previous one — anchor feature = RMSNorm(the drafter's hidden
  state there), token = the token drafted at slot M-1, positions p + M ... (the chained block reads the target
  context < p, not the previous block's slots: their dependence is carried by the inherited state).

Decoding: K <= S drafts come from one forward (S slots computed, the first K used; attention within the block is
causal, so later slots never change earlier ones); K > S chains ceil(K / S) forwards, each from the last slot of the
previous block with the token drafted there. Within one block the slots' tokens are drawn independently from their
own q_k (the dependence between positions is in the hidden states, not in the sampled tokens), across blocks each
q depends on the tokens drawn before it; `Proposal.logq` holds each q, so `sd` / `sd-multi` / `smc` stay exact /
consistent as with any drafter. State: the context K/V (as `DFlashDrafter`) plus the target's hidden state at the
last committed position (`observe` keeps it per row).

Training (`smcsd.train.train_specblock`): teacher-forced anchors, a second block chained from slot M - 1 with
M ~ Uniform{1..S}, loss sum_blocks sum_k 0.8^k KL(p_T || q_k) under SpecBlock's valid-prefix mask.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from smcsd.models import init_cache
from smcsd.models.rope import inverse_frequencies, rope_tables
from smcsd.models.transformer import Part, RMSNorm, dense

from ..sampling import process_logits, sample
from .base import Proposal, TreeProposal
from .dflash import DFlashConfig, DFlashDrafter, BlockLayer, shared_head_logits
from .tree import product_tree


@dataclasses.dataclass(frozen=True)
class SpecBlockConfig(DFlashConfig):
    """`model` (the drafter's layer dimensions; hidden size and vocabulary are the target's), `target_layers`,
    `block_size` = S, the slots per forward (each predicts one token)."""


class SpecBlockNet(nn.Module):
    """SpecBlock's own weights: context projection, anchor-input fusion, slot queries, shifts, layers, norms."""

    config: SpecBlockConfig
    init_std: float = 0.02

    def setup(self):
        c = self.config.model
        dt, H, S = c.jnp_dtype, c.hidden_size, self.config.block_size
        self.fc = dense(H, "fc", dt, self.init_std)
        self.context_norm = RMSNorm(c.rms_norm_eps, dt)
        self.chain_norm = RMSNorm(c.rms_norm_eps, dt)
        self.in_proj = dense(H, "in_proj", dt, self.init_std)
        self.slot_queries = self.param("slot_queries", nn.initializers.normal(1.0), (S, H), dt)
        eye = lambda key, shape, dtype: (jnp.concatenate([jnp.eye(H), jnp.zeros((H, H))], 0)  # noqa: E731
                                         + self.init_std * jax.random.normal(key, shape)).astype(dtype)
        self.shifts = [self.param(f"shift_{i}", eye, (2 * H, H), dt) for i in range(1, c.num_hidden_layers)]
        self.layers = [BlockLayer(c, self.init_std, name=f"layers_{i}") for i in range(c.num_hidden_layers)]
        self.norm = RMSNorm(c.rms_norm_eps, dt)

    def _rope(self, positions):
        c = self.config.model
        return rope_tables(positions, inverse_frequencies(c.head_dim, c.rope_theta, c.rope_scaling))

    def context_kv(self, hidden, positions):
        """Per layer `(k, v)` of target hidden states `hidden [R, T, n*H]` at `positions [R, T]`."""
        f = self.feature(hidden)
        cos, sin = self._rope(positions)
        return [layer.kv(f, cos, sin) for layer in self.layers]

    def feature(self, hidden):
        """The projected target feature of hidden states `[..., n*H]`."""
        return self.context_norm(self.fc(hidden.astype(self.config.model.jnp_dtype)))

    def chain_feature(self, h):
        """The anchor feature of a block chained from the drafter's own (pre-norm) hidden state `h [..., H]`."""
        return self.chain_norm(h)

    def inputs(self, feat, emb, slots: int):
        """Slot inputs `[R, A*slots, H]` of blocks with anchor features `feat [R, A, H]` and anchor-token embeddings
        `emb [R, A, H]`, the first `slots` slots of each."""
        R, A, H = feat.shape
        q = jnp.broadcast_to(self.slot_queries[:slots], (R, A, slots, H))
        rep = lambda x: jnp.broadcast_to(x[:, :, None, :], (R, A, slots, H))  # noqa: E731
        x = jnp.concatenate([rep(feat.astype(q.dtype)), rep(emb.astype(q.dtype)), q], axis=-1)
        return self.in_proj(x).reshape(R, A * slots, H)

    def block_hidden(self, x, slots: int, positions, ctx: Sequence, blk_mask):
        """(final-normed, raw) hidden states `[R, A*slots, H]` of slot inputs `x` at `positions`; `ctx` per layer a
        list of context `Part`s, `blk_mask [R, A*slots, A*slots]`."""
        R, T, H = x.shape
        cos, sin = self._rope(positions)
        for i, (layer, parts) in enumerate(zip(self.layers, ctx)):
            if i > 0:  # layer-wise shift: each slot with its left neighbour (slot 0 with itself)
                b = x.reshape(R, T // slots, slots, H)
                prev = jnp.concatenate([b[:, :, :1], b[:, :, :-1]], axis=2)
                x = (jnp.concatenate([b, prev], -1) @ self.shifts[i - 1]).reshape(R, T, H)
            x = layer(x, cos, sin, parts, blk_mask)
        return self.norm(x), x

    def __call__(self, hidden, positions, ctx_mask):
        """Context and one block anchored after `hidden`'s last position (parameter init only)."""
        S, R, T = self.config.block_size, hidden.shape[0], hidden.shape[1]
        ctx = [[Part(k, v, ctx_mask)] for k, v in self.context_kv(hidden, positions)]
        feat = self.feature(hidden[:, -1:])
        x = self.inputs(feat, jnp.zeros_like(feat), S)
        bpos = T + jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (R, S))
        h, raw = self.block_hidden(x, S, bpos, ctx, jnp.broadcast_to(jnp.tril(jnp.ones((S, S), bool)), (R, S, S)))
        return h, self.chain_feature(raw)


RANK_FEATURES = 15  # top-10 log-probs, three logit gaps, top-1 probability, entropy of the top 20
RANK_CLASSES = 4  # rank of the target's token under q: 1 / 2-4 / 5-10 / > 10


def rank_features(logits):
    """SpecBlock's 15 confidence features `[..., 15]` of draft logits `[..., V]` (log-probs at temperature 1)."""
    lp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
    k = min(20, lp.shape[-1])
    top = jax.lax.top_k(lp, k)[0]
    if k < 20:  # tiny vocabularies: pad with a negligible log-prob
        top = jnp.concatenate([top, jnp.full(top.shape[:-1] + (20 - k,), -30.0)], -1)
    gaps = jnp.stack([top[..., 0] - top[..., 1], top[..., 0] - top[..., 4], top[..., 0] - top[..., 9]], -1)
    w = jax.nn.softmax(top, -1)
    ent = -(w * jnp.log(jnp.maximum(w, 1e-30))).sum(-1, keepdims=True)
    return jnp.concatenate([top[..., :10], gaps, jnp.exp(top[..., :1]), ent], -1)


def rank_class(logits, token):
    """The rank class `[...]` of `token` under draft logits `[..., V]`: 0 (rank 1), 1 (2-4), 2 (5-10), 3 (> 10)."""
    x = jnp.take_along_axis(logits, token[..., None], -1)
    rank = (logits > x).sum(-1) + 1
    return jnp.searchsorted(jnp.asarray([1, 4, 10]), rank, side="left").astype(jnp.int32)


def init_rank_params(hidden_size: int, seed: int = 0, width: int = 256) -> dict:
    """The rank head: an MLP over [normed slot hidden state; 15 confidence features] -> 4 rank classes."""
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    n = hidden_size + RANK_FEATURES
    return {"w1": jax.random.normal(k1, (n, width), jnp.float32) / jnp.sqrt(n), "b1": jnp.zeros((width,), jnp.float32),
            "w2": jax.random.normal(k2, (width, RANK_CLASSES), jnp.float32) / jnp.sqrt(width),
            "b2": jnp.zeros((RANK_CLASSES,), jnp.float32)}


def rank_logits(rank_params, hidden, logits):
    """Rank-class logits `[..., 4]` from the drafter's normed hidden states and logits (both detached)."""
    x = jnp.concatenate([jax.lax.stop_gradient(hidden).astype(jnp.float32),
                         jax.lax.stop_gradient(rank_features(logits))], -1)
    return jax.nn.silu(x @ rank_params["w1"] + rank_params["b1"]) @ rank_params["w2"] + rank_params["b2"]


def causal_blocks(num_blocks: int, slots: int):
    """bool `[A*S, A*S]`: each slot sees the slots of its own block up to itself."""
    blk = jnp.repeat(jnp.arange(num_blocks), slots)
    idx = jnp.tile(jnp.arange(slots), num_blocks)
    return (blk[:, None] == blk[None, :]) & (idx[None, :] <= idx[:, None])


@dataclasses.dataclass(frozen=True)
class OnlineAdapt:
    """SpecBlock's opt-in online adaptation under a cost-aware bandit (`SpecBlockDrafter.adaptive(...)`).

    What is learned: a per-request logit bias b [V] added to every slot's logits (the drafter's weights stay as
    trained). The free feedback: after each `sd` verification the target's processed distributions p_k at the
    verified slots (already computed for the acceptance test) and the proposal's q_k. The update (one pass over
    [K, V] per row): b <- b + lr * sum_{k <= n} (p_k - q_k), n the accepted count (the slots whose context was
    committed, the first rejected one included): a gradient step on sum_k KL(p_k || q_k) with respect to b (up to
    the temperature's scale). The bandit (per request, two arms: skip / update) pays `cost` — the update's price as
    a fraction of a cycle — and picks by discounted UCB on the reward (tokens committed next cycle) / (1 + cost if
    it updated): mean_a + explore * sqrt(log N / n_a), with counts and sums discounted by `discount` each cycle so
    it follows a drifting workload. An update is chosen only while its measured gain beats its cost."""

    lr: float = 0.5
    cost: float = 0.02
    discount: float = 0.95
    explore: float = 0.5

    def __post_init__(self):
        for k in ("lr", "cost", "explore"):
            v = getattr(self, k)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= 0:
                raise ValueError(f"OnlineAdapt.{k} must be a number >= 0, got {v!r}")
        if not isinstance(self.discount, (int, float)) or not 0 < self.discount <= 1:
            raise ValueError(f"OnlineAdapt.discount must be in (0, 1], got {self.discount!r}")


@dataclasses.dataclass(frozen=True, init=False)
class SpecBlockDrafter(DFlashDrafter):
    """SpecBlock drafter (module docstring). `SpecBlockDrafter.create(target, num_layers=2, block_size=4)`,
    `.load(path)`, `.save(path)`; `.bind(target)` attaches the target's embedding and LM head;
    `.adaptive(OnlineAdapt(...))` turns on online adaptation in `sd` (opt-in; `OnlineAdapt`)."""

    adapt: OnlineAdapt | None = None

    kind = "specblock"
    shares_prefix = False  # its state carries a per-row anchor feature next to the context K/V
    _config_cls = SpecBlockConfig
    _net_cls = SpecBlockNet
    _format = "specblock"

    def __init__(self, config, params=None, shared=None, name: str = "specblock", adapt: OnlineAdapt | None = None):
        super().__init__(config, params, shared, name)
        if adapt is not None and not isinstance(adapt, OnlineAdapt):
            raise TypeError(f"adapt must be an OnlineAdapt (or None), got {type(adapt).__name__}")
        object.__setattr__(self, "adapt", adapt)

    def _rebuild(self, config=None, params=None, shared=None) -> "SpecBlockDrafter":
        return SpecBlockDrafter(self.block_config if config is None else config,
                                self.params if params is None else params, self.shared if shared is None else shared,
                                self.name, self.adapt)

    def adaptive(self, adapt: OnlineAdapt | None = OnlineAdapt()) -> "SpecBlockDrafter":
        """This drafter with online adaptation (`OnlineAdapt`; None turns it off)."""
        return SpecBlockDrafter(self.block_config, self.params, self.shared, self.name, adapt)

    @property
    def learns_online(self) -> bool:
        return self.adapt is not None

    def __repr__(self):
        c = self.block_config
        return (f"SpecBlockDrafter({self.name!r}, layers={c.model.num_hidden_layers}, hidden={c.model.hidden_size}, "
                f"slots={c.block_size}, target_layers={c.target_layers})")

    @classmethod
    def create(cls, target, *, num_layers: int = 2, block_size: int = 4, target_layers=None,
               intermediate_size: int | None = None, seed: int = 0, init_std: float = 0.02,
               name: str = "specblock") -> "SpecBlockDrafter":
        return super().create(target, num_layers=num_layers, block_size=block_size, target_layers=target_layers,
                              intermediate_size=intermediate_size, seed=seed, init_std=init_std, name=name)

    @classmethod
    def _init_params(cls, config, seed: int, init_std: float):
        dt = config.model.jnp_dtype
        return SpecBlockNet(config, init_std).init(
            jax.random.PRNGKey(seed), jnp.zeros((1, 2, config.context_size), dt),
            jnp.zeros((1, 2), jnp.int32), jnp.ones((1, config.block_size, 2), bool))["params"]

    @classmethod
    def _expected_params(cls, config, loaded):
        net = cls._init_params(config, 0, 0.02)
        if "rank_head" in loaded:  # optional: trained after the drafter (smcsd.train.train_rank_head)
            net["rank_head"] = init_rank_params(config.model.hidden_size, 0, loaded["rank_head"]["b1"].shape[0])
        return net

    def with_rank_head(self, rank_params) -> "SpecBlockDrafter":
        """This drafter with a rank head (`init_rank_params` shapes; trained by `smcsd.train.train_rank_head`)."""
        return self._rebuild(params={**self.params, "rank_head": rank_params})

    @property
    def builds_rank_trees(self) -> bool:
        return self.params is not None and "rank_head" in self.params

    @property
    def tree_shapes(self) -> tuple[str, ...]:
        return ("product", "rank") if self.builds_rank_trees else ("product",)

    def drafter_params(self):
        p = super().drafter_params()
        net = dict(p["net"])
        return {**p, "net": {k: v for k, v in net.items() if k != "rank_head"}, "rank": net.get("rank_head")}

    @property
    def max_tokens_per_proposal(self):
        return None  # blocks chain: any K

    def describe(self) -> str:
        return f"specblock:{self.name}"

    def calls_per_proposal(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_config.block_size)

    def _check_depth(self, num_tokens):
        pass

    # ------------------------------------------------------------------ traced
    def init(self, params, prompt, prompt_len, cache_len, rows_per_prompt, target_hidden=None, suffix_len=None):
        del suffix_len  # shares_prefix is False: smc never passes it
        c = self.block_config.model
        B = prompt.shape[0]
        cache = init_cache(c.num_hidden_layers, B, cache_len, c.num_key_value_heads, c.head_dim, c.jnp_dtype)
        cache = self.write_context(params, cache, target_hidden, jnp.zeros((B,), jnp.int32)).set_lengths(prompt_len)
        last = jnp.take_along_axis(target_hidden, (prompt_len - 1)[:, None, None], axis=1)[:, 0]  # [B, n*H]
        rows = {"last": last.astype(jnp.float32)}
        if self.adapt is not None:
            rows.update(bias=jnp.zeros((B, c.vocab_size), jnp.float32), n=jnp.zeros((B, 2), jnp.float32),
                        s=jnp.zeros((B, 2), jnp.float32), arm=jnp.zeros((B,), jnp.int32))
        state = (cache, rows)
        if rows_per_prompt > 1:
            state = self.gather(state, jnp.repeat(jnp.arange(B), rows_per_prompt))
        return state

    def _net_apply(self, params, *args, method):
        return self._net().apply({"params": params["net"]}, *args, method=method)

    def block_logits_from(self, params, cache, feat, anchors, positions0, ctx_len, slots: int, bias=None):
        """(logits `[R, slots, V]`, raw hidden, normed hidden `[R, slots, H]`) of one block: anchor feature `feat [R, H]` (already
        projected), anchor tokens `anchors [R]`, slot 0 at `positions0 [R]`, context slots < `ctx_len`."""
        c = self.block_config.model
        emb = jnp.take(params["embed"], anchors, axis=0)
        x = self._net_apply(params, feat[:, None], emb[:, None], slots, method=SpecBlockNet.inputs)
        positions = positions0[:, None] + jnp.arange(slots, dtype=jnp.int32)[None, :]
        ctx_mask = jnp.arange(cache.slots)[None, :] < ctx_len[:, None]
        ctx = [[Part(cache.k[i], cache.v[i], ctx_mask)] for i in range(c.num_hidden_layers)]
        blk = jnp.broadcast_to(causal_blocks(1, slots), (anchors.shape[0], slots, slots))
        h, raw = self._net_apply(params, x, slots, positions, ctx, blk, method=SpecBlockNet.block_hidden)
        logits = shared_head_logits(h, params)
        if bias is not None:
            logits = logits + bias[:, None, :]
        return logits, raw, h

    def propose(self, params, state, feed, feed_count, key, sampling, num_tokens: int) -> Proposal:
        cache, rows = state
        S, K = self.block_config.block_size, num_tokens
        anchors = jnp.take_along_axis(feed, (feed_count - 1)[:, None], axis=1)[:, 0]
        ctx_len = cache.lengths + feed_count - 1  # committed target length: the pending token sits there
        feat = self._net_apply(params, rows["last"], method=SpecBlockNet.feature)
        pos0 = ctx_len
        toks, logqs = [], []
        keys = jax.random.split(key, -(-K // S))
        for b, k0 in enumerate(range(0, K, S)):
            n = min(S, K - k0)
            logits, raw, _ = self.block_logits_from(params, cache, feat, anchors, pos0, ctx_len, n, rows.get("bias"))
            lq = process_logits(logits, sampling)
            t = sample(keys[b], lq)
            toks.append(t)
            logqs.append(lq)
            if k0 + n < K:  # chain the next block from this block's last slot
                feat = self._net_apply(params, raw[:, -1], method=SpecBlockNet.chain_feature)
                anchors, pos0 = t[:, -1], pos0 + n
        new = cache.set_lengths(cache.lengths + feed_count + K - 1)
        return Proposal(jnp.concatenate(toks, 1), jnp.concatenate(logqs, 1), (new, rows))

    def observe(self, params, state, tokens, target_hidden, start, num_valid):
        cache, rows = state
        cache = self.write_context(params, cache, target_hidden, start)
        idx = jnp.clip(num_valid - 1, 0, target_hidden.shape[1] - 1)
        newest = jnp.take_along_axis(target_hidden, idx[:, None, None], axis=1)[:, 0].astype(jnp.float32)
        return cache, {**rows, "last": jnp.where((num_valid > 0)[:, None], newest, rows["last"])}

    def feedback(self, state, p, q, n_acc, live):
        """`sd`'s free feedback after a verification (`OnlineAdapt`): target probabilities `p [R, K+1, V]`, the
        proposal's `q [R, K, V]`, accepted counts `n_acc [R]`, live rows. Updates the bandit and, where it picks
        the update arm, the logit bias."""
        a = self.adapt
        if a is None:
            return state
        cache, rows = state
        K = q.shape[1]
        liv = live.astype(jnp.float32)
        arm = jax.nn.one_hot(rows["arm"], 2)  # the arm chosen last cycle, whose effect this cycle shows
        reward = (n_acc + 1).astype(jnp.float32) / (1.0 + a.cost * rows["arm"])
        n = a.discount * rows["n"] + arm * liv[:, None]
        s = a.discount * rows["s"] + arm * (reward * liv)[:, None]
        mean = s / jnp.maximum(n, 1e-6)
        ucb = jnp.where(n > 1e-3, mean + a.explore * jnp.sqrt(jnp.log1p(n.sum(-1, keepdims=True)) /
                                                              jnp.maximum(n, 1e-6)), jnp.inf)
        nxt = jnp.argmax(ucb, -1).astype(jnp.int32)  # ties (both untried): skip first
        m = ((jnp.arange(K)[None, :] <= n_acc[:, None]) & live[:, None]).astype(jnp.float32)
        grad = jnp.einsum("rk,rkv->rv", m, p[:, :K] - q)
        bias = rows["bias"] + a.lr * grad * (nxt == 1)[:, None]
        return cache, {**rows, "bias": bias, "n": n, "s": s, "arm": jnp.where(live, nxt, rows["arm"])}

    def check_tree(self, tree) -> None:
        super().check_tree(tree)
        S = self.block_config.block_size
        if tree.depth > S:
            raise ValueError(f"tree depth {tree.depth} is more than this SpecBlock drafter's slots per forward ({S}); "
                             f"use a tree of depth <= {S}")

    def propose_tree(self, params, state, feed, feed_count, key, sampling, tree) -> TreeProposal:
        """One block forward (depth <= S slots). A fixed-shape tree draws every depth-d node's children from slot d's
        q (a slot does not depend on the tokens drafted before it in its block, so all nodes of a depth share it). A
        rank tree (`tree.budget`) gives each node `tree.rank_widths[c]` "top" children, c the rank head's class of
        its depth, and keeps the `budget` nodes of highest cumulative log q (module docstring of drafters/tree.py)."""
        self.check_tree(tree)
        cache, rows = state
        D = tree.depth
        anchors = jnp.take_along_axis(feed, (feed_count - 1)[:, None], axis=1)[:, 0]
        ctx_len = cache.lengths + feed_count - 1
        feat = self._net_apply(params, rows["last"], method=SpecBlockNet.feature)
        logits, _, h = self.block_logits_from(params, cache, feat, anchors, ctx_len, ctx_len, D, rows.get("bias"))
        lq = process_logits(logits, sampling)  # [R, D, V]
        new_state = (cache.set_lengths(cache.lengths + feed_count + D - 1), rows)
        R = lq.shape[0]
        if not tree.budget:
            widths = (1,) + tree.level_widths
            tokens, trial, valid = product_tree(
                key, tree, lambda d, _: jnp.broadcast_to(lq[:, d:d + 1], (R, widths[d], lq.shape[-1])))
            parents, depths = tree.product_layout()
            M = len(parents)
            return TreeProposal(tokens, jnp.broadcast_to(jnp.asarray(parents), (R, M)),
                                jnp.broadcast_to(jnp.asarray(depths), (R, M)), trial, valid, new_state)
        cls = jnp.argmax(rank_logits(params["rank"], h, logits), -1)  # [R, D]
        width = jnp.asarray(tree.rank_widths, jnp.int32)[cls]
        tokens, parents, depths, valid = rank_tree(lq, width, tree.budget, max(tree.branching))
        V = lq.shape[-1]
        trial = jnp.where(tokens[..., None] == jnp.arange(V), 0.0, -jnp.inf).astype(jnp.float32)
        return TreeProposal(tokens, parents, depths, trial, valid, new_state)

    # ------------------------------------------------------------------ row operations (compound state)
    def lengths(self, state):
        return state[0].lengths

    def set_lengths(self, state, lengths):
        return state[0].set_lengths(lengths), state[1]

    def copy_window(self, state, src, start, width: int):
        src = jnp.asarray(src, jnp.int32)
        return state[0].copy_window(src, start, width), jax.tree_util.tree_map(lambda x: x[src], state[1])

    def gather(self, state, index):
        index = jnp.asarray(index, jnp.int32)
        return state[0].gather(index), jax.tree_util.tree_map(lambda x: jnp.take(x, index, axis=0), state[1])

    def compact(self, state, start, index, count):
        return state


def rank_tree(lq, width, budget: int, cap: int):
    """A budgeted tree from per-depth distributions `lq [R, D, V]` (each depth's nodes share one, as in a SpecBlock
    block) and per-depth widths `width [R, D]` (<= cap): every node at depth d gets the top width[d] tokens of
    lq[d] as children; of all such nodes the `budget` with the highest cumulative log q are kept (a node's score
    never exceeds its parent's, and ties go to the shallower node, so the kept set contains its ancestors).
    Returns breadth-first (tokens, parents, depths, valid) `[R, budget]`."""
    R, D, V = lq.shape
    k = min(cap, V)
    top_lp, top_tok = jax.lax.top_k(lq, k)  # [R, D, k]
    allowed = (jnp.arange(k)[None, None, :] < width[..., None]) & (top_lp > -jnp.inf)
    score_d = jnp.where(allowed, top_lp, -jnp.inf)
    scores, toks, par, dep, offset = [], [], [], [], 0
    prev = None  # (scores [R, n]) of the kept nodes of the level above
    for d in range(D):
        if prev is None:
            s, t, pa = score_d[:, 0], top_tok[:, 0], jnp.full((R, k), -1, jnp.int32)
        else:
            n = prev.shape[1]
            s = (prev[:, :, None] + score_d[:, d][:, None, :]).reshape(R, n * k)
            t = jnp.broadcast_to(top_tok[:, d][:, None, :], (R, n, k)).reshape(R, n * k)
            pa = jnp.broadcast_to(offset - n + jnp.arange(n, dtype=jnp.int32)[None, :, None], (R, n, k)).reshape(R, -1)
        keep = min(budget, s.shape[1])  # at most `budget` nodes of one level can matter
        s, idx = jax.lax.top_k(s, keep)
        t, pa = jnp.take_along_axis(t, idx, 1), jnp.take_along_axis(pa, idx, 1)
        scores.append(s - 1e-6 * (d + 1))  # ties: the shallower node first
        toks.append(t)
        par.append(pa)
        dep.append(jnp.full((R, keep), d + 1, jnp.int32))
        prev, offset = s, offset + keep
    s, t, pa, dp = (jnp.concatenate(x, 1) for x in (scores, toks, par, dep))
    M = min(budget, s.shape[1])
    sel = jnp.sort(jax.lax.top_k(s, M)[1], axis=1)  # candidate order is breadth-first: parents come first
    new_index = jnp.full((R, s.shape[1]), -1, jnp.int32).at[jnp.arange(R)[:, None], sel].set(
        jnp.broadcast_to(jnp.arange(M, dtype=jnp.int32), (R, M)))
    valid = jnp.take_along_axis(s, sel, 1) > -jnp.inf
    parent_c = jnp.take_along_axis(pa, sel, 1)
    parents = jnp.where(parent_c < 0, -1, jnp.take_along_axis(new_index, jnp.maximum(parent_c, 0), 1))
    parents = jnp.where(valid, parents, -1)
    depths = jnp.where(valid, jnp.take_along_axis(dp, sel, 1), 1)
    out = (jnp.take_along_axis(t, sel, 1).astype(jnp.int32), parents, depths, valid)
    if M < budget:  # fewer candidate nodes than the budget: pad with invalid slots
        pad = budget - M
        out = tuple(jnp.concatenate([x, jnp.full((R, pad), f, x.dtype)], 1)
                    for x, f in zip(out, (0, -1, 1, False)))
    return out


def reference_block_logits(drafter: SpecBlockDrafter, target_hidden, anchor_pos: int, anchor_token, slots: int,
                           chain=None):
    """Cache-free reference of one block: (logits `[R, slots, V]`, raw hidden `[R, slots, H]`) of a block anchored at
    `anchor_pos` (the same for every row) with `anchor_token [R]`, from the target's hidden states `target_hidden
    [R, T, n*H]` (positions < `anchor_pos` are context; the anchor feature is position anchor_pos - 1's). With
    `chain = (raw [R, H], offset)` the block is chained: its anchor feature comes from the drafter's raw hidden
    state `raw` and its slots sit at anchor_pos + offset + k."""
    p = drafter.drafter_params()
    net = SpecBlockNet(drafter.block_config)
    R, T, _ = target_hidden.shape
    apply = lambda *a, method: net.apply({"params": p["net"]}, *a, method=method)  # noqa: E731
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (R, T))
    kv = apply(target_hidden, pos, method=SpecBlockNet.context_kv)
    mask = jnp.broadcast_to(jnp.arange(T)[None, None, :] < anchor_pos, (R, slots, T))
    ctx = [[Part(k, v, mask)] for k, v in kv]
    if chain is None:
        feat, offset = apply(target_hidden[:, anchor_pos - 1:anchor_pos], method=SpecBlockNet.feature), 0
    else:
        feat, offset = apply(chain[0][:, None], method=SpecBlockNet.chain_feature), chain[1]
    x = apply(feat, jnp.take(p["embed"], jnp.asarray(anchor_token, jnp.int32), axis=0)[:, None], slots,
              method=SpecBlockNet.inputs)
    bpos = jnp.broadcast_to(anchor_pos + offset + jnp.arange(slots, dtype=jnp.int32), (R, slots))
    h, raw = apply(x, slots, bpos, ctx, jnp.broadcast_to(causal_blocks(1, slots), (R, slots, slots)),
                   method=SpecBlockNet.block_hidden)
    return shared_head_logits(h, p), raw
