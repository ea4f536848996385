"""Benchmarks of hamburger_jax, each run as `python -m benchmarks.NAME` (see benchmarks/README.md);
shared code in benchmarks/common.py."""
