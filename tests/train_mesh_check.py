"""Drafter training on a device mesh (issue 36), run by tests/test_train_mesh.py in subprocesses: XLA_FLAGS must be set
before jax is imported, and the pytest process has already imported jax with one device.

One process with 8 host CPU devices (`--devices 8`):
- 20 steps of `distill_ar_drafter` on one device and on a (data=4, model=2) mesh, of `train_block_drafter` on one
  device and on (data=8, model=1): the per-step losses;
- a run checkpointed on one mesh shape and resumed on another (AR: 4x2 -> 2x4; block: 8x1 -> one device);
- `--recipes all`: a few steps of every other recipe (mask, specblock, rank head, local head, flex) on a 4x2 mesh
  against one device;
- the errors: batch rows the data axis does not divide, a mesh without the expected axes, a checkpoint from another
  drafter configuration.
Two processes x 4 devices (`--devices 4 --process-id i --num-processes 2 --port P`, joined by `jax.distributed`,
gloo collectives on CPU): one `smcsd.decode` on the global 4x2 mesh against the unsharded decode, the same AR and
block runs (checkpointed every 10 steps into one shared directory) and the AR resume across mesh shapes.

Prints one JSON object (process 0; also written to --out).

    python tests/train_mesh_check.py --devices 8 --out res.json
"""

from __future__ import annotations

import os
import sys


def _arg(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


NUM_DEVICES = int(_arg("--devices", "8"))
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    _flags += f" --xla_force_host_platform_device_count={NUM_DEVICES}"
# Fast CPU compiles (the one-device reference is compiled with the same flags).
_flags += " --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
os.environ["XLA_FLAGS"] = _flags
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402

if int(_arg("--num-processes", "1")) > 1:
    # An executable read back from the persistent compilation cache (conftest.py turns it on) fails in its first
    # cross-process transfer on CPU: compile afresh in the multi-process workers.
    jax.config.update("jax_enable_compilation_cache", False)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{_arg('--port', '12361')}", num_processes=int(_arg("--num-processes", "1")),
                               process_id=int(_arg("--process-id", "0")))

import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402

import smcsd  # noqa: E402
from smcsd.models import ByteTokenizer, ModelConfig, init_model  # noqa: E402
from smcsd.drafters.dflash import DFlashDrafter  # noqa: E402
from smcsd.train import TextCorpus, distill_ar_drafter, draft_config_for, train_block_drafter  # noqa: E402

TOK = ByteTokenizer()
STEPS = 20
# 4 query / 2 KV heads and an MLP of 64 split over model=2 (vocab 259 does not: the embedding splits its hidden dim)
TARGET = ModelConfig(vocab_size=TOK.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                     bos_token_id=TOK.bos_id, eos_token_id=TOK.eos_id, pad_token_id=TOK.pad_id)
DRAFT = draft_config_for(TARGET, hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32)


def texts(n=48, seed=0):
    rng = np.random.default_rng(seed)
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "def", "f(x):", "return", "x"]
    return [" ".join(rng.choice(words, size=30)) + "." for _ in range(n)]


def corpus(batch_size=8):
    return TextCorpus(texts(), tokenizer=TOK, seq_len=16, batch_size=batch_size, heldout_frac=0.1)


def target():
    return init_model(TARGET, seed=3, tokenizer=TOK, init_std=0.5, name="tiny-target")


def mesh_of(shape):
    return None if shape is None else smcsd.make_mesh(*shape)


def losses(res):
    h = res.history
    return {"loss": [r["loss"] for r in h["train"]], "steps": [r["step"] for r in h["train"]],
            "eval": [{k: v for k, v in e.items()} for e in h["eval"]], "placements": h.get("placements", [])}


AR_KW = dict(steps=STEPS, lr=1e-2, warmup=3, topk=8, eval_every=10, ckpt_every=10, progress=False)
BLOCK_KW = dict(steps=STEPS, lr=1e-2, warmup=3, num_anchors=4, topk=8, kl_weight=0.5, eval_every=10,
                ckpt_every=10, progress=False)


def run_ar(t, shape, ckpt=None, **kw):
    args = dict(AR_KW, ckpt_dir=ckpt, mesh=mesh_of(shape))
    args.update(kw)
    return distill_ar_drafter(t, DRAFT, corpus(), **args)


def block_drafter(t):
    return DFlashDrafter.create(t, num_layers=1, block_size=4, seed=0)


def run_block(t, shape, ckpt=None, data=None, **kw):
    args = dict(BLOCK_KW, ckpt_dir=ckpt, mesh=mesh_of(shape))
    args.update(kw)
    return train_block_drafter(t, block_drafter(t), data or corpus(), **args)


def rel_diff(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return float("inf")
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-12)))


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def check_runs(t, work, *, reference: bool):
    """The AR and block runs on their meshes (and, with `reference`, on one device), and the resumes."""
    out = {}
    if reference:
        out["ar_one_device"] = losses(run_ar(t, None))
        out["block_one_device"] = losses(run_block(t, None))
    res, out["ar_4x2_s"] = timed(lambda: run_ar(t, (4, 2), ckpt=os.path.join(work, "ar-full")))
    out["ar_4x2"] = losses(res)
    out["ar_4x2_params_replicated"] = replicated_on_all(res.params)
    out["ar_4x2_ckpt_steps"] = sorted(int(d) for d in os.listdir(os.path.join(work, "ar-full")) if d.isdigit())
    res, out["block_8x1_s"] = timed(lambda: run_block(t, (8, 1), ckpt=os.path.join(work, "block-full")))
    out["block_8x1"] = losses(res)
    # checkpointed on one mesh shape, resumed on another
    part = run_ar(t, (4, 2), ckpt=os.path.join(work, "ar-part"), stop_after=10)
    resumed = run_ar(t, (2, 4), ckpt=os.path.join(work, "ar-part"), resume=True)
    out["ar_resume_4x2_to_2x4"] = {"part_steps": part.history["step"], **losses(resumed)}
    # the teacher on one mesh (4x2: the target split in 2), the drafter step on another (8x1: all devices on data)
    from smcsd.train import TeacherStream
    stream = TeacherStream(t, corpus(), topk=8, layers=block_drafter(t).block_config.target_layers,
                           mesh=smcsd.make_mesh(4, 2))
    out["block_teacher_4x2_step_8x1"] = losses(run_block(t, (8, 1), data=stream))
    if reference:
        part = run_block(t, (8, 1), ckpt=os.path.join(work, "block-part"), stop_after=10)
        resumed = run_block(t, None, ckpt=os.path.join(work, "block-part"), resume=True)
        out["block_resume_8x1_to_one_device"] = {"part_steps": part.history["step"], **losses(resumed)}
    return out


def check_layout(t, work):
    """The arrays really are where `Placement` says: batch rows split over "data" (each process feeding its own), the
    teacher's target split over "model" on this process's devices, the frozen head vocab/hidden-parallel, the trained
    drafter replicated on all 8 devices; the teacher cache holds each process's own rows only."""
    from smcsd.train import TeacherStream, placement
    m = smcsd.make_mesh(4, 2)
    pl = placement(m)
    rows = pl.local_rows(8)
    stream = TeacherStream(t, corpus(), topk=8, layers=(1,), mesh=m)
    b = pl.shard_batch(stream.batch(0, rows))
    ref = TeacherStream(t, corpus(), topk=8, layers=(1,)).batch(0)  # one device, all rows
    q = stream._run_params["layers"]["self_attn"]["q_proj"]["kernel"]
    shared = pl.shard_frozen(block_drafter(t).shared, TARGET)
    out = {"local_rows": rows.tolist(), "teacher_mesh": dict(stream.mesh.shape),
           "teacher_local": all(d.process_index == jax.process_index() for d in stream.mesh.devices.flat),
           "tokens_spec": str(b["tokens"].sharding.spec),
           "tokens_shard_rows": sorted({int(sh.data.shape[0]) for sh in b["tokens"].addressable_shards}),
           "tokens_equal": bool(np.array_equal(pl.to_host(b["tokens"]), ref["tokens"])),
           "teacher_max_rel_diff": float(max((np.abs(pl.to_host(b[k]) - ref[k]) / np.maximum(np.abs(ref[k]), 1.0)).max()
                                             for k in ("topk_logp", "hidden"))),
           "teacher_ids_equal": bool(np.array_equal(pl.to_host(b["topk_ids"]), ref["topk_ids"])),
           "teacher_q_spec": str(q.sharding.spec), "embed_spec": str(shared["embed"].sharding.spec)}
    # the teacher cache: each process computes (and stores) exactly the rows it feeds
    cached = TeacherStream(t, corpus(), topk=8, cache_dir=os.path.join(work, "teacher-cache"), mesh=m)
    computed = []
    compute = cached.compute
    cached.compute = lambda tokens: (computed.append(len(tokens)), compute(tokens))[1]
    for step in range(3):
        cached.batch(step, rows)
    out["cache_shard_rows"] = cached.shard_rows
    out["teacher_rows_computed"] = int(sum(computed))
    out["teacher_rows_fed"] = 3 * len(rows)
    return out


def check_global_target(t):
    """A target already on the global mesh (as `models.load_sharded` gives it; across processes its arrays are not
    fully addressable): the teacher rebuilds its local copy from this process's shards, the fingerprint gathers, and
    a block drafter trains from it (first 2 steps)."""
    from smcsd.models.sharding import shard_params
    from smcsd.train import TeacherStream, params_fingerprint, placement
    m = smcsd.make_mesh(4, 2)
    tg = shard_params(t, m)
    rows = placement(m).local_rows(8)
    a = TeacherStream(tg, corpus(), topk=8, layers=(1,), mesh=m).batch(0, rows)
    b = TeacherStream(t, corpus(), topk=8, layers=(1,), mesh=m).batch(0, rows)
    res = run_block(tg, (8, 1), stop_after=2, eval_every=100)
    return {"global": any(not x.is_fully_addressable for x in jax.tree_util.tree_leaves(tg.params)),
            "fingerprint_equal": params_fingerprint(tg.params) == params_fingerprint(t.params),
            "teacher_equal": all(np.array_equal(a[k], b[k]) for k in a), **losses(res)}


def replicated_on_all(params) -> bool:
    return all(isinstance(x.sharding, NamedSharding) and x.sharding.is_fully_replicated
               and x.sharding.mesh.devices.size == jax.device_count() for x in jax.tree_util.tree_leaves(params))


def check_decode():
    """One decode on the global 4x2 mesh against the unsharded decode (each process runs that on its own device)."""
    tgt = init_model(TARGET, 0, init_std=0.2, name="t")
    drf = init_model(DRAFT, 1, init_std=0.2, name="d")
    prompts = [[3 + b, 17 * b % 200, 40 + b][: 1 + b % 3] for b in range(8)]
    kw = dict(max_new_tokens=6, num_particles=2, num_speculative_tokens=2, seed=0, temperature=1.0)
    out = {}
    for method in ("smc",):
        ref = smcsd.decode(prompts, target=tgt, draft=drf, method=method, **kw)
        res = smcsd.decode(prompts, target=tgt, draft=drf, method=method, mesh=smcsd.make_mesh(4, 2), **kw)
        out[method] = {"tokens_equal": ref.tokens == res.tokens, "num_target_calls": res.stats.num_target_calls}
    return out


def check_generate():
    """The corpus builder's generation (`smcsd.train.corpus.generate`) on the global 4x2 and 8x1 meshes against one
    device: 12 requests over 8 slots (refilled), half greedy, half sampled at T=0.8."""
    from smcsd.train.corpus import generate
    tgt = init_model(TARGET, 0, init_std=0.2, name="t")
    reqs = [[3 + b, 17 * b % 200, 40 + b][: 1 + b % 3] for b in range(12)]
    kw = dict(keys=list(range(12)), temperatures=[0.0, 0.8] * 6, max_new_tokens=10, stop_ids=[TOK.eos_id],
              batch_size=8, prefill_rows=4, chunk=4)
    ref, ref_fin = generate(tgt, reqs, **kw)
    out = {}
    for shape in ((4, 2), (8, 1)):
        got, fin = generate(tgt, reqs, mesh=smcsd.make_mesh(*shape), **kw)
        out[f"{shape[0]}x{shape[1]}"] = {"tokens_equal": [a.tolist() for a in got] == [a.tolist() for a in ref],
                                         "finished_equal": fin == ref_fin,
                                         "num_tokens": int(sum(len(a) for a in got))}
    return out


def check_recipes(t):
    """A few steps of every other recipe on a 4x2 mesh against one device."""
    from smcsd.drafters.flex import FlexDrafter
    from smcsd.drafters.dels import LocalHead
    from smcsd.drafters.pard2 import PARD2Drafter
    from smcsd.drafters.specblock import SpecBlockDrafter
    from smcsd.train import train_flex, train_local_head, train_rank_head, train_specblock
    from smcsd.train.pard2 import train_mask_drafter
    kw = dict(steps=4, lr=1e-2, warmup=1, eval_every=4, progress=False)
    small = init_model(DRAFT, seed=1, tokenizer=TOK, name="small")
    spec = lambda: SpecBlockDrafter.create(t, num_layers=1, block_size=3)  # noqa: E731
    no_warmup = {k: v for k, v in kw.items() if k != "warmup"}
    runs = {
        "mask": lambda m: train_mask_drafter(t, PARD2Drafter.create(small, target=t, feature_layers=(1,)), corpus(),
                                             depth=3, topk=8, mesh=m, **kw),
        "specblock": lambda m: train_specblock(t, spec(), corpus(), num_anchors=3, topk=8, mesh=m, **kw),
        "rank_head": lambda m: train_rank_head(t, spec(), corpus(), num_anchors=3, topk=8, width=16, mesh=m,
                                               **no_warmup)[0],
        "local_head": lambda m: train_local_head(t, LocalHead.create(t, rank=8, hidden=8), corpus(), depth=3,
                                                 mesh=m, **kw)[0],
        "flex": lambda m: train_flex(t, FlexDrafter.create(t, group_size=2, adapter_layers=1, calib_hidden=16),
                                     corpus(), num_anchors=3, topk=8, mesh=m, **kw)[0],
    }
    out = {}
    for name, fn in runs.items():
        one, mesh = fn(None), fn(smcsd.make_mesh(4, 2))
        out[name] = {"one_device": losses(one), "mesh_4x2": losses(mesh),
                     "max_rel_diff": rel_diff([r["loss"] for r in mesh.history["train"]],
                                              [r["loss"] for r in one.history["train"]])}
        print(json.dumps({name: out[name]["max_rel_diff"]}), file=sys.stderr, flush=True)
    return out


def check_errors(t, work):
    out = {}

    def capture(label, fn):
        try:
            fn()
            out[label] = None
        except ValueError as e:
            out[label] = str(e)

    capture("batch_rows", lambda: distill_ar_drafter(t, DRAFT, corpus(batch_size=4), steps=2, progress=False,
                                                     mesh=smcsd.make_mesh(8, 1)))
    capture("block_batch_rows", lambda: train_block_drafter(t, block_drafter(t), corpus(batch_size=6), steps=2,
                                                            progress=False, mesh=smcsd.make_mesh(4, 2)))
    capture("mesh_axes", lambda: distill_ar_drafter(t, DRAFT, corpus(), steps=2, progress=False,
                                                    mesh=jax.make_mesh((8,), ("x",))))
    ck = os.path.join(work, "other-config")
    run_ar(t, (4, 2), ckpt=ck, steps=4, stop_after=2, eval_every=100)
    other = draft_config_for(TARGET, hidden=32, layers=1, heads=2, kv_heads=1, intermediate=32)
    capture("other_drafter_config", lambda: distill_ar_drafter(t, other, corpus(), **dict(
        AR_KW, steps=4, eval_every=100, ckpt_dir=ck, resume=True, mesh=smcsd.make_mesh(8, 1))))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--num-processes", type=int, default=1)
    ap.add_argument("--process-id", type=int, default=0)
    ap.add_argument("--port", type=int, default=12361)
    ap.add_argument("--work", default=None, help="a directory every process sees (checkpoints)")
    ap.add_argument("--recipes", default="ar,block", help="'all' adds the other recipes (single process)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    start = time.perf_counter()
    work = args.work or tempfile.mkdtemp(prefix="train-mesh-")
    t = target()
    multi = jax.process_count() > 1
    result = {"devices": jax.device_count(), "local_devices": jax.local_device_count(),
              "processes": jax.process_count()}
    if multi:
        result["decode"] = check_decode()
        result["global_target"] = check_global_target(t)
    else:
        result["errors"] = check_errors(t, work)
    result["generate"] = check_generate()
    result["layout"] = check_layout(t, work)
    result.update(check_runs(t, work, reference=not multi))
    if args.recipes == "all" and not multi:
        result["recipes"] = check_recipes(t)
    result["seconds"] = time.perf_counter() - start
    if jax.process_index() == 0:
        text = json.dumps(result)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text)
        print(text)


if __name__ == "__main__":
    main()
