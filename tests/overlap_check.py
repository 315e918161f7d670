"""`sd-overlap` on 8 host CPU devices (4 for the target, 4 for the drafter), run by tests/test_overlap.py in a
subprocess (XLA_FLAGS must be set before jax is imported). On a toy pair: tokens of the overlapped run equal the
sequential order's on the same groups and the one-device fallback's, and a timeline of the overlapped run says
how long both groups were busy at once. Prints one JSON object (and writes --out).

    python tests/overlap_check.py --out overlap.json
"""

from __future__ import annotations

import os

NUM_DEVICES = 8
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    _flags += f" --xla_force_host_platform_device_count={NUM_DEVICES}"
_flags += " --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"  # fast CPU compiles
os.environ["XLA_FLAGS"] = _flags
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402

import smcsd  # noqa: E402
from smcsd.models import ModelConfig, init_model  # noqa: E402
from smcsd.decode import prepare  # noqa: E402
from smcsd.methods.sd_overlap import OverlapRunner, overlap_seconds, split_devices  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args(argv)
    # A target big enough that a verification takes a few milliseconds, a draft a quarter of its depth.
    tc = ModelConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    dc = ModelConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)
    target, draft = init_model(tc, seed=0), init_model(dc, seed=1)
    prompts = [[1 + (7 * i + j) % 500 for j in range(12 + i % 5)] for i in range(args.batch)]
    kw = dict(target=target, draft=draft, method="sd-overlap", max_new_tokens=48, temperature=1.0, seed=5,
              num_speculative_tokens=4, eos_id=[])
    groups = split_devices(jax.devices(), args.batch // 2)
    one = smcsd.decode(prompts, **kw, mesh=split_devices(jax.devices()[:1], args.batch // 2))
    res = smcsd.decode(prompts, **kw, mesh=groups)
    p = prepare(prompts, **kw, mesh=groups)
    seq = OverlapRunner(p.target.config, p.draft, p.spec, mesh=p.mesh, sequential=True)
    seq.compile(*p.args)
    raw_seq = seq(*p.args)
    tokens_seq = [list(r[:n]) for r, n in zip(raw_seq["tokens"].tolist(), raw_seq["lengths"].tolist())]
    traced = OverlapRunner(p.target.config, p.draft, p.spec, mesh=p.mesh, trace=True)
    traced.compile(*p.args)
    start = time.perf_counter()
    traced(*p.args)
    wall = time.perf_counter() - start
    report = {"devices": len(jax.devices()), "groups": [groups.target.devices.size, groups.drafter.devices.size],
              "tokens_equal_sequential": tokens_seq == res.tokens, "tokens_equal_one_device": one.tokens == res.tokens,
              "timeline": overlap_seconds(traced.last_timeline), "overlap_wall_s": wall,
              "num_events": len(traced.last_timeline)}
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
