"""Training: config translation (config.py), losses (losses.py), train/eval steps (step.py),
state and shardings (setup.py), the loop (loop.py), optimizer, mesh, checkpoints, batches."""
