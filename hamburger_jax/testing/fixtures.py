"""Tiny configs and random HAMburger weights that decode non-trivially: tests, benchmarks, demos.

    cfg = tiny_config(num_layers=2)
    params = random_params(cfg, seed=0)          # groups of 1..S tokens depending on confidence
    make_tiny_checkpoint("/tmp/tiny_ckpt")       # the same, saved as this project's export
    write_word_tokenizer("/tmp/tiny_ckpt", cfg.base.vocab_size)   # a tokenizer.json beside it
"""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from hamburger_jax.convert import save_hamburger
from hamburger_jax.model.batch import make_batch
from hamburger_jax.model.config import HamburgerConfig, get_preset
from hamburger_jax.model.hamburger import HamburgerModel, init_params


def random_params(cfg: HamburgerConfig, seed: int = 0, weight_std: float = 0.08,
                  stop_mean: float = -1.0, stop_std: float = 2.0):
  """Random HAMburger params that decode non-trivially (they say nothing about quality).

  Every matrix is drawn with std `weight_std` (the default init's 0.02 gives near-uniform
  logits), then the stop head's last layer is rescaled so that its logits on random token
  groups have about mean `stop_mean` and std `stop_std`: continue-probabilities spread over
  (0, 1) and groups get lengths of 1..S that depend on the confidence, as with a trained model.
  """
  params = _jitted_init(cfg)(jax.random.PRNGKey(seed))
  params = jax.tree_util.tree_map(lambda x: x * (weight_std / 0.02) if x.ndim >= 2 else x, params)
  return calibrate_stop_head(cfg, params, stop_mean, stop_std, seed)


@functools.lru_cache(maxsize=8)
def _jitted_init(cfg: HamburgerConfig):
  return jax.jit(functools.partial(init_params, cfg))


@functools.lru_cache(maxsize=8)
def _jitted_forward(cfg: HamburgerConfig):
  return jax.jit(HamburgerModel(cfg).apply)


def calibrate_stop_head(cfg: HamburgerConfig, params, mean: float, std: float, seed: int = 0):
  """Rescales stop_head.dense_2 so stop logits on random teacher-forced groups ~ (mean, std)."""
  rng = np.random.default_rng(seed)
  s, vocab = cfg.max_steps, cfg.base.vocab_size
  examples = []
  for _ in range(4):
    steps = rng.integers(1, s + 1, 8).tolist()
    prompt = rng.integers(0, vocab, 8).tolist()
    examples.append((prompt, rng.integers(0, vocab, sum(steps)).tolist(), steps))
  batch = make_batch(examples, s, 8 + 8, pack=False)
  out = _jitted_forward(cfg)({"params": params}, batch)
  logits = np.asarray(out.stop_logits)[np.arange(s) < batch["target_lengths"][..., None]]
  return rescale_stop_head(params, logits, mean, std)


def rescale_stop_head(params, sample, mean: float, std: float):
  """Scales stop_head.dense_2's kernel and sets its bias so that stop logits which were `sample`
  (any array of them) would have this mean and std."""
  sample = np.asarray(sample, np.float64)
  head = params["micro_decoder"]["stop_head"]["dense_2"]
  scale = std / max(float(sample.std()), 1e-6)
  bias = mean - scale * (float(sample.mean()) - float(head["bias"][0]))
  new_head = {"kernel": head["kernel"] * scale, "bias": jnp.full_like(head["bias"], bias)}
  micro = dict(params["micro_decoder"], stop_head=dict(params["micro_decoder"]["stop_head"],
                                                       dense_2=new_head))
  return dict(params, micro_decoder=micro)


def tiny_config(num_layers: int = 4) -> HamburgerConfig:
  """The tiny preset with fewer layers (fast to compile): CPU tests and the README example."""
  if num_layers < 2:
    raise ValueError(f"tiny_config needs >= 2 layers (feature taps), got {num_layers}.")
  cfg = get_preset("tiny")
  base = dataclasses.replace(cfg.base, num_layers=num_layers)
  return cfg.replace(base=base, feature_layers=tuple(range(min(3, num_layers - 1))))


def make_tiny_checkpoint(directory: str, seed: int = 0, num_layers: int = 4) -> str:
  """Writes random tiny HAMburger weights as this project's export; returns the directory."""
  cfg = tiny_config(num_layers)
  save_hamburger(directory, cfg, random_params(cfg, seed))
  return directory


CHATML = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
_WORDS = ("<unk>", "hello", "the", "world", "user", "assistant", "system", "cat", "sat", "on",
          "mat", "a", "dog", "yes", "no", "red", "blue", "one", "two", "three")


def write_word_tokenizer(directory: str, vocab_size: int) -> str:
  """Writes `directory`/tokenizer.json, a whitespace word-level tokenizer whose ids cover
  0..vocab_size-1: words, then w<i> fillers, then the ChatML special tokens as the last ids.
  Returns its path."""
  from tokenizers import Tokenizer, models, pre_tokenizers  # pylint: disable=g-import-not-at-top
  n = vocab_size - len(CHATML)
  words = list(_WORDS) + [f"w{i}" for i in range(len(_WORDS), n)]
  tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.add_special_tokens(list(CHATML))
  path = os.path.join(directory, "tokenizer.json")
  tok.save(path)
  return path
