"""Fixtures for tests, benchmarks and demos: tiny configs and random weights that decode
non-trivially (fixtures.py)."""
