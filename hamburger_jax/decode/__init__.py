"""Decoding: the device loop (loop.py: prefill, macro steps, micro steps) over a decode-model
interface (models.py), its state (state.py), token sampling (sampling.py), micro-step compaction
(compaction.py), AOT-compiled executables (compile_cache.py), one model over a device mesh
(mesh.py), static batching (sampler.py), continuous batching (batching.py over slots.py),
speed/quality evaluation against the base (evaluation.py), one loader for decodable
checkpoints (checkpoint.py) and decode.py's CLI (cli.py, command.py, render.py, memory.py)."""

from hamburger_jax.decode.batching import Completion, ContinuousBatcher, Event, Request
from hamburger_jax.decode.sampler import DecodeInputError, Sampler
from hamburger_jax.decode.sampling import SamplingParams
from hamburger_jax.decode.state import DecodeResult

__all__ = ["Completion", "ContinuousBatcher", "DecodeInputError", "DecodeResult", "Event",
           "Request", "Sampler", "SamplingParams"]
