"""The parts of `python -m benchmarks.decode_speed`: the sampler engine on random or given weights
(sampler.py), static and continuous batching of the shipped model (batched.py),
and the decode ceiling by micro-decoder depth (micro_layers.py)."""
