"""Fixtures of the codegen tests."""
import pytest

from prepjit.codegen import row_plan, targets
from prepjit.runtime.cache import kernel_cache


@pytest.fixture
def few_groups(monkeypatch):
    """row_plan.FOLD_MIN_GROUPS 1 while the test runs: a row kernel folds at any count of rows (the folded kernel's
    structure and arithmetic at a few rows: a static decode attention's 3 KV heads, a var batch of a few), the launch
    and kernel caches (keyed by the scheduled kernel: they know no knob) cleared before and after, the kernel disk
    cache off."""
    targets._launched.cache_clear()
    kernel_cache.clear()
    monkeypatch.setattr(row_plan, "FOLD_MIN_GROUPS", 1)
    monkeypatch.setenv("PREPJIT_CACHE", "0")
    yield
    targets._launched.cache_clear()
    kernel_cache.clear()
