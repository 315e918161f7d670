"""Token trees on the drafter side: the static shape of a tree (`TreeSpec`) and how a node's children are drawn.

A tree of M nodes hangs under the pending token x_0 (the root, not a node). Nodes are stored breadth-first:
the *product* part first (every node at depth d−1 gets `branching[d−1]` children), then D²SD's re-anchored
branches (`branches` of them, `depth` slots each, filled by `D2SDDrafter`). A node's children are drawn in
one of three ways, and each way comes with the distribution the exact tree walk (`smcsd/methods/sd_tree.py`) must
test that child against — its *trial distribution*, what `TreeProposal.logq` holds:

- `"sample"` — i.i.d. draws from q at the parent (SpecInfer). Trial distribution: q itself.
- `"distinct"` — drawn without replacement (Gumbel-top-k). Child i was drawn from q with the earlier siblings
  removed and renormalised; that is its trial distribution (Jeon et al. 2024, "Recursive Speculative
  Decoding").
- `"top"` — the k most likely tokens, chosen deterministically. Trial distribution: a point mass on the child
  (the EAGLE rule: accept with probability r(x), else zero r(x) and renormalise). Exact too; testing a top-k
  child against the soft q instead would not be.

With these trial distributions recursive rejection sampling down the tree is exact for all three (and for any
mix, as long as each child's recorded distribution is its law given everything drawn before it).

A *budgeted* tree (`budget` > 0, SpecBlock's rank-head trees, string form "rank:24x4") has no fixed shape: the
drafter chooses each node's width from a rank head's prediction (`rank_widths[c]` for class c), takes that many
"top" children, and keeps the `budget` nodes of highest cumulative log q. Only the node count M = budget, the
depth and the widest node are static; parents and depths travel with the proposal.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

CHILDREN = ("sample", "distinct", "top")


@dataclasses.dataclass(frozen=True)
class TreeSpec:
    """The static shape of a draft tree (part of the compiled program's key).

    branching: children per node at each depth (its length is the tree's depth D); e.g. `(2, 2, 1, 1)` gives
    2 + 4 + 4 + 4 = 14 nodes, `(3, 1, 1, 1)` three disjoint chains (sd-multi's forest in one row),
    `(1,) * K` a chain. children: how siblings are drawn (module docstring). branches: D²SD's alternative
    branches, re-anchored at the most likely rejection points (only `D2SDDrafter` fills them).
    """

    branching: tuple[int, ...] = (2, 2, 1, 1)
    children: str = "sample"
    branches: int = 0
    budget: int = 0  # > 0: a budgeted rank-head tree of `budget` nodes (module docstring)
    rank_widths: tuple[int, ...] = (2, 4, 6, 4)  # children per rank class (rank 1 / 2-4 / 5-10 / > 10)

    def __post_init__(self):
        b = self.branching
        if isinstance(b, int) and not isinstance(b, bool):
            b = (b,)
        if not isinstance(b, (tuple, list)) or not b or not all(
                isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= 1 for x in b):
            raise ValueError(f"tree branching must be a non-empty tuple of ints >= 1 (children per node at each "
                             f"depth, e.g. (2, 2, 1, 1)), got {self.branching!r}")
        object.__setattr__(self, "branching", tuple(int(x) for x in b))
        if self.children not in CHILDREN:
            raise ValueError(f"tree children must be one of {CHILDREN}, got {self.children!r}")
        if isinstance(self.branches, bool) or not isinstance(self.branches, (int, np.integer)) or self.branches < 0:
            raise ValueError(f"tree branches must be an int >= 0, got {self.branches!r}")
        object.__setattr__(self, "branches", int(self.branches))
        if isinstance(self.budget, bool) or not isinstance(self.budget, (int, np.integer)) or self.budget < 0:
            raise ValueError(f"tree budget must be an int >= 0, got {self.budget!r}")
        object.__setattr__(self, "budget", int(self.budget))
        object.__setattr__(self, "rank_widths", tuple(int(w) for w in self.rank_widths))
        if self.budget:
            if self.children != "top" or self.branches or len(self.rank_widths) != 4 or min(self.rank_widths) < 0:
                raise ValueError("a budgeted (rank-head) tree takes 'top' children, no D²SD branches and four "
                                 f"rank_widths >= 0; got children={self.children!r}, branches={self.branches}, "
                                 f"rank_widths={self.rank_widths}")
            object.__setattr__(self, "branching", (max(1, max(self.rank_widths)),) * self.depth)
        if self.branches >= self.depth + 1:
            raise ValueError(f"a tree of depth {self.depth} has {self.depth} re-anchoring points; "
                             f"branches={self.branches} is too many (at most {self.depth})")

    @classmethod
    def parse(cls, text: str) -> "TreeSpec":
        """From the CLI form "2,2,1,1", "2,2,1,1:distinct", "1,1,1,1+2" (a chain plus 2 D²SD branches)."""
        if isinstance(text, TreeSpec):
            return text
        if isinstance(text, str) and text.strip().startswith("rank:"):
            try:
                budget, depth = (int(x) for x in text.strip()[5:].split("x"))
            except ValueError:
                raise ValueError(f"tree {text!r}: a rank-head tree is written 'rank:<budget>x<depth>', e.g. "
                                 "'rank:24x4'") from None
            return cls((1,) * depth, "top", budget=budget)
        if not isinstance(text, str):
            raise TypeError(f"tree must be a smcsd.TreeSpec or a string like '2,2,1,1:sample', got {text!r}")
        s, children, branches = text.strip(), "sample", 0
        if ":" in s:
            s, children = s.split(":", 1)
        if "+" in s:
            s, extra = s.split("+", 1)
            try:
                branches = int(extra)
            except ValueError:
                raise ValueError(f"tree {text!r}: the number after '+' (D²SD branches) must be an int") from None
        try:
            branching = tuple(int(x) for x in s.split(",")) if s.strip() else ()
        except ValueError:
            raise ValueError(f"tree {text!r}: expected children per depth like '2,2,1,1' (optionally ':sample', "
                             "':distinct' or ':top', and '+B' for D²SD branches)") from None
        return cls(branching, children.strip(), branches)

    def __str__(self):
        if self.budget:
            return f"rank:{self.budget}x{self.depth}"
        return ",".join(map(str, self.branching)) + (f"+{self.branches}" if self.branches else "") + f":{self.children}"

    @property
    def depth(self) -> int:
        return len(self.branching)

    @property
    def shape(self) -> str:
        """"product" (fixed children per depth), "rank" (a budgeted rank-head tree) or "branches" (a product tree
        plus D²SD branches): what a drafter must build (`Drafter.tree_shapes`)."""
        return "rank" if self.budget else "branches" if self.branches else "product"

    @property
    def needs(self) -> str:
        """What this tree's shape asks of a drafter, for the error of one that cannot build it."""
        if self.budget:
            return ("is a rank-head tree, which needs a SpecBlockDrafter with a rank head "
                    "(smcsd.load(pair, drafter='specblock'))")
        if self.branches:
            return (f"asks for D²SD branches ('+{self.branches}'), which need a D2SDDrafter "
                    "(smcsd.load(pair, drafter='d2sd'))")
        return "is a product tree"

    @property
    def level_widths(self) -> tuple[int, ...]:
        """Nodes of the product part at depths 1..D."""
        return tuple(int(np.prod(self.branching[:d + 1])) for d in range(self.depth))

    @property
    def product_nodes(self) -> int:
        return sum(self.level_widths)

    @property
    def num_nodes(self) -> int:
        """M: every node slot (the target verifies M + 1 tokens per call: the root x_0 and the nodes)."""
        if self.budget:
            return self.budget
        return self.product_nodes + self.branches * self.depth

    @property
    def max_candidates(self) -> int:
        """A bound on the nodes at one depth (what the tree walk tries per depth)."""
        if self.budget:
            return max(self.branching)
        return max(self.level_widths) + self.branches

    def product_layout(self) -> tuple[np.ndarray, np.ndarray]:
        """(parents, depths) of the product part, breadth-first; parent −1 is the root."""
        parents, depths, prev = [], [], [-1]
        for d, b in enumerate(self.branching):
            level = []
            for p in prev:
                for _ in range(b):
                    level.append(len(parents))
                    parents.append(p)
                    depths.append(d + 1)
            prev = level
        return np.asarray(parents, np.int32), np.asarray(depths, np.int32)


def chain(depth: int) -> TreeSpec:
    return TreeSpec((1,) * int(depth))


def draw_children(key, logq, num: int, children: str):
    """Draw `num` children of each parent from its processed log-distribution `logq [R, P, V]`.

    Returns `tokens int32[R, P, num]`, their trial log-distributions `[R, P, num, V]` (module docstring) and
    `valid bool[R, P, num]` (False where q has fewer than `num` tokens to give without replacement)."""
    R, P, V = logq.shape
    if children == "sample":
        g = jax.random.gumbel(key, (R, P, num, V), jnp.float32)
        tokens = jnp.argmax(logq[:, :, None, :] + g, axis=-1).astype(jnp.int32)
        trial = jnp.broadcast_to(logq[:, :, None, :], (R, P, num, V))
        return tokens, trial, jnp.ones((R, P, num), bool)
    if children == "distinct":
        score = logq + jax.random.gumbel(key, (R, P, V), jnp.float32)
    elif children == "top":
        score = logq
    else:
        raise ValueError(f"children must be one of {CHILDREN}, got {children!r}")
    _, tokens = jax.lax.top_k(score, num)  # [R, P, num], distinct
    tokens = tokens.astype(jnp.int32)
    valid = jnp.take_along_axis(logq, tokens, axis=-1) > -jnp.inf
    onehot = tokens[..., None] == jnp.arange(V)  # [R, P, num, V]
    if children == "top":
        trial = jnp.where(onehot, 0.0, -jnp.inf)
    else:  # child i: q without the earlier siblings, renormalised
        earlier = jnp.cumsum(onehot, axis=2) - onehot  # tokens drawn before child i
        masked = jnp.where(earlier > 0, -jnp.inf, logq[:, :, None, :])
        z = jax.nn.logsumexp(masked, axis=-1, keepdims=True)
        trial = jnp.where(jnp.isfinite(z), masked - jnp.where(jnp.isfinite(z), z, 0.0), -jnp.inf)
    return tokens, trial.astype(jnp.float32), valid


def product_tree(key, spec: TreeSpec, level_logq):
    """Fill the product part of a tree level by level: `level_logq(d, tokens_so_far) -> [R, w_d, V]` gives the
    processed distribution at each depth-d node (d = 0: the root, `[R, 1, V]`). Returns (tokens [R, Mp],
    trial logq [R, Mp, V], valid [R, Mp]) breadth-first."""
    keys = jax.random.split(key, spec.depth)
    toks, logqs, valids = [], [], []
    for d, b in enumerate(spec.branching):
        q = level_logq(d, toks)  # [R, w_{d}, V] (w_0 = 1)
        t, lq, ok = draw_children(keys[d], q, b, spec.children)
        R = t.shape[0]
        toks.append(t.reshape(R, -1))
        logqs.append(lq.reshape(R, -1, lq.shape[-1]))
        valids.append(ok.reshape(R, -1))
    return jnp.concatenate(toks, 1), jnp.concatenate(logqs, 1), jnp.concatenate(valids, 1)


@functools.lru_cache(maxsize=None)
def static_ancestors(spec: TreeSpec) -> np.ndarray:
    """bool [Mp, Mp] ancestor-or-self mask of the product part."""
    parents, _ = spec.product_layout()
    M = len(parents)
    out = np.eye(M, dtype=bool)
    for m in range(M):
        if parents[m] >= 0:
            out[m] |= out[parents[m]]
    return out
