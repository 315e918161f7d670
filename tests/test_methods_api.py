"""Methods as frozen, validated values (smcsd/methods/base.py): `decode(method=SMC(num_particles=4))` is the keyword
call, construction checks each option, and every registered method has one."""

import dataclasses
import importlib

import pytest

import smcsd
from smcsd.methods import AR, SD, SMC, Flex, Method, SDMulti, SDOverlap, SDTree
from smcsd.runtime import METHODS

from toys import tiny_pair

PROMPTS = [[1, 2, 3], [4, 0]]


def _tokens(**kw):
    target, draft = tiny_pair()
    return smcsd.decode(PROMPTS, target=target, draft=draft, max_new_tokens=7, seed=3, eos_id=[], **kw).tokens


def test_every_registered_method_has_its_value_class():
    classes = {cls.name: cls for cls in (AR, SD, SDMulti, SDTree, SMC, Flex, SDOverlap)}
    assert set(classes) == set(METHODS)
    for name, cls in classes.items():
        value = cls()
        assert value.definition is METHODS[name]
        assert dataclasses.is_dataclass(value) and isinstance(value, Method)
        with pytest.raises(dataclasses.FrozenInstanceError):
            value.foo = 1


@pytest.mark.parametrize("value, keywords", [
    (AR(), {"method": "ar"}),
    (SD(num_speculative_tokens=3), {"method": "sd", "num_speculative_tokens": 3}),
    pytest.param(SDMulti(num_speculative_tokens=2, num_particles=3),  # default-run budget: SD and SMC stay
                 {"method": "sd-multi", "num_speculative_tokens": 2, "num_particles": 3}, marks=pytest.mark.slow),
    pytest.param(SDTree(tree="2,1"), {"method": "sd-tree", "tree": "2,1"}, marks=pytest.mark.slow),
    (SMC(num_particles=4, num_speculative_tokens=2, ess_threshold=0.7, resampler="multinomial", alpha=1.5,
         select="argmax"),
     {"method": "smc", "num_particles": 4, "num_speculative_tokens": 2, "ess_threshold": 0.7,
      "resampler": "multinomial", "alpha": 1.5, "select": "argmax"}),
])
def test_a_value_decodes_as_its_keywords(value, keywords):
    # same seed, same program: the tokens must be identical (a dropped option would change them: checked below)
    assert _tokens(method=value) == _tokens(**keywords)


def test_the_options_reach_the_program():
    # the check above could pass if decode ignored the value's options and both calls used the defaults
    assert _tokens(method=SMC(num_particles=4, num_speculative_tokens=2)) != _tokens(method="smc", num_particles=1,
                                                                                   num_speculative_tokens=5)
    target, draft = tiny_pair()
    p = importlib.import_module("smcsd.decode").prepare(PROMPTS, target=target, draft=draft, max_new_tokens=7,
                                              method=SMC(num_particles=3, num_speculative_tokens=2, resampler="stratified"))
    assert (p.spec.method, p.spec.num_particles, p.spec.num_speculative_tokens, p.spec.resampler) == \
        ("smc", 3, 2, "stratified")


def test_an_option_given_twice_must_agree():
    with pytest.raises(ValueError, match="num_speculative_tokens given twice"):
        _tokens(method=SD(num_speculative_tokens=3), num_speculative_tokens=2)
    assert _tokens(method=SD(num_speculative_tokens=3), num_speculative_tokens=3) == _tokens(method="sd",
                                                                                           num_speculative_tokens=3)
    # an option the value leaves to the default takes the keyword
    assert _tokens(method=SD(), num_speculative_tokens=2) == _tokens(method="sd", num_speculative_tokens=2)


@pytest.mark.parametrize("build, error, match", [
    (lambda: SD(num_speculative_tokens=0), ValueError, r"SD\(num_speculative_tokens=0\)"),
    (lambda: SD(num_speculative_tokens=2.0), TypeError, "must be an int"),
    (lambda: SD(num_speculative_tokens=True), TypeError, "must be an int"),
    (lambda: SD(num_particles=4), TypeError, "num_particles"),  # not an option of sd
    (lambda: SDMulti(num_particles=0), ValueError, "num_particles"),
    (lambda: SMC(num_particles=-1), ValueError, "num_particles"),
    (lambda: SMC(ess_threshold=1.5), ValueError, "ess_threshold"),
    (lambda: SMC(ess_threshold=float("nan")), ValueError, "ess_threshold"),
    (lambda: SMC(alpha=0), ValueError, "alpha"),
    (lambda: SMC(alpha=float("inf")), ValueError, "alpha"),
    (lambda: SMC(resampler="nope"), ValueError, "resampler"),
    (lambda: SMC(select="max"), ValueError, "select"),
    (lambda: SMC(return_particles=1), TypeError, "return_particles"),
    (lambda: SDTree(tree=3), TypeError, "tree"),
    (lambda: SDTree(tree="2,x"), ValueError, "tree"),
    (lambda: SDTree(tree="2,1", num_speculative_tokens=3), ValueError, "depth is 2"),
    (lambda: Flex(num_speculative_tokens=0), ValueError, "Flex"),
    (lambda: SDOverlap(num_speculative_tokens="4"), TypeError, "SDOverlap"),
])
def test_bad_options_fail_when_the_value_is_built(build, error, match):
    with pytest.raises(error, match=match):
        build()


def test_a_method_that_is_neither_a_name_nor_a_value():
    with pytest.raises(TypeError, match="method must be a method's name"):
        _tokens(method=3)
    with pytest.raises(ValueError, match="unknown method"):
        _tokens(method="sdd")


def test_values_are_hashable_keys_and_print_as_code():
    sweep = {SD(num_speculative_tokens=k): k for k in (2, 3, 2)}
    assert len(sweep) == 2 and SD(num_speculative_tokens=2) == SD(num_speculative_tokens=2)
    assert SD(num_speculative_tokens=2) != SD(num_speculative_tokens=3) and SD() != Flex()
    value = SMC(num_particles=8, resampler="systematic")
    assert repr(value) == "SMC(num_particles=8, resampler='systematic')"
    assert eval(repr(value), {"SMC": SMC}) == value
    assert value.options() == {"num_particles": 8, "resampler": "systematic"}


def test_headroom_and_k_come_from_the_value():
    assert SD(num_speculative_tokens=4).headroom() == METHODS["sd"].headroom(4, 1) == 5
    assert SMC(num_speculative_tokens=3).headroom() == METHODS["smc"].headroom(3, 1)
    assert AR().headroom() == 0
    tree = SDTree(tree="2,1")  # K is the tree's depth; its cycle writes every node
    assert tree.headroom() == METHODS["sd-tree"].headroom(2, 1, smcsd.TreeSpec.parse("2,1"))
    with pytest.raises(ValueError, match="pass it to headroom"):
        SD().headroom()
    assert SD().headroom(num_speculative_tokens=2) == 3
    assert SD().exact and not SMC().exact


def _stepped(value, target, draft, **kw):
    p = smcsd.prepare(PROMPTS, target=target, draft=draft, method=value, max_new_tokens=7, seed=3, eos_id=[], **kw)
    state, cycles = value.init(p), 0
    while not value.done(state):
        state = value.step(p, state)
        cycles += 1
    return value.finish(p, state), cycles


@pytest.mark.parametrize("value", [AR(), SD(num_speculative_tokens=3),
                                   pytest.param(SDMulti(num_speculative_tokens=2, num_particles=2), marks=pytest.mark.slow),
                                   pytest.param(SDTree(tree="2,1"), marks=pytest.mark.slow),  # default-run budget
                                   SMC(num_particles=3, num_speculative_tokens=2)],
                         ids=lambda v: v.name)
def test_stepping_a_method_cycle_by_cycle_is_its_decode(value):
    # init / step / finish are the functions the compiled while-loop runs: same tokens and statistics for one seed
    target, draft = tiny_pair()
    result, cycles = _stepped(value, target, draft)
    ref = smcsd.decode(PROMPTS, target=target, draft=draft, method=value, max_new_tokens=7, seed=3, eos_id=[])
    assert result.tokens == ref.tokens
    assert cycles == result.stats.num_target_calls == ref.stats.num_target_calls
    assert result.stats.num_accepted_tokens == ref.stats.num_accepted_tokens


@pytest.mark.slow  # default-run budget (a fresh-clone default lane took 11 min 0 s); CI's slow lane runs it
def test_stepping_flex():
    from test_flex import flex_drafter
    target, _ = tiny_pair()
    draft = flex_drafter(target)
    value = Flex(num_speculative_tokens=2)
    result, _ = _stepped(value, target, draft, temperature=0)
    ref = smcsd.decode(PROMPTS, target=target, draft=draft, method=value, max_new_tokens=7, seed=3, eos_id=[],
                       temperature=0)
    assert result.tokens == ref.tokens


def test_a_step_needs_its_own_loop_method():
    target, draft = tiny_pair()
    p = smcsd.prepare(PROMPTS, target=target, draft=draft, method=SD(num_speculative_tokens=2), max_new_tokens=4)
    with pytest.raises(ValueError, match="prepared for method 'sd'"):
        SMC().init(p)
    p = smcsd.prepare(PROMPTS, target=target, draft=draft, method=SDOverlap(num_speculative_tokens=2), max_new_tokens=4)
    with pytest.raises(ValueError, match="no step"):
        SDOverlap().init(p)
