"""`smcsd.decode`: the one entry point. Normalises and checks the request on the host, sizes the
cache to the work, fetches (or compiles) the method's program, runs it, and unpacks the result."""

from __future__ import annotations

import inspect
import numbers
import time
import warnings
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from smcsd.models import LanguageModel

from . import defaults as _defaults
from . import sampling as _sampling
from .drafters import Drafter, as_drafter
from .methods.base import Method, merge_options
from .methods.sd import check_cut
from .runtime.engine import METHODS, MethodDef, MethodOptions, ProgramInputs, StaticSpec, bucket, compiled_program
from .runtime.stats import DecodeResult, unpack_result

_SELECT = ("sample", "argmax")

# Defaults of method, num_particles and num_speculative_tokens: smcsd/defaults.py (measured per pair, backend and
# drafter by experiments/studies/choose_defaults.py; docs/methods.md, "Defaults").


def _check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _normalize_prompts(prompt, tokenizer, vocab_size: int) -> tuple[list[list[int]], bool]:
    """Requests as lists of ids; returns (requests, whether the input was text)."""
    if isinstance(prompt, np.ndarray):
        if not np.issubdtype(prompt.dtype, np.integer):
            raise TypeError(f"prompt token ids must be integers, got an array of dtype {prompt.dtype}")
        prompt = prompt.tolist()
    if isinstance(prompt, str):
        prompt = [prompt]
    if not isinstance(prompt, (list, tuple)):
        raise TypeError("prompt must be a string, a list of strings, a list of token ids or a list of lists "
                        f"of token ids; got {type(prompt).__name__}")
    if len(prompt) == 0:
        raise ValueError("prompt is empty: pass at least one request (a non-empty string or token list)")
    if all(isinstance(p, str) for p in prompt):
        if tokenizer is None:
            raise ValueError("text prompts need a tokenizer, but the target model has none; pass token ids "
                             "or attach a tokenizer (LanguageModel(..., tokenizer=...))")
        for i, p in enumerate(prompt):
            if not p:
                raise ValueError(f"prompt {i} is an empty string: give some text, or pass [bos_id] as token ids "
                                 "to sample unconditionally")
        requests = [tokenizer.encode(p) for p in prompt]
        is_text = True
    elif all(_is_int(t) for t in prompt):
        requests, is_text = [list(prompt)], False
    elif all(isinstance(p, (list, tuple, np.ndarray)) for p in prompt):
        requests, is_text = [list(np.asarray(p).tolist()) if isinstance(p, np.ndarray) else list(p) for p in prompt], False
    else:
        raise TypeError("prompt must be a string, a list of strings, a list of token ids or a list of lists "
                        "of token ids (don't mix them)")
    for i, ids in enumerate(requests):
        if len(ids) == 0:
            raise ValueError(f"prompt {i} is empty: each request needs at least one token "
                             "(text prompts get a BOS token from the tokenizer)")
        for t in ids:
            if not _is_int(t):
                raise TypeError(f"prompt {i} has a non-integer token id {t!r}: token ids must be ints")
            if not 0 <= int(t) < vocab_size:
                raise ValueError(f"prompt {i} has token id {int(t)} outside the vocabulary [0, {vocab_size})")
    return [[int(t) for t in ids] for ids in requests], is_text


def _is_int(x) -> bool:
    return isinstance(x, (numbers.Integral, np.integer)) and not isinstance(x, bool)


def _stop_ids(eos_id, tokenizer, config, vocab_size: int) -> list[int]:
    if eos_id is None:
        eos = getattr(tokenizer, "eos_id", None) if tokenizer is not None else None
        eos = config.eos_token_id if eos is None else eos
        ids = [] if eos is None else [eos]
    elif _is_int(eos_id):
        ids = [int(eos_id)]
    elif isinstance(eos_id, (list, tuple)) and all(_is_int(e) for e in eos_id):
        ids = [int(e) for e in eos_id]
    else:
        raise TypeError(f"eos_id must be None, an int or a list of ints, got {eos_id!r}")
    for e in ids:
        if not 0 <= e < vocab_size:
            raise ValueError(f"eos_id {e} is outside the vocabulary [0, {vocab_size})")
    return ids


def _resolve_models(target, draft):
    if target is None:  # default: the shipped tiny-code pair (its best drafter too, unless one was given)
        from .pairs import load as load_pair
        try:
            target, shipped_draft = load_pair("tiny-code")
        except ValueError as e:
            raise ValueError(f"decode needs a target model and the default shipped pair could not be loaded ({e}); "
                             "pass target=models.init_model(...) or a loaded model") from e
        draft = shipped_draft if draft is None else draft
    if not isinstance(target, LanguageModel):
        raise TypeError(f"target must be a models.LanguageModel, got {type(target).__name__}")
    if draft is not None and not isinstance(draft, (LanguageModel, Drafter)):
        raise TypeError(f"draft must be a models.LanguageModel, a smcsd.drafters.Drafter (e.g. "
                        f"smcsd.drafters.PromptLookup()) or None, got {type(draft).__name__}")
    return target, as_drafter(draft)


_WARNED_SLOW_DTYPE = False


def _warn_half_precision_on_cpu(*models) -> None:
    """Once per process: half-precision params on XLA:CPU are slow (float32 is the fast path there)."""
    global _WARNED_SLOW_DTYPE
    if _WARNED_SLOW_DTYPE or jax.default_backend() != "cpu":
        return
    slow = [m for m in models if m is not None and m.config.dtype in ("bfloat16", "float16")]
    if slow:
        _WARNED_SLOW_DTYPE = True
        warnings.warn(f"{slow[0].name} has {slow[0].config.dtype} params on CPU, where XLA's half-precision "
                      "matmuls ran 5-10x slower than float32 (measured on a 135M model); compute in float32: "
                      "model.astype('float32'), or load with dtype='float32'", stacklevel=3)


def _check_prompt_or_messages(prompt, messages) -> None:
    """Exactly one of prompt / messages: they are two spellings of the same requests."""
    if prompt is None and messages is None:
        raise ValueError("decode needs a prompt (text or token ids) or messages=[{\"role\": \"user\", "
                         "\"content\": ...}] (a chat, rendered with the target's chat template); pass one")
    if prompt is not None and messages is not None:
        raise ValueError("pass either prompt or messages, not both: messages are rendered into the prompt "
                         "with the target tokenizer's chat template")


def _conversations(messages) -> list:
    """messages as a list of conversations: one conversation (a list of message dicts) or a list of them."""
    if isinstance(messages, (list, tuple)) and messages and all(isinstance(c, (list, tuple)) for c in messages):
        return list(messages)
    return [messages]  # one conversation; models.chat checks its form


def _render_messages(messages, tokenizer) -> list[list[int]]:
    """Token ids of each conversation under the tokenizer's chat template (no BOS added: templates write it)."""
    if tokenizer is None:
        raise ValueError("messages need the target's tokenizer and chat template, but the target model has no "
                         "tokenizer; attach one (LanguageModel(..., tokenizer=...)) or pass prompt= token ids")
    if getattr(tokenizer, "chat_template", None) is None or not hasattr(tokenizer, "apply_chat_template"):
        raise ValueError(f"messages need a chat template, but the target's tokenizer {tokenizer!r} has no chat "
                         "template; use a chat (instruct) model, set target.tokenizer.chat_template to a Jinja "
                         "template, or pass prompt= with the text already formatted")
    conversations = _conversations(messages)
    requests = []
    for i, conversation in enumerate(conversations):
        try:
            requests.append(tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True))
        except (TypeError, ValueError) as e:
            if len(conversations) == 1:
                raise
            raise type(e)(f"conversation {i}: {e}") from None
    return requests


class Prepared(NamedTuple):
    """A decode call checked and laid out, ready to compile and run (`prepare`)."""

    method: MethodDef
    target: LanguageModel
    draft: Drafter | None
    spec: StaticSpec
    args: tuple  # (target params, drafter params, ProgramInputs), placed on the mesh if one is given
    mesh: object


def decode(
    prompt=None,
    *,
    messages=None,
    target: LanguageModel | None = None,
    draft: LanguageModel | Drafter | None = None,
    method: str | Method | None = None,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    eos_id: int | Sequence[int] | None = None,
    num_speculative_tokens: int | None = None,
    num_particles: int | None = None,
    draft_temperature: float | None = None,
    ess_threshold: float = 0.5,
    resampler: str = "systematic",
    alpha: float = 1.0,
    select: str = "sample",
    return_particles: bool = False,
    tree=None,
    confidence_cut: float = 0.0,
    mesh=None,
    **unexpected,
) -> DecodeResult:
    """Decode `max_new_tokens` (or until a stop token) for each request with `method`.

    prompt: a string, a list of strings, a list of token ids (one request) or a list of lists.
    messages: instead of prompt, a chat: one conversation (a list of {"role": ..., "content": ...} dicts) or a
    list of them, each rendered with the target tokenizer's chat template (with the assistant header) and
    decoded as its token ids; stop ids then default to the tokenizer's `end_of_turn_ids`.
    method: "ar" (exact reference) or a registered speculative method (see `smcsd.available_methods()`), by name or as
    a value holding its options (`smcsd.SMC(num_particles=8)`, `smcsd.SDTree(tree="2,1:top")`: smcsd/methods). Left
    out (None), with N and K: the pair's measured defaults for this backend and drafter (`smcsd.defaults`:
    the fastest setting within quality tolerance of `ar`, possibly `ar` itself), or `sd` K=4 for other models.
    temperature / top_k / top_p define the target distribution p_T every method samples from
    (temperature 0 = greedy); draft_temperature (default: temperature) shapes the draft's proposals
    (sd/sd-multi also truncate them with top_k/top_p; smc does not, so they cover p_T's support).
    eos_id: stop token id(s); default the tokenizer's EOS, or with messages its end-of-turn tokens (the stop
    token is included in the output; `texts` drop special tokens).
    tree: `sd-tree`'s draft tree, a `smcsd.TreeSpec` or its string form ("2,2,1,1", "2,2,1,1:distinct",
    "1,1,1,1+2" for a D²SD drafter's chain plus 2 re-anchored branches); default: chosen per drafter and backend
    (`smcsd.defaults.default_tree`) with depth num_speculative_tokens.
    mesh: a `jax.sharding.Mesh` with axes ("data", "model") (`smcsd.make_mesh`): requests x particles
    sharded over "data" (it must divide the number of requests), weights over "model"; see smcsd/runtime/mesh.py.
    max_new_tokens, seed: tokens to generate per request (at most), and the PRNG seed. num_speculative_tokens (K),
    num_particles (N): the draft length per cycle and sd-multi's drafts / smc's particles (default: as `method`).
    ess_threshold, resampler, alpha, select, return_particles: smc's resampling threshold (ESS < τ·N), scheme
    (`smcsd.resample`), target exponent p_T^α, output particle (`sample` ∝ weight or `argmax`), and whether to
    return every particle and its log-weight (docs/methods.md).
    confidence_cut: `sd` verifies only the drafts whose cumulative top-1 confidence under the drafter stays >= it
    (0..K of them; the target's call shrinks with them, exactness unchanged; 0: all K; docs/methods.md).
    A misspelled keyword raises a TypeError that lists the valid ones. `prepare` takes the same keywords and
    returns the laid-out call without running it. Returns a `DecodeResult` with the new tokens per request (in
    request order), texts, and stats.
    """
    if unexpected:  # there only to list the valid keywords when one is misspelled (num_particle=)
        raise TypeError(f"decode() got unexpected keyword argument(s) {', '.join(sorted(unexpected))}; valid ones: "
                        f"{', '.join(_KEYWORDS)}")
    p = prepare(prompt, messages=messages, target=target, draft=draft, method=method, max_new_tokens=max_new_tokens,
                temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, eos_id=eos_id,
                num_speculative_tokens=num_speculative_tokens, num_particles=num_particles,
                draft_temperature=draft_temperature, ess_threshold=ess_threshold, resampler=resampler, alpha=alpha,
                select=select, return_particles=return_particles, tree=tree, confidence_cut=confidence_cut,
                mesh=mesh)
    program, compile_s = compiled_program(p.method, p.target.config, p.draft, p.spec, p.args, mesh=p.mesh)
    start = time.perf_counter()
    raw = program(*p.args)
    raw = jax.device_get(raw)
    wall = time.perf_counter() - start
    return unpack_result(raw, p.spec, p.target, compile_s, wall)


def prepare(
    prompt=None,
    *,
    messages=None,
    target: LanguageModel | None = None,
    draft: LanguageModel | Drafter | None = None,
    method: str | Method | None = None,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    eos_id: int | Sequence[int] | None = None,
    num_speculative_tokens: int | None = None,
    num_particles: int | None = None,
    draft_temperature: float | None = None,
    ess_threshold: float = 0.5,
    resampler: str = "systematic",
    alpha: float = 1.0,
    select: str = "sample",
    return_particles: bool = False,
    tree=None,
    confidence_cut: float = 0.0,
    mesh=None,
) -> Prepared:
    """Check a `decode` call's arguments and lay it out (static spec, traced inputs, params), without compiling or
    running it: what `decode` runs, and what profilers (experiments/bench/profile_smc.py) take apart. See `decode`."""
    _check_prompt_or_messages(prompt, messages)
    if isinstance(method, Method):  # a method with its options (smcsd.methods): the same as the keyword form
        opts = merge_options(method, {"num_speculative_tokens": num_speculative_tokens, "num_particles": num_particles,
                                      "tree": tree, "ess_threshold": ess_threshold, "resampler": resampler,
                                      "alpha": alpha, "select": select, "return_particles": return_particles,
                                      "confidence_cut": confidence_cut},
                             _OPTION_DEFAULTS)
        num_speculative_tokens, num_particles, tree = opts["num_speculative_tokens"], opts["num_particles"], opts["tree"]
        ess_threshold, resampler, alpha = opts["ess_threshold"], opts["resampler"], opts["alpha"]
        select, return_particles, confidence_cut = opts["select"], opts["return_particles"], opts["confidence_cut"]
        method = method.name
    if method is not None and not isinstance(method, str):
        raise TypeError(f"method must be a method's name (one of: {', '.join(sorted(METHODS))}) or a "
                        f"smcsd.methods value such as smcsd.SD(num_speculative_tokens=4), got {type(method).__name__}")
    if method is not None and method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of: {', '.join(sorted(METHODS))}")
    if method is not None and draft is None and METHODS[method].pair_draft is not None:
        # the drafter the method takes from the target's pair (flex: its FlexDraft adapters; smc: its proposal)
        target, draft = METHODS[method].pair_draft(target) or (target, draft)
    target, draft = _resolve_models(target, draft)
    _warn_half_precision_on_cpu(target, draft.language_model if draft is not None else None)
    if messages is not None:  # a chat: rendered with the target's template, stopped at its end of turn
        prompt = _render_messages(messages, target.tokenizer)
        if eos_id is None:
            eos_id = list(getattr(target.tokenizer, "end_of_turn_ids", None) or []) or None
    requests, _ = _normalize_prompts(prompt, target.tokenizer, target.config.vocab_size)
    # the pair's measured defaults (smcsd/defaults.py) for this temperature and batch size
    choice = _defaults.choose(target, draft, method, temperature, batch=len(requests))
    method = choice.method
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of: {', '.join(sorted(METHODS))}")
    mdef = METHODS[method]
    if mdef.needs_draft:
        if draft is None:
            raise ValueError(f"method {method!r} needs a draft model or drafter: pass draft=... (a small LanguageModel sharing "
                             "the target's vocabulary, or a smcsd.drafters.Drafter such as PromptLookup())")
        only = getattr(draft, "only_method", None)
        if mdef.drafter_kind is not None and getattr(draft, "kind", None) != mdef.drafter_kind:
            raise ValueError(f"{mdef.drafter_hint}; got method={method!r} with {draft.describe()}")
        if only is not None and only != method:
            hint = METHODS[only].drafter_hint if only in METHODS else f"this drafter drafts for method {only!r} only"
            raise ValueError(f"{hint}; got method={method!r} with {draft.describe()}")
        draft = draft.bind(target)  # checks the vocabulary (and fills in what the drafter takes from the target)
        if not mdef.exact and not draft.full_support:
            raise ValueError(f"method {method!r} weights particles by p_T/q, so the drafter must give every token "
                             f"positive probability, but {draft.describe()} does not; use an exact method "
                             "('sd', 'sd-multi') or a drafter with full support (e.g. PromptLookup(floor=0.01))")
    else:
        draft = None
    max_new_tokens = _check_int("max_new_tokens", max_new_tokens, 1)
    _sampling.validate(temperature, top_k, top_p)
    if draft_temperature is None:
        draft_temperature = temperature
    _sampling.validate(draft_temperature, top_k, top_p, prefix="draft_")
    seed = _check_int("seed", seed, 0)
    default_n, default_k = choice.num_particles, choice.num_speculative_tokens
    K = _check_int("num_speculative_tokens", default_k if num_speculative_tokens is None else num_speculative_tokens, 1)
    N = _check_int("num_particles", default_n if num_particles is None else num_particles, 1)
    if isinstance(ess_threshold, bool) or not isinstance(ess_threshold, numbers.Real) or not 0 <= ess_threshold <= 1:
        raise ValueError(f"ess_threshold must be a number in [0, 1] (0 never resamples, 1 always), got {ess_threshold!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not alpha > 0 or alpha == float("inf"):
        raise ValueError(f"alpha must be a finite number > 0 (1 targets p_T itself), got {alpha!r}")
    if select not in _SELECT:
        raise ValueError(f"select must be one of {_SELECT}, got {select!r}")
    if tree is not None and not mdef.takes_tree:
        takes = [name for name, m in sorted(METHODS.items()) if m.takes_tree]
        raise ValueError(f"tree= shapes method={' or '.join(repr(t) for t in takes)} only, but method is {method!r}; "
                         f"drop tree= or use {' or '.join(takes)}")
    confidence_cut = check_cut("decode", confidence_cut)  # one check for the keyword and SD(confidence_cut=)
    if confidence_cut and not mdef.takes_cut:
        takes = [name for name, m in sorted(METHODS.items()) if m.takes_cut]
        raise ValueError(f"confidence_cut= shapes method={' or '.join(repr(t) for t in takes)} only, but method is "
                         f"{method!r}; drop confidence_cut= or use {' or '.join(takes)}")
    if tree is None and choice.tree is not None and mdef.takes_tree and num_speculative_tokens is None:
        tree = choice.tree  # the pair's measured tree (its depth is K)
    options = MethodOptions(num_speculative_tokens=K, num_speculative_tokens_given=num_speculative_tokens is not None,
                            num_particles=N, tree=tree, resampler=resampler, temperature=temperature,
                            draft_temperature=draft_temperature, mesh=mesh)
    if mdef.configure is not None:  # the method's own checks, and its final K (sd-tree: its tree's depth)
        options = mdef.configure(options, draft)
    K, tree, draft_temperature = options.num_speculative_tokens, options.tree, options.draft_temperature

    if draft is not None and mdef.needs_draft:
        limit = draft.max_tokens_per_proposal
        if limit is not None and K > limit:
            raise ValueError(f"num_speculative_tokens={K} is more than {draft.describe()} drafts per proposal "
                             f"(at most {limit}); pass num_speculative_tokens <= {limit}")
        if not mdef.passes_feedback and draft.learns_online:
            raise ValueError(f"{draft.describe()} learns online from sd's feedback, which {method} does not pass "
                             "between its device groups; use method='sd', or a drafter without online adaptation")
        if mesh is not None and not draft.supports_mesh and mdef.place is None:
            raise ValueError(f"{draft.describe()} cannot run on a mesh yet; call decode without mesh= (one device)")

    stops = _stop_ids(eos_id, target.tokenizer, target.config, target.config.vocab_size)

    uses_draft = mdef.needs_draft
    K_eff = K if uses_draft else 0
    N_eff = N if mdef.uses_particles else 1
    headroom = mdef.headroom(K_eff, N_eff, tree)
    longest = max(len(r) for r in requests)
    max_pos = target.config.max_position_embeddings
    if draft is not None and draft.max_len is not None:
        max_pos = min(max_pos, draft.max_len)
    if longest > max_pos:
        raise ValueError(f"prompt of {longest} tokens is longer than the model's max length "
                         f"(max_position_embeddings={max_pos}); shorten the prompt")
    if longest + max_new_tokens + headroom > max_pos:
        raise ValueError(
            f"prompt ({longest} tokens) + max_new_tokens ({max_new_tokens})"
            + (f" + draft headroom ({headroom})" if headroom else "")
            + f" exceeds the model's max length {max_pos}; lower max_new_tokens"
            + (" or num_speculative_tokens" if headroom else ""))

    B = len(requests)
    prompt_width = bucket(longest, 8)
    cache_len = min(bucket(longest + max_new_tokens + headroom), max_pos)
    cache_len = max(cache_len, prompt_width)
    out_len = bucket(max_new_tokens + headroom, 8)
    spec = StaticSpec(method=method, batch=B, prompt_len=prompt_width, cache_len=cache_len, out_len=out_len,
                      num_stop=max(1, len(stops)), num_speculative_tokens=K_eff, num_particles=N_eff,
                      resampler=resampler if mdef.resamples else "", select=select if mdef.resamples else "",
                      return_particles=bool(return_particles) and mdef.resamples,
                      tree=tree if mdef.takes_tree else None,
                      confidence_cut=float(confidence_cut) if mdef.takes_cut else 0.0)

    pad = target.tokenizer.pad_id if getattr(target.tokenizer, "pad_id", None) is not None else 0
    prompt_arr = np.full((B, prompt_width), pad, np.int32)
    for b, ids in enumerate(requests):
        prompt_arr[b, :len(ids)] = ids
    stop_arr = np.full((spec.num_stop,), -1, np.int32)
    stop_arr[:len(stops)] = stops
    # Importance-weighted methods (smc) are consistent only if the proposal q covers p_T's support, so
    # their draft proposes from its full tempered distribution: top-k/top-p shape p_T, not q. The exact
    # methods (sd, sd-multi) stay exact with any q, and a truncated q matching p_T accepts more.
    draft_truncation = (top_k, top_p) if mdef.exact else (0, 1.0)
    inputs = ProgramInputs(
        prompt=jnp.asarray(prompt_arr), prompt_len=jnp.asarray([len(r) for r in requests], jnp.int32),
        key=jax.random.PRNGKey(seed),
        sampling=_sampling.SamplingParams.make(temperature, top_k, top_p),
        draft_sampling=_sampling.SamplingParams.make(draft_temperature, *draft_truncation),
        max_new_tokens=jnp.asarray(max_new_tokens, jnp.int32), stop_ids=jnp.asarray(stop_arr),
        ess_threshold=jnp.asarray(ess_threshold, jnp.float32), alpha=jnp.asarray(alpha, jnp.float32))
    if mdef.place is not None:  # a method that places its own arguments (sd-overlap: two device groups)
        mesh, args = mdef.place(mesh, B, target, draft, inputs)
    elif mesh is None:  # per-layer weight buffers on CPU (LanguageModel.decode_params)
        args = (target.decode_params(), draft.drafter_params() if draft is not None else None, inputs)
    else:  # validate against the batch, put params/inputs on the mesh (smcsd/runtime/mesh.py)
        draft_params = draft.sharded_params() if draft is not None else None
        from .runtime.mesh import place_args
        mesh, args = place_args(mesh, spec, target.config, getattr(draft, "config", None),
                                (target.params, draft_params, inputs))
    return Prepared(mdef, target, draft, spec, args, mesh)


_KEYWORDS = tuple(inspect.signature(prepare).parameters)[1:]  # decode's keywords (all but prompt)
_OPTION_DEFAULTS = {k: p.default for k, p in inspect.signature(prepare).parameters.items()}


def available_methods() -> list[str]:
    return sorted(METHODS)
