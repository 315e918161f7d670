"""Studies: accuracy, exactness, fidelity, the cost model and its projections, and one study per drafter family,
each a module run as `python -m experiments.studies.<name>`."""
