"""The experiments: benchmarks, studies, training recipes and the scripts that write the docs' pages, run from the
repository root as modules (`python -m experiments.bench.speed --help`).

- `common`, `report`: what the scripts share (the repository's folders and the prompts; timing, JSON, tables, plots);
  `arith_data`, `code_data`: the tiny pairs' data.
- `bench/`: speed of methods, drafters and peers. `studies/`: accuracy, exactness, cost models and per-drafter
  studies. `train/`: the recipes that trained the shipped pairs and drafters. `docs/`: generated pages and figures.
- Results go to `experiments/results/`, corpora to `experiments/data/`.
"""
