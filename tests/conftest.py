"""Shared fixtures: `device` runs a device-independent test once on every available device."""
import numpy as np
import pytest

from prepjit.runtime.devices import available_devices

DEVICES = available_devices()


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


@pytest.fixture
def rng():
    return np.random.default_rng(0)
