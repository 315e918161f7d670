"""A method with its options as one frozen, validated value: `decode(prompt, method=smcsd.methods.SMC(num_particles=8))`.

Each method file defines one (`AR`, `SD`, `SDMulti`, `SDTree`, `SMC`, `Flex`, `SDOverlap`). The value

- holds the options that shape that method only (an option another method has is not a field, so
  `SD(num_particles=4)` is a TypeError at construction, not an option silently ignored at decode time);
- validates them when it is built (a ValueError / TypeError naming the option and the fix);
- leaves an option at None to take the pair's measured default (`smcsd.defaults`), as the keyword form does;
- is hashable and compares by value, so it can key a cache or a sweep (`{SD(num_speculative_tokens=k): ...}`),
  and `repr` prints it back as code.

`decode(method="sd", num_speculative_tokens=3)` and `decode(method=SD(num_speculative_tokens=3))` are the same call
(`options()` gives the keywords the value stands for); giving one option both ways with different values is an
error. The compiled program's key stays `smcsd.runtime.StaticSpec`: it holds these options once resolved (a pair's
default K, a tree's depth) together with what the request fixes (batch, prompt width, cache length).
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import ClassVar

import jax
import numpy as np

from ..runtime.stats import unpack_result


def check_count(owner: str, name: str, value, minimum: int = 1):
    """None, or an int >= minimum (bools refused), else a TypeError / ValueError naming `owner(name=...)`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{owner}({name}=...): {name} must be an int >= {minimum} (or None for the pair's "
                        f"default), got {value!r}")
    if value < minimum:
        raise ValueError(f"{owner}({name}={value}): {name} must be >= {minimum}")
    return int(value)


def check_real(owner: str, name: str, value, low: float, high: float | None, *, low_open: bool = False,
               what: str = ""):
    """None, or a finite real number in [low, high] ((low, high] with low_open), else an error naming it."""
    if value is None:
        return None
    ok = not isinstance(value, bool) and isinstance(value, numbers.Real) and value == value  # not NaN
    if ok:
        ok = (value > low if low_open else value >= low) and (value <= high if high is not None else value < float("inf"))
    if not ok:
        span = f"{'(' if low_open else '['}{low}, {high if high is not None else 'inf'}{']' if high is not None else ')'}"
        raise ValueError(f"{owner}({name}={value!r}): {name} must be a number in {span}{what}")
    return float(value)


@dataclasses.dataclass(frozen=True)
class Method:
    """A decoding method and its options (subclasses: one per method, each in its method's file)."""

    name: ClassVar[str] = ""

    def __repr__(self) -> str:  # the options set, as code: SMC(num_particles=8)
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.options().items())})"

    def options(self) -> dict:
        """The `decode` keywords this value stands for: the options set (not None)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}

    @property
    def definition(self):
        """The registered `smcsd.runtime.MethodDef` (how decode builds and shapes this method's program)."""
        from ..runtime.engine import METHODS
        return METHODS[self.name]

    @property
    def exact(self) -> bool:
        """Whether the output law is the target's exactly (all but `smc`)."""
        return self.definition.exact

    def headroom(self, num_speculative_tokens: int | None = None, num_particles: int = 1) -> int:
        """Extra cache and output slots a cycle writes past a row's position (K from this value when it sets one)."""
        K = getattr(self, "num_speculative_tokens", None) or num_speculative_tokens
        tree = getattr(self, "tree", None)
        if tree is not None:
            from .sd_tree import parse_tree
            tree = parse_tree(tree)
            K = tree.depth
        if self.definition.needs_draft and K is None:
            raise ValueError(f"{self!r} leaves num_speculative_tokens to the pair's default; pass it to headroom()")
        N = getattr(self, "num_particles", None) or num_particles
        return self.definition.headroom(K or 0, N, tree)


    # -------------------------------------------------------------- one cycle at a time

    def _parts(self, prepared):
        d = prepared.method
        if d.name != self.name:
            raise ValueError(f"{self!r} cannot step a call prepared for method {d.name!r}; prepare it with "
                             f"method={self!r}")
        if d.parts is None:
            raise ValueError(f"method {self.name!r} is not one loop of cycles (it runs as {d.runner.__name__ if d.runner else 'a program'}), "
                             "so it has no step; decode it whole, or step through 'sd' (the same cycle)")
        key = (d.name, prepared.target.config, prepared.draft, prepared.spec)
        if key not in _STEPPERS:
            if len(_STEPPERS) >= 8:  # compiled programs hold memory maps: keep the few in use
                _STEPPERS.pop(next(iter(_STEPPERS)))
            parts = d.parts(prepared.target.config, prepared.draft, prepared.spec)
            _STEPPERS[key] = (jax.jit(parts.init), jax.jit(parts.cycle), jax.jit(parts.finish))
        return _STEPPERS[key]

    def init(self, prepared):
        """The loop state after the prefill and the first token, for a call laid out by `smcsd.prepare(...,
        method=self)`: the same `init` the compiled program runs (so `step` until `done(state)` and `finish`
        give `decode`'s tokens for the same seed)."""
        return self._parts(prepared)[0](*prepared.args)

    def step(self, prepared, state):
        """One cycle (one target call and what it commits) on `state`; rows already done stay as they are."""
        tp, dp, inp = prepared.args
        return self._parts(prepared)[1](tp, dp, inp, state)

    @staticmethod
    def done(state) -> bool:
        """Whether every row of `state` is done (the compiled loop's exit test)."""
        return bool(np.all(np.asarray(state.done)))

    def finish(self, prepared, state):
        """The `smcsd.DecodeResult` of a finished (or partly finished) state, as `decode` returns it."""
        raw = jax.device_get(self._parts(prepared)[2](prepared.args[2], state))
        return unpack_result(raw, prepared.spec, prepared.target)


@dataclasses.dataclass(frozen=True, repr=False)
class ChainMethod(Method):
    """A method whose one option is K, the draft tokens per cycle (`SD`, `Flex`, `SDOverlap`)."""

    num_speculative_tokens: int | None = None  # K, draft tokens per cycle (None: the pair's default)

    def __post_init__(self):
        check_count(type(self).__name__, "num_speculative_tokens", self.num_speculative_tokens)


_STEPPERS: dict = {}  # (method, target config, drafter, spec) -> jitted (init, cycle, finish)


def merge_options(method: Method, given: dict, defaults: dict) -> dict:
    """decode's keywords with `method`'s options filled in. `given` holds the keywords as called and `defaults`
    their signature defaults: an option the caller also passed as a keyword, with another value, is an error."""
    merged = dict(given)
    for name, value in method.options().items():
        passed = given.get(name, defaults.get(name))
        if passed is not None and passed != defaults.get(name) and passed != value:
            raise ValueError(f"{name} given twice: method={method!r} sets {name}={value!r} and the keyword "
                             f"{name}={passed!r}; pass it once")
        merged[name] = value
    return merged


__all__ = ["ChainMethod", "Method", "check_count", "check_real", "merge_options"]
