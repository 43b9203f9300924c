"""Fixtures of the codegen tests."""
import pytest

from prepjit.codegen import row_plan, targets
from prepjit.runtime.cache import kernel_cache


def _knob_set_afresh(monkeypatch, name, value):
    """row_plan.`name` = value while the test runs, the launch and kernel caches (keyed by the scheduled kernel: they
    know no knob) cleared before and after, the kernel disk cache off."""
    targets._launched.cache_clear()
    kernel_cache.clear()
    monkeypatch.setattr(row_plan, name, value)
    monkeypatch.setenv("PREPJIT_CACHE", "0")
    yield
    targets._launched.cache_clear()
    kernel_cache.clear()


@pytest.fixture
def few_groups(monkeypatch):
    """row_plan.FOLD_MIN_GROUPS 1: a row kernel folds at any count of rows (the folded kernel's structure and
    arithmetic at a few rows: a static decode attention's 3 KV heads, a var batch of a few)."""
    yield from _knob_set_afresh(monkeypatch, "FOLD_MIN_GROUPS", 1)


@pytest.fixture
def few_warp_rows(monkeypatch):
    """row_plan.WARP_ROWS_MIN 1: short norm rows are a warp's at any count of rows (the warp row kernel's structure
    and arithmetic at a few hundred rows, a var batch's)."""
    yield from _knob_set_afresh(monkeypatch, "WARP_ROWS_MIN", 1)
