"""Research experiments of hamburger_jax (training, stop heads, segmentation), each run as
`python -m experiments.NAME` (see experiments/README.md)."""
