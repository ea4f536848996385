"""Training: run configs and their validation (run_config.py), losses (losses.py), train/eval
steps (step.py), state and shardings (setup.py, sharding.py), the loop (loop.py), the optimizer
(optim.py), checkpoints (checkpoints.py), batches (batches.py), stop-head refits
(stop_calibration.py), the verification drafter and its features (drafter.py,
drafter_features.py) and its acceptance calibration (acceptance_calibration.py), TPU plans
(aot.py) and train.py's command (command.py)."""
