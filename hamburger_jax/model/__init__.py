"""The model: config, layers, base Llama, compositional embedder, micro-step decoder, HAMburger.

Imports nothing else of hamburger_jax: decode/, train/, data/ and convert/ build on it.
"""

from hamburger_jax.model.batch import make_batch
from hamburger_jax.model.config import HamburgerConfig, LlamaConfig, get_preset
from hamburger_jax.model.hamburger import HamburgerModel, init_params
from hamburger_jax.model.llama import LlamaModel, init_llama_params

__all__ = ["HamburgerConfig", "HamburgerModel", "LlamaConfig", "LlamaModel", "get_preset",
           "init_llama_params", "init_params", "make_batch"]
