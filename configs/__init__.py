"""Experiment configs: `get_config()` files loaded by `train.py --config configs/<name>.py`."""
