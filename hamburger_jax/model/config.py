"""Model hyper-parameters: frozen, hashable dataclasses with named presets.

`LlamaConfig` describes the base model (HF `LlamaConfig` semantics); `HamburgerConfig` adds the
grafted compositional embedder and micro-step decoder. Both are hashable, so a config can be a
static argument of `jax.jit`. Experiment settings (data, optimiser, mesh) live in `configs/*.py`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

import jax.numpy as jnp

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def dtype_from_name(name: str):
  """'float32' / 'bfloat16' / 'float16' -> jnp dtype, with a clear error otherwise."""
  if name not in _DTYPES:
    raise ValueError(f"Unknown dtype {name!r}: use one of {sorted(_DTYPES)}.")
  return _DTYPES[name]


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """Llama-3 RoPE frequency scaling (`rope_scaling.rope_type == 'llama3'`)."""
  factor: float = 32.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position_embeddings: int = 8192


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
  """Hyper-parameters of a Llama decoder (the base model and the micro-decoder layers)."""
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 500000.0
  rope_scaling: RopeScaling | None = None
  rms_norm_eps: float = 1e-5
  tie_word_embeddings: bool = True
  bos_token_id: int | None = None
  eos_token_ids: tuple[int, ...] = ()
  # Storage dtype of parameters and dtype of the matmuls ('float32' or 'bfloat16').
  param_dtype: str = "float32"
  dtype: str = "float32"

  def __post_init__(self):
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                       f"({self.num_kv_heads}).")
    dtype_from_name(self.param_dtype)
    dtype_from_name(self.dtype)

  @property
  def jnp_dtype(self):
    return dtype_from_name(self.dtype)

  @property
  def jnp_param_dtype(self):
    return dtype_from_name(self.param_dtype)

  @classmethod
  def from_hf_dict(cls, d: Mapping[str, Any], **overrides) -> "LlamaConfig":
    """Builds a config from the fields of an HF `config.json` (Llama architecture)."""
    try:
      num_heads = d["num_attention_heads"]
      hidden = d["hidden_size"]
      # transformers 4.x writes `rope_scaling` + `rope_theta`; 5.x writes `rope_parameters`.
      rope_params = d.get("rope_parameters") or {}
      scaling = d.get("rope_scaling") or (rope_params if rope_params.get("rope_type") else None)
      if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind == "default":
          scaling = None
        elif kind != "llama3":
          raise ValueError(f"Unsupported rope_scaling type {kind!r}: only 'llama3' is implemented.")
        else:
          scaling = RopeScaling(
              factor=float(scaling["factor"]),
              low_freq_factor=float(scaling["low_freq_factor"]),
              high_freq_factor=float(scaling["high_freq_factor"]),
              original_max_position_embeddings=int(scaling["original_max_position_embeddings"]))
      eos = d.get("eos_token_id")
      eos = () if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
      rope_theta = d.get("rope_theta", rope_params.get("rope_theta", 10000.0))
      for flag in ("attention_bias", "mlp_bias"):
        if d.get(flag):
          raise ValueError(f"config.json sets {flag}=true; Llama models with biases are not supported.")
      kwargs = dict(
          vocab_size=d["vocab_size"], hidden_size=hidden,
          intermediate_size=d["intermediate_size"], num_layers=d["num_hidden_layers"],
          num_heads=num_heads, num_kv_heads=d.get("num_key_value_heads") or num_heads,
          head_dim=d.get("head_dim") or hidden // num_heads, rope_theta=float(rope_theta),
          rope_scaling=scaling, rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
          tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
          bos_token_id=d.get("bos_token_id"), eos_token_ids=eos)
    except KeyError as e:
      raise ValueError(f"config.json lacks the field {e.args[0]!r} that a Llama config needs.") from e
    kwargs.update(overrides)
    return cls(**kwargs)

  @classmethod
  def from_hf_json(cls, path: str | os.PathLike, **overrides) -> "LlamaConfig":
    if not os.path.isfile(path):
      raise FileNotFoundError(f"No config.json at {path}: pass the HF model directory that holds it.")
    with open(path) as f:
      try:
        d = json.load(f)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e}).") from e
    return cls.from_hf_dict(d, **overrides)

  def to_hf_dict(self) -> dict[str, Any]:
    """The inverse of `from_hf_dict`: an HF `config.json` dict for `LlamaForCausalLM`."""
    d = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
        "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_layers,
        "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
        "head_dim": self.head_dim, "rope_theta": self.rope_theta, "rms_norm_eps": self.rms_norm_eps,
        "tie_word_embeddings": self.tie_word_embeddings, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "max_position_embeddings": 131072,
        "bos_token_id": self.bos_token_id,
        "eos_token_id": (list(self.eos_token_ids) if len(self.eos_token_ids) > 1 else
                         (self.eos_token_ids[0] if self.eos_token_ids else None)),
        "torch_dtype": self.param_dtype,
    }
    if self.rope_scaling is not None:
      d["rope_scaling"] = {"rope_type": "llama3", **dataclasses.asdict(self.rope_scaling)}
    return d


@dataclasses.dataclass(frozen=True)
class HamburgerConfig:
  """The base model plus the grafted compositional embedder and micro-step decoder."""
  base: LlamaConfig
  max_steps: int = 4                       # S: tokens per macro step (group) at most
  feature_layers: tuple[int, ...] = (3, 7, 11)  # raw base-layer outputs fed to the micro decoder
  num_micro_layers: int = 4
  merger_heads: int = 64                   # heads of the embedder's attention merge
  merge_adapter_rank: int = 0              # base-layer adapter at merged inputs (0 = none)

  def __post_init__(self):
    if self.max_steps < 1:
      raise ValueError(f"max_steps must be >= 1, got {self.max_steps}.")
    bad = [i for i in self.feature_layers if not 0 <= i < self.base.num_layers]
    if bad:
      raise ValueError(f"feature_layers {bad} are outside the base model's "
                       f"{self.base.num_layers} layers.")
    if self.base.hidden_size % self.merger_heads:
      raise ValueError(f"hidden_size {self.base.hidden_size} is not divisible by "
                       f"merger_heads {self.merger_heads}.")
    if self.merge_adapter_rank < 0:
      raise ValueError(f"merge_adapter_rank must be >= 0, got {self.merge_adapter_rank}.")
    if self.base.hidden_size % 2:
      raise ValueError("hidden_size must be even (the merger position table is D/2 wide).")

  @property
  def num_features(self) -> int:
    """Feature vectors per macro position: the tapped layers plus the final-normed output."""
    return len(self.feature_layers) + 1

  @property
  def micro_length(self) -> int:
    """Length of the micro decoder's input sequence: features then S - 1 token embeddings."""
    return self.num_features + self.max_steps - 1

  def replace(self, **kw) -> "HamburgerConfig":
    return dataclasses.replace(self, **kw)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> "HamburgerConfig":
    d = dict(d)
    base = dict(d.pop("base"))
    if base.get("rope_scaling") is not None:
      base["rope_scaling"] = RopeScaling(**base["rope_scaling"])
    base["eos_token_ids"] = tuple(base.get("eos_token_ids") or ())
    d["feature_layers"] = tuple(d.get("feature_layers", (3, 7, 11)))
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - known
    if unknown:
      raise ValueError(f"Unknown HamburgerConfig keys {sorted(unknown)}; known: {sorted(known)}.")
    return cls(base=LlamaConfig(**base), **d)


_LLAMA3_SCALING = RopeScaling(32.0, 1.0, 4.0, 8192)

BASE_PRESETS: dict[str, LlamaConfig] = {
    # A few hundred thousand parameters: unit tests and CI.
    "tiny": LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=16,
                        num_heads=4, num_kv_heads=2, head_dim=16, rope_scaling=_LLAMA3_SCALING,
                        bos_token_id=1, eos_token_ids=(2,)),
    # The paper's base: Llama-3.2-1B(-Instruct).
    "llama3.2-1b": LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                               num_layers=16, num_heads=32, num_kv_heads=8, head_dim=64,
                               rope_theta=500000.0, rope_scaling=_LLAMA3_SCALING,
                               bos_token_id=128000, eos_token_ids=(128001, 128008, 128009)),
    # Llama-3.2-3B(-Instruct).
    "llama3.2-3b": LlamaConfig(vocab_size=128256, hidden_size=3072, intermediate_size=8192,
                               num_layers=28, num_heads=24, num_kv_heads=8, head_dim=128,
                               rope_theta=500000.0, rope_scaling=_LLAMA3_SCALING,
                               bos_token_id=128000, eos_token_ids=(128001, 128008, 128009)),
    # Llama-3.1-8B(-Instruct): untied LM head, RoPE scaling factor 8.
    "llama3.1-8b": LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                               num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
                               rope_theta=500000.0, rope_scaling=RopeScaling(8.0, 1.0, 4.0, 8192),
                               tie_word_embeddings=False, bos_token_id=128000,
                               eos_token_ids=(128001, 128008, 128009)),
    # SmolLM2-135M-Instruct (the embedded default's base; ChatML template).
    "smollm2-135m": LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
                                rope_theta=100000.0, rms_norm_eps=1e-5,
                                bos_token_id=1, eos_token_ids=(2,)),
}

PRESETS: dict[str, HamburgerConfig] = {
    "tiny": HamburgerConfig(base=BASE_PRESETS["tiny"]),
    "llama3.2-1b": HamburgerConfig(base=BASE_PRESETS["llama3.2-1b"]),
    # Other depths: raw outputs at the quarter points (layers L/4 - 1, L/2 - 1, 3L/4 - 1).
    "llama3.2-3b": HamburgerConfig(base=BASE_PRESETS["llama3.2-3b"], feature_layers=(6, 13, 20)),
    "llama3.1-8b": HamburgerConfig(base=BASE_PRESETS["llama3.1-8b"], feature_layers=(7, 15, 23)),
    "smollm2-135m": HamburgerConfig(base=BASE_PRESETS["smollm2-135m"], feature_layers=(7, 14, 21),
                                    merger_heads=64),
}


def get_preset(name: str, **overrides) -> HamburgerConfig:
  """A named HamburgerConfig preset; `overrides` replace fields of the base LlamaConfig."""
  if name not in PRESETS:
    raise ValueError(f"Unknown model preset {name!r}; known presets: {sorted(PRESETS)}.")
  cfg = PRESETS[name]
  if overrides:
    cfg = cfg.replace(base=dataclasses.replace(cfg.base, **overrides))
  return cfg
