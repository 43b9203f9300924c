"""Helpers for the example scripts' smoke tests: skip with the install line when an optional package is absent."""
import importlib.util

import pytest

EXTRA = "pip install -e '.[examples]'"


def need(*modules: str, install: str = EXTRA):
    """Skip the calling test unless every module is importable, saying how to install the missing ones."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed ({install})")
