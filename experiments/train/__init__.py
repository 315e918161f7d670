"""Training recipes: the shipped tiny pairs, the drafters of each pair and the SmolLM2 corpus, each a module run as
`python -m experiments.train.<name>`; `common` holds the flags and defaults the drafter recipes share."""
