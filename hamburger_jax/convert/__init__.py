"""Checkpoint import/export: HF Llama directories and original HAMburger checkpoints."""

from hamburger_jax.convert.errors import CheckpointError
from hamburger_jax.convert.gguf import load_gguf_llama
from hamburger_jax.convert.hf_llama import export_hf_llama, load_hf_llama
from hamburger_jax.convert.native import load_hamburger, load_model, save_hamburger
from hamburger_jax.convert.original import load_original

__all__ = ["CheckpointError", "export_hf_llama", "load_gguf_llama", "load_hamburger", "load_hf_llama", "load_model",
           "load_original", "save_hamburger"]
