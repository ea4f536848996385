"""Training: run configs and their validation (run_config.py), losses (losses.py), train/eval
steps (step.py), state and shardings (setup.py, sharding.py), the loop (loop.py), the optimizer
(optim.py), checkpoints (checkpoints.py), batches (batches.py), stop-head refits
(stop_calibration.py), TPU plans (aot.py) and train.py's command (command.py)."""
