"""Where things are in the checkout, for tests in any folder of the test tree."""

from __future__ import annotations

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
"""tests/support: the modules, servers and fixtures the tests share."""
TESTS = SUPPORT.parent
ROOT = TESTS.parent
"""The checkout: pyproject.toml, src/, docs/, scripts/."""
DOCS = ROOT / "docs"
SCRIPTS = ROOT / "scripts"
PLUGIN_DIR = SUPPORT / "plugin_store"
"""A third-party store package in miniature (see tests/stores/test_plugins.py)."""
SCHEMAS = SUPPORT / "schemas"
"""The SQL of earlier schema versions, frozen (the package ships only the steps)."""
