"""The error raised for any unusable checkpoint file."""


class CheckpointError(ValueError):
  """A checkpoint is missing, truncated, corrupt, or does not fit the model (the message says how)."""
