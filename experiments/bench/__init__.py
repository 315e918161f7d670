"""Benchmarks: speed of the methods, drafters and peer implementations on this machine (tokens/s, target calls per
token, acceptance), each a module run as `python -m experiments.bench.<name>`."""
