"""hamburger_jax: HAMburger (several tokens per forward pass, one KV entry per group) in JAX/Flax.

Public API:
  HamburgerConfig, LlamaConfig, get_preset      model hyper-parameters (model/config.py)
  HamburgerModel, init_params                   the model (model/hamburger.py): embedder, base,
                                                micro decoder
  LlamaModel                                    the base Llama (model/llama.py)
  make_batch                                    host-side training batch builder (model/batch.py)
  hamburger_loss                                CE + 0.5 stop BCE (+ KL) (train/losses.py)
  Sampler, SamplingParams, DecodeResult         batched decoding, one jitted while_loop
                                                (decode/sampler.py)
  open_checkpoint, Decodable                    any decodable checkpoint with its tokenizer and
                                                knobs (decode/checkpoint.py)
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
from hamburger_jax.decode.checkpoint import Decodable, open_checkpoint
from hamburger_jax.decode.sampler import Sampler
from hamburger_jax.decode.sampling import SamplingParams

__all__ = [
    "CheckpointError", "Decodable", "DecodeResult", "HamburgerConfig", "HamburgerModel",
    "LlamaConfig", "LlamaModel", "export_hf_llama", "get_preset", "hamburger_loss", "init_params",
    "load_hamburger", "load_hf_llama", "load_model", "load_original", "make_batch",
    "open_checkpoint", "Sampler", "SamplingParams", "save_hamburger",
]
