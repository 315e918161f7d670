"""The acceptance math of the exact methods, as pure functions over probabilities and uniforms.

Every exact method verifies its drafts with these, so the rule that keeps the output law equal to `ar`'s lives in
one place and is tested on its own (tests/test_verify.py), apart from any model or cache:

- `chain`: one drafted chain — the test min(1, p(x)/q(x)), the residual norm(max(0, p − q)), and the whole
  chain's acceptance (`sd`, `flex`, `sd-overlap`);
- `multi`: recursive rejection sampling over N independent chains (`sd-multi`);
- `tree`: the same walk over a token tree whose children may be i.i.d., drawn without replacement or deterministic
  (`sd-tree`).

The functions take their uniforms as arguments rather than a key, so a test can drive them with chosen or
quadrature uniforms and the methods keep drawing them exactly as before.
"""

from .chain import accept_test, chain_accept, residual, sample_probs, take
from .multi import rrs_walk
from .tree import tree_walk

__all__ = ["accept_test", "chain_accept", "residual", "rrs_walk", "sample_probs", "take", "tree_walk"]
