"""Paths of the fixtures shipped in tests/fixtures."""

import os

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
OFFICIAL_TINY = os.path.join(FIXTURES, "official_tiny")
