"""hamburger_jax: HAMburger (several tokens per forward pass, one KV entry per group) in JAX/Flax.

Public API:
  HamburgerConfig, LlamaConfig, get_preset      model hyper-parameters (config.py)
  HamburgerModel, init_params                   the model (model.py): embedder, base, micro decoder
  LlamaModel                                    the base Llama (llama.py)
  make_batch                                    host-side training batch builder (batch.py)
  hamburger_loss                                CE + 0.5 stop BCE (+ KL) (losses.py)
  Sampler, SamplingParams, DecodeResult         batched decoding, one jitted while_loop (sampler.py)
  load_model, load_hf_llama, load_original,     checkpoint import/export (convert/)
  save_hamburger, load_hamburger, export_hf_llama
"""

from hamburger_jax.model.batch import make_batch
from hamburger_jax.model.config import HamburgerConfig, LlamaConfig, get_preset
from hamburger_jax.convert import (CheckpointError, export_hf_llama, load_hamburger, load_hf_llama,
                                   load_model, load_original, save_hamburger)
from hamburger_jax.model.llama import LlamaModel
from hamburger_jax.train.losses import hamburger_loss
from hamburger_jax.decode.state import DecodeResult
from hamburger_jax.model.hamburger import HamburgerModel, init_params
from hamburger_jax.decode.sampler import Sampler
from hamburger_jax.decode.sampling import SamplingParams

__all__ = [
    "CheckpointError", "DecodeResult", "HamburgerConfig", "HamburgerModel", "LlamaConfig", "LlamaModel",
    "export_hf_llama", "get_preset", "hamburger_loss", "init_params", "load_hamburger",
    "load_hf_llama", "load_model", "load_original", "make_batch", "Sampler", "SamplingParams",
    "save_hamburger",
]
