"""The scripts that write the docs' generated pages and figures from the results (`python -m experiments.docs.<name>`)."""
