"""Decoding: the jitted macro-step loop (sampler.py), its state (state.py), token sampling
(sampling.py), speed/quality evaluation against the base (evaluation.py) and decode.py's CLI
(cli.py, render.py)."""

from hamburger_jax.decode.sampler import DecodeInputError, Sampler
from hamburger_jax.decode.sampling import SamplingParams
from hamburger_jax.decode.state import DecodeResult

__all__ = ["DecodeInputError", "DecodeResult", "Sampler", "SamplingParams"]
