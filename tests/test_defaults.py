"""decode()'s defaults (smcsd/defaults.py): chosen by measurement per pair, backend and drafter, stored with the
pair, never slower than ar where measured; generic ones for other models."""

from __future__ import annotations

import json
import os

import pytest

import smcsd
from smcsd.models import init_model
from smcsd.models.shipped import SHIPPED_DIR
from smcsd import defaults
from smcsd.defaults import FILENAME, SCHEMA
from smcsd.drafters import as_drafter

from toys import tiny_config

PAIRS = ["tiny-code", "tiny-arith", "smollm2-135m"]


def stored(pair):
    path = os.path.join(SHIPPED_DIR, pair, FILENAME)
    assert os.path.isfile(path), f"{path} missing: python -m experiments.studies.choose_defaults --pair {pair} --write"
    with open(path) as f:
        return json.load(f)


def machine_docs():
    """(pair, path) of every shipped per-machine choice (decode_defaults.machines/*.json)."""
    return [(pair, os.path.join(SHIPPED_DIR, pair, defaults.MACHINES_DIR, name)) for pair in PAIRS
            if os.path.isdir(os.path.join(SHIPPED_DIR, pair, defaults.MACHINES_DIR))
            for name in sorted(os.listdir(os.path.join(SHIPPED_DIR, pair, defaults.MACHINES_DIR)))]


@pytest.mark.parametrize("pair, path", [(p, None) for p in PAIRS] + machine_docs())
def test_stored_defaults_are_the_fastest_passing_candidate(pair, path):
    """Each stored default (a pair's backend-wide choice and each of its per-machine ones) is, among the measured
    candidates that pass the quality test, the fastest (measured on CPU, projected for accelerators), so it is never
    slower than ar (itself a candidate); the file says how it was chosen, and a per-machine file is named after the
    machine it was measured on."""
    if path is None:
        data = stored(pair)
    else:
        with open(path) as f:
            data = json.load(f)
        key = data["machine"]["machine_key"]
        assert os.path.basename(path) == defaults.machine_slug(key) + ".json"
        assert "greedy" not in data or data["greedy"]["machine"]["machine_key"] == key  # both regimes on one machine
    assert data["schema"] == SCHEMA and data["command"].startswith(("python experiments/choose_defaults.py",  # recorded before the package
                                                                         "python -m experiments.studies.choose_defaults"))
    for backend, key in (("cpu", "speedup_vs_ar"), ("accelerator", "projected_h100_speedup")):
        for drafter, entry in data["backends"][backend].items():
            rows = data["candidates"][drafter]
            assert any(r["label"] == "ar" for r in rows)
            passing = [r for r in rows if r["passes"]]
            best = max(passing, key=lambda r: r[key])
            assert entry["default"] == best["candidate"], (backend, drafter)
            assert entry["speedup_vs_ar"] >= 1.0 - 1e-9
            ar_q = data.get("ar_quality_of", {}).get(drafter, data["ar_quality"])  # merged runs keep their own
            for r in rows:  # the quality verdicts follow the stored tolerance
                if r["candidate"]["method"] == "smc":
                    tol = data["tolerance"]["arith_points"] / 100 if r["quality"]["metric"] == "accuracy" \
                        else data["tolerance"]["logp_nats_per_token"]
                    assert r["passes"] == (r["quality"]["value"] >= ar_q["value"] - tol)
            for b, e in entry.get("by_batch", {}).items():  # measured again at larger batch sizes (cpu)
                assert int(b) >= 2 and any(c["label"] == "ar" for c in e["candidates"])
                assert e["default"] == max(e["candidates"], key=lambda c: c["speedup_vs_ar"])["candidate"]
                assert e["speedup_vs_ar"] >= 1.0 - 1e-9
        greedy = data.get("greedy")  # the greedy regime (choose_defaults --temperature 0), where chosen
        for drafter, entry in (greedy or {}).get("backends", {}).get(backend, {}).items():
            rows = greedy["candidates"][drafter]
            assert greedy["settings"]["temperature"] == 0 and all(r["passes"] for r in rows)  # all exact there
            assert entry["default"] == max(rows, key=lambda r: r[key])["candidate"], ("greedy", backend, drafter)
            assert entry["speedup_vs_ar"] >= 1.0 - 1e-9
        if "default_drafter" in data:  # the pair's default drafter is the one with the fastest default
            entries = data["backends"][backend]
            rank = lambda n: (entries[n]["speedup_vs_ar"], entries[n].get("speculative_speedup") or 0.0)  # noqa: E731
            assert rank(data["default_drafter"][backend]) == max(rank(n) for n in entries)


def test_load_gives_the_stored_default_drafter(monkeypatch):
    """`smcsd.load(pair)` without a drafter name gives the stored default drafter of this backend; a stored name
    the pair does not ship falls back to its best model drafter."""
    real = defaults.load_defaults("tiny-code")
    fake = {**real, "default_drafter": {defaults.backend(): "dflash"}}
    monkeypatch.setattr(defaults, "load_defaults", lambda pair: fake if pair == "tiny-code" else None)
    assert smcsd.load("tiny-code")[1].name == "tiny-code/dflash"
    fake["default_drafter"] = {defaults.backend(): "no-such-drafter"}
    assert smcsd.load("tiny-code")[1].name == "tiny-code/ar-distilled"


def test_decode_without_a_method_runs_the_pairs_default():
    """No models: the tiny-code pair with its best drafter, and the stored CPU choice for it."""
    entry = stored("tiny-code")["backends"][defaults.backend()]["ar-distilled"]["default"]
    target, draft = smcsd.load("tiny-code")
    a = smcsd.decode("import os\n", max_new_tokens=8, temperature=0.7, seed=3)
    kw = {k: v for k, v in entry.items() if k != "method"} if entry["method"] != "ar" else {}
    b = smcsd.decode("import os\n", target=target, draft=draft if entry["method"] != "ar" else None,
                     method=entry["method"], max_new_tokens=8, temperature=0.7, seed=3, **kw)
    assert a.stats.method == entry["method"] and a.tokens == b.tokens
    assert smcsd.decode("import os\n", target=target, max_new_tokens=2).stats.method == "ar"


def test_greedy_decoding_takes_the_pairs_greedy_choice_and_its_tree(monkeypatch):
    """At temperature 0 `decode` runs the stored greedy choice (here an sd-tree, whose tree comes from the file: the
    same tokens as naming it), at any other temperature the sampled one; a K given by the caller overrides the
    stored tree's depth (sd-tree then builds the generic tree of that depth)."""
    real = defaults.load_defaults("tiny-code")
    tree = {"method": "sd-tree", "num_particles": 1, "num_speculative_tokens": 2, "tree": "2,1:top"}
    entry = {"default": tree, "speedup_vs_ar": 1.2, "methods": {"sd-tree": tree}}
    fake = {**real, "greedy": {"backends": {defaults.backend(): {"ar-distilled": entry}}, "candidates": {}}}
    monkeypatch.setattr(defaults, "load_defaults", lambda pair: fake if pair == "tiny-code" else None)
    target, draft = smcsd.load("tiny-code")
    c = defaults.choose(target, as_drafter(draft), None, 0.0)
    assert (c.method, c.tree, c.num_speculative_tokens) == ("sd-tree", "2,1:top", 2) and "greedy" in c.source
    assert defaults.choose(target, as_drafter(draft), "sd-tree", 0).tree == "2,1:top"
    sampled = defaults.choose(target, as_drafter(draft), None, 0.7)
    assert sampled.method == real["backends"][defaults.backend()]["ar-distilled"]["default"]["method"]
    assert sampled.tree is None
    a = smcsd.decode("import os\n", target=target, draft=draft, max_new_tokens=10, temperature=0, seed=1)
    b = smcsd.decode("import os\n", target=target, draft=draft, method="sd-tree", tree="2,1:top", max_new_tokens=10,
                     temperature=0, seed=1)
    assert a.stats.method == "sd-tree" and a.tokens == b.tokens
    assert a.stats.num_draft_tokens == 4 * a.stats.num_drafts  # the stored tree ran: 2 + 2 nodes (a chain: 2)
    k3 = smcsd.decode("import os\n", target=target, draft=draft, method="sd-tree", num_speculative_tokens=3,
                      max_new_tokens=10, temperature=0, seed=1)
    assert k3.stats.method == "sd-tree" and k3.tokens == a.tokens  # greedy: every exact method agrees


def test_a_batch_takes_the_choice_measured_at_its_size(monkeypatch):
    """`by_batch`: a batch takes the choice of the smallest measured size at least as large, ar past the largest;
    one request (and a method the caller names) the batch-1 choice. decode counts the requests itself."""
    real = defaults.load_defaults("tiny-code")
    sd3 = {"method": "sd", "num_particles": 1, "num_speculative_tokens": 3}
    entry = {"default": {"method": "sd", "num_particles": 1, "num_speculative_tokens": 2}, "speedup_vs_ar": 1.1,
             "methods": {"sd": sd3},
             "by_batch": {"2": {"default": sd3, "speedup_vs_ar": 1.3, "candidates": []},
                          "4": {"default": {"method": "ar", "num_particles": 1, "num_speculative_tokens": 1},
                                "speedup_vs_ar": 1.0, "candidates": []}}}
    fake = {**real, "backends": {**real["backends"], defaults.backend(): {"ar-distilled": entry}}}
    monkeypatch.setattr(defaults, "load_defaults", lambda pair: fake if pair == "tiny-code" else None)
    target, draft = smcsd.load("tiny-code")
    d = as_drafter(draft)
    got = {b: defaults.choose(target, d, None, 0.7, batch=b) for b in (1, 2, 3, 4, 9)}
    assert [(got[b].method, got[b].num_speculative_tokens) for b in (1, 2, 3, 4, 9)] == [
        ("sd", 2), ("sd", 3), ("ar", 1), ("ar", 1), ("ar", 1)]
    assert "batch 2" in got[2].source and "past the largest" in got[9].source
    assert defaults.choose(target, d, "sd", 0.7, batch=9).num_speculative_tokens == 3  # named method: its best
    assert smcsd.decode(["import os\n"] * 2, max_new_tokens=4, temperature=0.7).stats.method == "sd"
    assert smcsd.decode(["import os\n"] * 3, max_new_tokens=4, temperature=0.7).stats.method == "ar"


def test_a_method_without_n_and_k_takes_the_pairs_best_for_it():
    target, draft = smcsd.load("tiny-code")
    methods = stored("tiny-code")["backends"][defaults.backend()]["ar-distilled"]["methods"]
    choice = defaults.choose(target, as_drafter(draft), "sd")
    assert (choice.method, choice.num_speculative_tokens) == ("sd", methods["sd"]["num_speculative_tokens"])
    assert "decode_defaults.json" in choice.source


@pytest.mark.slow  # default-run budget (CI's slow lane runs it)
def test_other_models_get_the_generic_defaults():
    target = init_model(tiny_config(6), 0, name="mine")
    draft = init_model(tiny_config(6, hidden=8, heads=1), 1, name="my-draft")
    res = smcsd.decode([1, 2], target=target, draft=draft, max_new_tokens=3, temperature=0.7)
    assert res.stats.method == defaults.GENERIC_METHOD == "sd"
    choice = defaults.choose(target, as_drafter(draft), "smc")
    assert (choice.num_particles, choice.num_speculative_tokens, choice.source) == (*defaults.METHOD_DEFAULTS["smc"],
                                                                                    "generic")
    with pytest.raises(ValueError, match="unknown method"):
        smcsd.decode([1, 2], target=target, draft=draft, method="fast")


def test_decode_names_an_unknown_keyword():
    with pytest.raises(TypeError, match=r"decode\(\) got unexpected keyword argument\(s\) num_particle;"):
        smcsd.decode([1, 2], num_particle=4)


def test_decode_spells_out_prepares_keywords():
    """decode's explicit signature (help(), IDEs) and prepare's stay one list: same names, same defaults."""
    import inspect
    from smcsd.decode import prepare
    dec = {n: p.default for n, p in inspect.signature(smcsd.decode).parameters.items() if p.kind != p.VAR_KEYWORD}
    assert dec == {n: p.default for n, p in inspect.signature(prepare).parameters.items()}


@pytest.mark.slow  # default-run budget (CI's slow lane runs it)
def test_smc_without_a_draft_takes_the_pairs_smc_proposal():
    """`decode(method="smc")` with a pair's target and no draft= runs the pair's proposal trained for SMC
    (tiny-arith ships one): the same tokens as passing it explicitly, not those of the pair's default drafter."""
    target, _ = smcsd.load("tiny-arith")
    assert "smc-proposal" in smcsd.available_drafters("tiny-arith")
    proposal = smcsd.load("tiny-arith", drafter="smc-proposal")[1]
    kw = dict(target=target, method="smc", num_particles=4, num_speculative_tokens=3, max_new_tokens=24,
              temperature=1.0, seed=11)
    prompt = "Q: Sam has 3 bags with 4 pens each. How many pens?\nA:"
    auto = smcsd.decode(prompt, **kw)
    assert auto.tokens == smcsd.decode(prompt, draft=proposal, **kw).tokens
    other = smcsd.decode(prompt, draft=smcsd.load("tiny-arith", drafter="ar-distilled")[1], **kw)
    assert auto.stats.log_z != other.stats.log_z  # a different proposal weighs differently


def test_machine_key_names_the_files_of_this_machines_choice(monkeypatch, tmp_path):
    """The machine key (CPU model and cores, or $SMCSD_MACHINE) names a file with the pair and one in the cache."""
    monkeypatch.delenv("SMCSD_MACHINE", raising=False)
    key = defaults.machine_key()
    assert defaults.cpu_model() in key and f"{os.cpu_count()} cores" in key
    assert defaults.machine_slug("Intel(R) Xeon(R) Processor, 2 cores") == "intel-r-xeon-r-processor-2-cores"
    assert defaults.machine_slug("  ") == "unknown"
    monkeypatch.setenv("SMCSD_MACHINE", "Test CPU, 3 cores")
    monkeypatch.setenv("SMCSD_CACHE", str(tmp_path))
    assert defaults.machine_key() == "Test CPU, 3 cores"
    assert defaults.machine_defaults_path("tiny-code") == os.path.join(
        SHIPPED_DIR, "tiny-code", defaults.MACHINES_DIR, "test-cpu-3-cores.json")
    assert defaults.user_defaults_path("tiny-code") == str(tmp_path / "decode_defaults" / "tiny-code" /
                                                           "test-cpu-3-cores.json")


def test_this_machines_own_choice_comes_first(monkeypatch, tmp_path):
    """A choice stored for this machine (the user's, then the pair's) wins over the pair's backend-wide one, drafter
    by drafter: a drafter it does not hold falls through to the next file; an edited file is re-read."""
    monkeypatch.setenv("SMCSD_MACHINE", "Test CPU, 3 cores")
    monkeypatch.setenv("SMCSD_CACHE", str(tmp_path))
    real = stored("tiny-code")
    target, draft = smcsd.load("tiny-code", drafter="ar-distilled")
    d = as_drafter(draft)
    generic = defaults.choose(target, d, None, 0.7)
    assert generic.source.startswith(defaults.defaults_path("tiny-code"))
    k = 5 if generic.num_speculative_tokens != 5 else 6  # a choice no stored file makes
    sd_k = {"method": "sd", "num_particles": 1, "num_speculative_tokens": k}
    mine = {**real, "backends": {defaults.backend(): {"ar-distilled": {"default": sd_k, "speedup_vs_ar": 1.5,
                                                                      "methods": {"sd": sd_k}}}},
            "default_drafter": {defaults.backend(): "ar-distilled"}}
    mine.pop("greedy", None)
    path = defaults.user_defaults_path("tiny-code")
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        json.dump(mine, f)
    c = defaults.choose(target, d, None, 0.7)
    assert (c.method, c.num_speculative_tokens) == ("sd", k) and c.source.startswith(path)
    assert defaults.choose(target, d, "sd", 0.7).num_speculative_tokens == k
    assert smcsd.decode("import os\n", target=target, draft=draft, max_new_tokens=4, temperature=0.7).stats.method \
        == "sd"
    assert defaults.default_drafter("tiny-code") == "ar-distilled"
    other = as_drafter(smcsd.load("tiny-code", drafter="dflash-dpace")[1])  # not in the user's file
    assert defaults.choose(target, other, None, 0.7).source.startswith(defaults.defaults_path("tiny-code"))
    mine["backends"][defaults.backend()]["ar-distilled"]["default"] = {"method": "ar", "num_particles": 1,
                                                                       "num_speculative_tokens": 1}
    with open(path, "w") as f:
        json.dump(mine, f)
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))  # a later mtime, surely
    assert defaults.choose(target, d, None, 0.7).method == "ar"
    mine["schema"] = "something/else"
    with open(path, "w") as f:
        json.dump(mine, f)
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 2 * 10**9))
    with pytest.raises(ValueError, match="schema"):
        defaults.choose(target, d, None, 0.7)


def test_choose_defaults_writes_where_its_flag_says(monkeypatch, tmp_path):
    """--write: the pair's backend-wide file; --write-machine: this machine's with the pair; --write-user: this
    machine's in the cache; --replace alone is refused before anything is measured."""
    import argparse
    from experiments.studies import choose_defaults
    monkeypatch.setenv("SMCSD_MACHINE", "Test CPU, 3 cores")
    monkeypatch.setenv("SMCSD_CACHE", str(tmp_path))
    flags = lambda **kw: argparse.Namespace(**{"write": False, "write_machine": False, "write_user": False, **kw})
    assert choose_defaults.destination("tiny-code", flags(write=True)) == defaults.defaults_path("tiny-code")
    assert choose_defaults.destination("tiny-code", flags(write_machine=True)) == defaults.machine_defaults_path(
        "tiny-code")
    assert choose_defaults.destination("tiny-code", flags(write_user=True)).startswith(str(tmp_path))
    assert choose_defaults.destination("tiny-code", flags()) is None
    with pytest.raises(SystemExit):
        choose_defaults.main(["--pair", "tiny-code", "--replace"])
    with pytest.raises(SystemExit):
        choose_defaults.main(["--pair", "tiny-code", "--write", "--write-user"])
