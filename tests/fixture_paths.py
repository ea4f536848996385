"""Paths of the repository and of the fixtures shipped in tests/fixtures."""

import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(REPO, "tests", "fixtures")
OFFICIAL_TINY = os.path.join(FIXTURES, "official_tiny")
