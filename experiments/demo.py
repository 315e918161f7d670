"""Main job: decode a few prompts with smcsd and print the texts and stats.

Until the shipped, trained model pairs land, this decodes with a small RANDOMLY INITIALISED
target/draft pair: the text is noise, but the engine, the stats and the timing are real.
"""

import argparse

import smcsd
from models import ByteTokenizer, ModelConfig, init_model


def random_pair(seed: int = 0):
    tok = ByteTokenizer()
    target = init_model(ModelConfig(vocab_size=tok.vocab_size, hidden_size=128, intermediate_size=384,
                                    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                    max_position_embeddings=1024), seed, tokenizer=tok, name="random-target")
    draft = init_model(ModelConfig(vocab_size=tok.vocab_size, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=1024),
                       seed + 1, tokenizer=tok, name="random-draft")
    return target, draft


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default="ar", choices=smcsd.available_methods())
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print("NOTE: random, untrained model pair (shipped trained pairs are not there yet): the text is noise.")
    target, draft = random_pair()
    prompts = ["def fibonacci(n):", "import numpy as np\n"]
    res = smcsd.decode(prompts, target=target, draft=draft, method=args.method,
                       max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed)
    for p, t in zip(prompts, res.texts):
        print(repr(p), "->", repr(t))
    print(res.stats.summary())


if __name__ == "__main__":
    main()
