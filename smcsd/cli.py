"""The `smcsd` command line: `generate` text, `chat` with an instruct model, `fetch` a model, `bench` the
methods' speed, `eval` arithmetic accuracy.

    smcsd generate "def fibonacci(n):" --method smc --num-particles 8
    smcsd fetch smollm2-135m && smcsd chat "What is the capital of France?"
    smcsd bench --methods ar sd smc --batch-sizes 1 4 --out bench.json
    smcsd bench --config experiments/bench_matrix.toml          # methods x drafters x N, K x batch, per pair
    smcsd eval --method smc --limit 100

`bench` and `eval` run the modules `experiments.bench.speed` and `experiments.studies.eval_arith` of the
source checkout (the `experiments` package is not installed). Errors are one line on stderr,
`smcsd: error: ...`, with a non-zero exit status; never a traceback for a bad argument
(set SMCSD_DEBUG=1 to see the traceback of a library error).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import math
import os
import sys
from pathlib import Path

PROG = "smcsd"
DEFAULT_MODEL = "tiny-code"
CHAT_MODEL = "smollm2-135m"  # the default of `smcsd chat` (downloaded by `smcsd fetch smollm2-135m`)
CHAT_EXIT = ("/exit", "/quit")
RANDOM_MODEL = "random"
KNOWN_METHODS = ("ar", "sd", "sd-multi", "sd-tree", "smc")  # for --help only; the registry is the authority
EXPERIMENTS = {"bench": "experiments.bench.speed", "eval": "experiments.studies.eval_arith"}


class CLIError(Exception):
    """A user-facing error: printed as one `smcsd: error: <message>` line."""


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (`<prog>: error: ...`), exit status 2."""

    def error(self, message):  # noqa: D102  (argparse API)
        root = self.prog.split()[0] if self.prog else PROG
        self.exit(2, f"{root}: error: {_one_line(message)}\n")


def _one_line(message) -> str:
    return " ".join(str(message).split())


# ----------------------------------------------------------------------------------- argument types

def _typed(kind, check, what):
    """An argparse type: convert with `kind`, then require `check(value)`; `what` names the rule."""
    def convert(text):
        try:
            value = kind(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not check(value):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return value
    convert.__name__ = what  # argparse names the type in some messages
    return convert


positive_int = _typed(int, lambda v: v >= 1, "an integer >= 1")
nonneg_int = _typed(int, lambda v: v >= 0, "an integer >= 0")
temperature_type = _typed(float, lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0 (0 means greedy)")
top_p_type = _typed(float, lambda v: 0 < v <= 1, "a number in (0, 1] (1 disables top-p)")
fraction_type = _typed(float, lambda v: 0 <= v <= 1, "a number in [0, 1]")
cut_type = _typed(float, lambda v: 0 <= v < 1, "a number in [0, 1)")
alpha_type = _typed(float, lambda v: math.isfinite(v) and v > 0, "a finite number > 0")
positive_seconds = _typed(float, lambda v: math.isfinite(v) and v > 0, "a number of seconds > 0")


def method_type(text: str) -> str:
    import smcsd
    methods = smcsd.available_methods()
    if text not in methods:
        raise argparse.ArgumentTypeError(f"unknown method {text!r}; choose one of: {', '.join(methods)}")
    return text


def resampler_type(text: str) -> str:
    from smcsd.resample import available_resamplers
    names = available_resamplers()
    if text not in names:
        raise argparse.ArgumentTypeError(f"unknown resampler {text!r}; choose one of: {', '.join(names)}")
    return text


# ----------------------------------------------------------------------------------- models

@functools.lru_cache(maxsize=4)
def random_pair(seed: int = 0):
    """A small *randomly initialised* (target, draft) pair on the byte vocabulary: noise text, real timing."""
    from smcsd.models import ByteTokenizer, ModelConfig, init_model
    tok = ByteTokenizer()
    target = init_model(ModelConfig(vocab_size=tok.vocab_size, hidden_size=128, intermediate_size=384,
                                    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                    max_position_embeddings=1024), seed, tokenizer=tok, name="random-target")
    draft = init_model(ModelConfig(vocab_size=tok.vocab_size, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=1024),
                       seed + 1, tokenizer=tok, name="random-draft")
    return target, draft


def load_checkpoint(path: str, flag: str):
    """A model from a local directory: a Hugging Face checkpoint (config.json with `architectures` or
    `model_type`, *.safetensors), or one in this project's own format (a `ModelConfig` config.json)."""
    p = Path(path)
    if not p.is_dir():
        raise CLIError(f"{flag} {path}: no such directory (give a local checkpoint directory)")
    cfg = p / "config.json"
    if cfg.is_file():
        try:
            hf_style = any(k in json.loads(cfg.read_text()) for k in ("architectures", "model_type"))
        except ValueError as e:
            raise CLIError(f"{flag} {path}: config.json is not valid JSON ({e})") from None
        if not hf_style:
            from smcsd.models.shipped import load_model_dir
            return load_model_dir(str(p))
    try:
        from smcsd.models import from_pretrained
    except ImportError:
        raise CLIError(f"{flag} needs models.from_pretrained (Hugging Face checkpoint loading), which this "
                       "installation lacks; use --model NAME instead") from None
    return from_pretrained(str(p))


def load_models(model: str | None = None, target_dir: str | None = None, draft_dir: str | None = None,
                drafter: str | None = None):
    """(target, draft) from --model NAME (a shipped pair, or 'random') or --target DIR [--draft DIR], with
    --drafter NAME picking one of the pair's drafters (or a parameter-free one such as prompt-lookup)."""
    import smcsd
    if drafter is not None and draft_dir:
        raise CLIError("give either --draft DIR or --drafter NAME, not both")
    if target_dir or draft_dir:
        if model is not None:
            raise CLIError("give either --model or --target/--draft, not both")
        if not target_dir:
            raise CLIError("--draft needs --target (the model whose distribution is sampled)")
        target = load_checkpoint(target_dir, "--target")
        draft = load_checkpoint(draft_dir, "--draft") if draft_dir else None
        if drafter is not None:
            if drafter not in smcsd.pairs.PARAM_FREE:
                raise CLIError(f"--drafter {drafter}: with --target DIR only a parameter-free drafter applies "
                               f"({', '.join(sorted(smcsd.pairs.PARAM_FREE))}); give a model drafter as --draft DIR")
            draft = smcsd.pairs.PARAM_FREE[drafter]()
        return target, draft
    name = model or DEFAULT_MODEL
    if name == RANDOM_MODEL:
        target, draft = random_pair()
        if drafter is not None and drafter != "ar":
            if drafter not in smcsd.pairs.PARAM_FREE:
                raise CLIError(f"--drafter {drafter}: the random pair has 'ar' and "
                               f"{', '.join(sorted(smcsd.pairs.PARAM_FREE))}")
            draft = smcsd.pairs.PARAM_FREE[drafter]()
        return target, draft
    have = smcsd.available_models()
    if name not in have:
        raise CLIError(f"--model {name}: no such shipped model pair in this installation (available: "
                       f"{', '.join(have) if have else 'none yet'}); use --model {RANDOM_MODEL} for a random "
                       "untrained pair, or --target DIR --draft DIR for local checkpoints")
    if drafter is not None and drafter not in smcsd.available_drafters(name):
        raise CLIError(f"--drafter {drafter}: model {name} has the drafters "
                       f"{', '.join(smcsd.available_drafters(name))}")
    return smcsd.load(name, drafter=drafter)


def add_model_args(p: argparse.ArgumentParser, default: str = "the shipped tiny-code pair") -> None:
    g = p.add_argument_group(f"models (default: {default})")
    g.add_argument("--model", metavar="NAME", default=None,
                   help=f"a shipped pair (see smcsd.available_models(), e.g. {DEFAULT_MODEL}, tiny-arith) or "
                        f"'{RANDOM_MODEL}' for a small randomly initialised pair (noise text, real timing)")
    g.add_argument("--target", metavar="DIR", default=None,
                   help="a local Hugging Face checkpoint directory (config.json + *.safetensors) as the target")
    g.add_argument("--draft", metavar="DIR", default=None,
                   help="a local checkpoint directory as the draft (same vocabulary as the target)")
    g.add_argument("--drafter", metavar="NAME", default=None,
                   help="which drafter: one of the pair's (smcsd.available_drafters(NAME): ar, ar-distilled, ...) or "
                        "prompt-lookup (n-gram lookup in the prompt, any target; default: the pair's best)")


# ----------------------------------------------------------------------------------- generate

def _read_prompts(prompts: list[str]) -> list[str]:
    if prompts == ["-"]:
        text = sys.stdin.read()
        if not text:
            raise CLIError("PROMPT '-' reads the prompt from stdin, but stdin was empty")
        return [text]
    return prompts


def _json_safe(obj):
    """Strict JSON: NaN/inf (e.g. `ar`'s undefined acceptance rate) become null; numpy scalars plain numbers."""
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _decode_kwargs(args) -> dict:
    """smcsd.decode's keyword arguments from the options of `add_decode_args`."""
    return dict(method=args.method, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                top_k=args.top_k, top_p=args.top_p, seed=args.seed, num_speculative_tokens=args.num_speculative_tokens,
                num_particles=args.num_particles, draft_temperature=args.draft_temperature,
                ess_threshold=args.ess_threshold, resampler=args.resampler, alpha=args.alpha, select=args.select,
                tree=args.tree, confidence_cut=args.confidence_cut)


def cmd_generate(args) -> int:
    import smcsd
    target, draft = load_models(args.model, args.target, args.draft, args.drafter)
    prompts = _read_prompts(args.prompt)
    res = smcsd.decode(prompts, target=target, draft=draft, **_decode_kwargs(args))
    texts = res.texts if res.texts is not None else [" ".join(map(str, t)) for t in res.tokens]
    if args.json:
        stats = res.stats.to_dict()
        print(json.dumps(_json_safe({"prompts": prompts, "texts": texts, "tokens": res.tokens, "stats": stats}),
                         allow_nan=False))
        return 0
    for i, (prompt, text) in enumerate(zip(prompts, texts)):
        if len(prompts) > 1:
            print(f"--- [{i}]")
        print((prompt + text) if args.echo else text)
    if not args.no_stats:
        print(res.stats.summary())
    return 0


GENERATE_EPILOG = """\
examples:
  smcsd generate "def fibonacci(n):"                        # ar on the shipped tiny-code pair
  smcsd generate "def f(x):" --method smc --num-particles 8 --num-speculative-tokens 4
  smcsd generate "def f(x):" --method sd --temperature 0    # greedy: same text as ar
  smcsd generate $'Q: Tom had 27 toys and sold 6. How many toys are left?\nA:' --model tiny-arith --echo
  smcsd generate "import os" --model random                 # random untrained pair (noise, real timing)
  smcsd generate "Hello" --target ./llama-1b --draft ./llama-68m --method smc
  echo "def main():" | smcsd generate - --json

The text printed is the continuation (with --echo, prompt + continuation), then one line of stats:
method | tokens | tokens/s | target calls | tokens per target call | acceptance | resamples | compile.
"""


# ----------------------------------------------------------------------------------- chat / fetch

def load_chat_models(model: str | None = None, target_dir: str | None = None, draft_dir: str | None = None,
                     drafter: str | None = None):
    """(target, draft) for chat: like `load_models`, but the default is CHAT_MODEL (fetched beforehand), and
    the target must have a chat template."""
    if model is not None or target_dir or draft_dir:
        loaded = load_models(model, target_dir, draft_dir, drafter)
    else:
        import smcsd
        how = (f"run 'smcsd fetch {CHAT_MODEL}' to download it, or pass --target DIR (a local checkpoint of a "
               "chat model)")
        if CHAT_MODEL not in smcsd.available_models():
            raise CLIError(f"the default chat model {CHAT_MODEL} is not available; {how}")
        try:
            if drafter is not None and drafter not in smcsd.available_drafters(CHAT_MODEL):
                raise CLIError(f"--drafter {drafter}: {CHAT_MODEL} has the drafters "
                               f"{', '.join(smcsd.available_drafters(CHAT_MODEL))}")
            loaded = smcsd.load(CHAT_MODEL, drafter=drafter)
        except (OSError, ValueError) as e:
            raise CLIError(f"the default chat model {CHAT_MODEL} could not be loaded ({e}); {how}") from None
    target, draft = loaded if isinstance(loaded, tuple) else (loaded, None)
    if getattr(target.tokenizer, "chat_template", None) is None:
        raise CLIError(f"model {getattr(target, 'name', '?')!r} has no chat template, so it cannot chat; use a "
                       f"chat (instruct) model: --model {CHAT_MODEL} or --target DIR with a chat_template in "
                       "its tokenizer_config.json")
    return target, draft


def _user_turns(first: str | None):
    """The user's messages: `first` alone (MESSAGE; '-' reads stdin whole), else stdin lines up to EOF or /exit."""
    if first is not None:
        text = sys.stdin.read() if first == "-" else first
        if not text.strip():
            raise CLIError("MESSAGE is empty: give the text to answer (or omit it to chat interactively)")
        yield text
        return
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"(type a message and press Enter; {CHAT_EXIT[0]} or Ctrl-D quits)", file=sys.stderr)
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line or line.strip() in CHAT_EXIT:
            return
        if line.strip():
            yield line.rstrip("\n")


def cmd_chat(args) -> int:
    import smcsd
    target, draft = load_chat_models(args.model, args.target, args.draft, args.drafter)
    history = [{"role": "system", "content": args.system}] if args.system else []
    kwargs = _decode_kwargs(args)
    for text in _user_turns(args.message):
        history.append({"role": "user", "content": text})
        res = smcsd.decode(messages=history, target=target, draft=draft, **kwargs)
        answer = res.texts[0].strip()
        history.append({"role": "assistant", "content": answer})
        print(answer, flush=True)
        if args.stats:
            print(res.stats.summary(), flush=True)
    return 0


def cmd_fetch(args) -> int:
    try:
        from smcsd.models.registry import fetch
    except ImportError as e:
        raise CLIError(f"'smcsd fetch' needs smcsd.models.registry, which this installation lacks ({e})") from None
    try:
        path = fetch(args.name)
    except OSError as e:  # network or disk trouble: one line, not a traceback
        raise CLIError(f"fetching {args.name} failed: {e}") from None
    print(path)
    return 0


DEVICE_CHECK_EPILOG = """\
examples:
  smcsd device-check --out device_check.json            # real shapes on this backend, 6-minute budget
  smcsd device-check --toy --out toy.json               # tiny shapes on CPU, under 2 minutes
  smcsd device-check --backend gpu --out h200.json      # says so (one line) and runs on CPU if there is no GPU
  smcsd device-check --fit h200.json --out h200_fit.json  # refit the cost model's constants from a run

docs/device_check.md: running it on a GPU or TPU VM, refitting, and which figures are measured.
"""


def cmd_device_check(args) -> int:
    from . import device_check
    if args.fit is None and args.out is None:
        raise CLIError("device-check needs --out FILE.json (where the results are written, rewritten after each "
                       "row); or --fit FILE to refit the cost model from a results file")
    if args.out is not None:
        try:
            device_check.check_out(args.out, "--out")
        except (ValueError, TypeError) as e:
            raise CLIError(str(e)) from None
    if args.fit is not None:
        try:
            device_check.fit(args.fit, out=args.out)
        except (ValueError, TypeError, FileNotFoundError) as e:
            message = str(e)
            raise CLIError("--fit: " + (message[5:] if message.startswith("fit: ") else message)) from None
        return 0
    device_check.run(toy=args.toy, budget_s=args.budget_s, out=args.out, backend=args.backend,
                     acceptance=args.acceptance, plot=not args.no_plot)
    return 0


CHAT_EPILOG = f"""\
examples:
  smcsd fetch {CHAT_MODEL}                              # once: download the default chat model
  smcsd chat "What is the capital of France?"            # one answer, then exit
  smcsd chat --system "Answer in one sentence." --temperature 0
  smcsd chat --target ./my-instruct-model --max-new-tokens 128 "Hi!"
  echo "Write a haiku about the sea." | smcsd chat -

Without MESSAGE, each line read from stdin is a user turn; the conversation is kept, and each answer is
printed in turn. Stop with {CHAT_EXIT[0]} or end of input (Ctrl-D).
"""


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="smcsd: faster decoding from a target language model with a small draft model, in JAX.\n"
                    "Methods: ar (exact autoregressive reference), sd (speculative decoding), sd-multi\n"
                    "(multi-draft speculative decoding), sd-tree (a token tree verified in one call), smc (SMC\n"
                    "speculative decoding: N particles, K draft tokens per cycle, importance weights, resampling,\n"
                    "no rollback).",
        epilog="examples:\n"
               "  smcsd generate \"def fibonacci(n):\" --method smc --num-particles 4\n"
               "  smcsd fetch smollm2-135m && smcsd chat \"Name three primary colours.\"\n"
               "  smcsd bench --methods ar sd smc --batch-sizes 1 4 --out bench.json\n"
               "  smcsd eval --method sd --limit 100\n\n"
               "Run 'smcsd COMMAND --help' for a command's options.")
    from . import __version__
    parser.add_argument("--version", action="version", version=f"smcsd {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)

    g = sub.add_parser("generate", help="decode a prompt and print the text and the stats",
                       description="Decode PROMPT(s) with one method and print the continuation and a line of "
                                   "stats.", epilog=GENERATE_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    g.add_argument("prompt", nargs="+", metavar="PROMPT",
                   help="the prompt text (several PROMPTs decode as one batch; '-' reads one from stdin)")
    add_decode_args(g)
    add_model_args(g)
    o = g.add_argument_group("output")
    o.add_argument("--echo", action="store_true", help="print the prompt before the continuation")
    o.add_argument("--no-stats", action="store_true", help="do not print the stats line")
    o.add_argument("--json", action="store_true", help="print one JSON object: texts, tokens and all stats")
    g.set_defaults(func=cmd_generate)

    c = sub.add_parser("chat", help="chat with an instruct model: answer MESSAGE, or talk interactively",
                       description="Chat with an instruct model through its chat template: answer MESSAGE once,\n"
                                   "or without it read user turns from stdin (one per line) until EOF or /exit,\n"
                                   "keeping the conversation.", epilog=CHAT_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("message", nargs="?", default=None, metavar="MESSAGE",
                   help="answer this one message and exit ('-' reads it from stdin); omit it to chat interactively")
    c.add_argument("--system", metavar="TEXT", default=None, help="a system message that opens the conversation")
    add_decode_args(c, max_new_tokens=256)
    add_model_args(c, default=f"{CHAT_MODEL}, after 'smcsd fetch {CHAT_MODEL}'")
    c.add_argument_group("output").add_argument("--stats", action="store_true",
                                                help="print a line of stats after each answer")
    c.set_defaults(func=cmd_chat)

    f = sub.add_parser("fetch", help="download a model by name and print its local path",
                       description="Download a model (e.g. smollm2-135m) into the local model store, so "
                                   "smcsd.load(NAME) and 'smcsd chat --model NAME' find it; prints its path.")
    f.add_argument("name", metavar="NAME", help=f"the model's name, e.g. {CHAT_MODEL}")
    f.set_defaults(func=cmd_fetch)

    from .train import cli as train_cli
    train_cli.add_parser(sub)  # smcsd train-drafter: distil a drafter for a target (smcsd/train)

    d = sub.add_parser("device-check", help="measure every method at real model shapes on this backend against the "
                                            "cost model (JSON + plot), or refit the cost model from such a run",
                       description="Build random-weight models at real shapes (Llama-3.1-8B + 3.2-1B, SmolLM2-135M "
                                   "and its drafters) on the backend JAX finds, time a target call against tokens per "
                                   "call and one cycle of ar, sd, sd-tree and smc over an N x K grid, and write each "
                                   "row with the cost model's prediction. Stops within --budget-s, compile time "
                                   "included; the JSON is rewritten after every row.",
                       epilog=DEVICE_CHECK_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("--toy", action="store_true", help="tiny shapes on CPU (under 2 minutes)")
    d.add_argument("--budget-s", type=positive_seconds, default=None, metavar="N",
                   help="stop within N seconds, compile time included (default: 360; --toy: 110)")
    d.add_argument("--backend", choices=("gpu", "tpu", "cpu"), default=None,
                   help="run on this backend (default: whatever JAX finds); if absent, says so and runs on what "
                        "there is")
    d.add_argument("--out", metavar="FILE.json", default=None,
                   help="results JSON (the plot goes beside it as FILE.png); with --fit: where the fit is written")
    d.add_argument("--fit", metavar="FILE", default=None,
                   help="refit the cost model's constants from a device-check results FILE (prints them; --out "
                        "writes them) instead of measuring")
    d.add_argument("--acceptance", type=fraction_type, default=0.81, metavar="A",
                   help="per-token acceptance the throughput columns assume (default 0.81, as the Llama projections)")
    d.add_argument("--no-plot", action="store_true", help="write the JSON only")
    d.set_defaults(func=cmd_device_check)

    for name, module in EXPERIMENTS.items():
        what = ("speed of methods x particles x draft length x batch size: tokens/s, speed-up vs ar, "
                "target calls per token, acceptance, ESS; JSON, markdown table, speed-vs-accuracy plot"
                if name == "bench" else
                "exact-match accuracy of a method on the tiny-arith test set (JSON result)")
        sub.add_parser(name, help=what, add_help=False,
                       description=f"Runs {module}; see 'smcsd {name} --help'.")
    return parser


def tree_type(text: str):
    from .drafters.tree import TreeSpec
    try:
        return TreeSpec.parse(text)
    except (TypeError, ValueError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_decode_args(p: argparse.ArgumentParser, max_new_tokens: int = 64) -> None:
    """The decoding options shared by generate and chat: method, length, sampling, speculative settings."""
    p.add_argument("--method", type=method_type, default=None, metavar="METHOD",
                   help=f"one of {', '.join(KNOWN_METHODS)} (default: with a draft the pair's measured choice, "
                        "see docs/methods.md; else ar)")
    p.add_argument("--max-new-tokens", type=positive_int, default=max_new_tokens, metavar="N",
                   help=f"tokens to generate per prompt or answer, fewer if a stop token comes first "
                        f"(default: {max_new_tokens})")
    s = p.add_argument_group("sampling: the target distribution p_T every method samples from")
    s.add_argument("--temperature", type=temperature_type, default=0.7, metavar="T",
                   help="0 = greedy (default: 0.7)")
    s.add_argument("--top-k", type=nonneg_int, default=0, metavar="K", help="0 = off (default: 0)")
    s.add_argument("--top-p", type=top_p_type, default=1.0, metavar="P", help="1 = off (default: 1)")
    s.add_argument("--seed", type=nonneg_int, default=0, help="random seed (default: 0)")
    sp = p.add_argument_group("speculative methods (sd, sd-multi, sd-tree, smc)")
    sp.add_argument("--num-speculative-tokens", "-K", type=positive_int, default=None, metavar="K",
                    help="draft tokens proposed per target call (default: the method's, see docs/methods.md)")
    sp.add_argument("--num-particles", "-N", type=positive_int, default=None, metavar="N",
                    help="particles (smc) or drafts (sd-multi) per prompt (default: the method's, see docs/methods.md)")
    sp.add_argument("--draft-temperature", type=temperature_type, default=None, metavar="T",
                    help="temperature of the draft's proposals (default: --temperature)")
    sp.add_argument("--ess-threshold", type=fraction_type, default=0.5, metavar="TAU",
                    help="smc: resample when ESS < TAU*N; 1 always, 0 never (default: 0.5)")
    sp.add_argument("--resampler", type=resampler_type, default="systematic", metavar="NAME",
                    help="smc: systematic, stratified, multinomial or residual (default: systematic)")
    sp.add_argument("--alpha", type=alpha_type, default=1.0,
                    help="smc: target p_T^alpha (1 = p_T itself; default: 1)")
    sp.add_argument("--select", choices=("sample", "argmax"), default="sample",
                    help="smc: output particle drawn by weight, or the heaviest (default: sample)")
    sp.add_argument("--confidence-cut", type=cut_type, default=0.0, metavar="C",
                    help="sd: verify only the drafts whose cumulative top-1 confidence under the drafter stays >= C "
                         "(0..K per cycle; exact either way; default: 0, all K)")
    sp.add_argument("--tree", type=tree_type, default=None, metavar="SHAPE",
                    help="sd-tree: children per depth, e.g. 2,1,1,1 (':distinct' or ':top' for how siblings are "
                         "drawn; '+B' adds B D²SD branches with --drafter d2sd); default: chosen per drafter")


# ----------------------------------------------------------------------------------- bench / eval

def experiments_dir() -> Path:
    import smcsd
    return Path(smcsd.__file__).resolve().parent.parent / "experiments"


def load_experiment(name: str):
    """Import the module `name` (`experiments.bench.speed`) of the source checkout's `experiments` package, the
    folder beside the smcsd package: it is not installed, so from outside the repository it is not on sys.path and
    is imported from that folder (another package called `experiments` is refused, never run)."""
    root = experiments_dir()
    path = root.joinpath(*name.split(".")[1:]).with_suffix(".py")
    if not path.is_file():
        raise CLIError(f"{path} not found: 'smcsd bench' and 'smcsd eval' run the scripts in experiments/ of "
                       "the source checkout; install with 'pip install -e .' from a clone of the repository")
    package = sys.modules.get("experiments")
    if package is None:
        spec = importlib.util.spec_from_file_location("experiments", root / "__init__.py",
                                                      submodule_search_locations=[str(root)])
        package = importlib.util.module_from_spec(spec)
        sys.modules["experiments"] = package
        try:
            spec.loader.exec_module(package)
        except BaseException:
            del sys.modules["experiments"]
            raise
    if Path(package.__file__).resolve().parent != root:
        raise CLIError(f"the package 'experiments' imported here is {package.__file__}, not the checkout's {root}")
    module = importlib.import_module(name)
    if not callable(getattr(module, "main", None)):
        raise CLIError(f"{path} has no main(argv) function")
    return module


@contextlib.contextmanager
def _as_subcommand(name: str):
    """While a script's main() runs: its argparse prog reads `smcsd <name>` and its argument errors are
    one line (`smcsd: error: ...`), like the rest of the CLI."""
    saved_argv0, saved_error = sys.argv[0] if sys.argv else "", argparse.ArgumentParser.error
    if sys.argv:
        sys.argv[0] = f"{PROG} {name}"
    else:
        sys.argv.append(f"{PROG} {name}")
    argparse.ArgumentParser.error = OneLineParser.error
    try:
        yield
    finally:
        sys.argv[0] = saved_argv0
        argparse.ArgumentParser.error = saved_error


def run_experiment(name: str, argv: list[str]) -> int:
    if name == "bench" and any(a == "--config" or a.startswith("--config=") for a in argv):
        module = load_experiment("experiments.bench.matrix")  # the method x drafter matrix from a config file
    else:
        module = load_experiment(EXPERIMENTS[name])
    asks_help = any(a in ("-h", "--help") for a in argv)
    if name == "eval" and not asks_help and not any(a.startswith("--pair-dir") for a in argv):
        import smcsd
        if "tiny-arith" not in smcsd.available_models():
            raise CLIError("'smcsd eval' needs the shipped tiny-arith pair, which this installation lacks "
                           "(train it with python -m experiments.train.pair), or --pair-dir DIR with target/ and draft/")
    with _as_subcommand(name):
        try:
            out = module.main(argv) if "prog" not in _params(module.main) else module.main(argv, prog=f"{PROG} {name}")
        except SystemExit as e:  # argparse --help (0) or a usage error (2), already printed
            return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return out if isinstance(out, int) else 0


def _params(fn) -> tuple:
    import inspect
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return ()


# ----------------------------------------------------------------------------------- main

def error(message) -> int:
    print(f"{PROG}: error: {_one_line(message)}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    """Entry point of the `smcsd` console script and `python -m smcsd`; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in EXPERIMENTS:  # options belong to the script: pass them through untouched
            return run_experiment(argv[0], argv[1:])
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:
            return e.code if isinstance(e.code, int) else 0
        if args.command is None:
            parser.print_help()
            return 2
        return args.func(args)
    except CLIError as e:
        return error(e)
    except (ValueError, TypeError, FileNotFoundError, NotADirectoryError, PermissionError) as e:
        if os.environ.get("SMCSD_DEBUG"):  # SMCSD_DEBUG=1 smcsd ...: the full traceback, for bug reports
            raise
        return error(e)
    except KeyboardInterrupt:
        return error("interrupted")


if __name__ == "__main__":
    sys.exit(main())
