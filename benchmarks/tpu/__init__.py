"""The parts of `python -m benchmarks.tpu_plan`: where one decode step's bytes go against its
floor (step_bytes.py, `--explain`)."""
