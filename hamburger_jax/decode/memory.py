"""Whether the KV buffers of a decode call fit in the device's memory (checked before compiling).

    check_buffer_memory(llama_cfg, rows=8, cache_length=4096)   # UsageError if they would not
"""

from __future__ import annotations

import os

from hamburger_jax.decode.prompts import UsageError
from hamburger_jax.model.kv_cache import bytes_per_slot


def check_buffer_memory(llama, rows: int, cache_length: int, available: int | None = None,
                        kv_dtype: str = "model") -> None:
  """UsageError when the KV buffers alone (rows padded to a power of two) would not fit in 80%
  of the device's memory (`available` bytes; default: `device_memory()`); kv_dtype: what they
  store (`model/kv_cache.py`)."""
  per_slot = bytes_per_slot(llama, llama.num_layers, kv_dtype)
  need = (1 << (max(rows, 1) - 1).bit_length()) * cache_length * per_slot
  available = available or device_memory()
  if available and need > 0.8 * available:
    raise UsageError(f"A KV buffer of {cache_length} slots x {rows} prompts needs "
                     f"{need / 2**30:.1f} GiB but the device has {available / 2**30:.1f} GiB: "
                     "lower --max_new_tokens (or --cache_length).")


def device_memory() -> int | None:
  """Bytes the default device can hold: its memory limit, or the host's RAM on CPU."""
  import jax  # pylint: disable=g-import-not-at-top
  stats = getattr(jax.devices()[0], "memory_stats", lambda: None)() or {}
  if stats.get("bytes_limit"):
    return int(stats["bytes_limit"])
  try:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):
    return None
