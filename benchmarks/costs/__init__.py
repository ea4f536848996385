"""The parts of `python -m benchmarks.step_costs`: one micro step with and without compaction
(batch.py), one macro step of the continuous batcher (macro_step.py), the LM head at few rows
(few_rows_head.py)."""
