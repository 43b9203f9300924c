"""pj.Array: a result of a prepared function, living on its device until read."""
from __future__ import annotations

import numpy as np


class Array:
    """A device array returned by a prepared function; `np.asarray(a)` / `a.numpy()` read it."""

    __slots__ = ("_data", "device")

    def __init__(self, data: np.ndarray, device: str = "cpu"):
        self._data, self.device = data, device

    @property
    def shape(self) -> tuple[int, ...]:
        return self._data.shape

    @property
    def dtype(self) -> np.dtype:
        return self._data.dtype

    @property
    def ndim(self) -> int:
        return self._data.ndim

    @property
    def size(self) -> int:
        return self._data.size

    def numpy(self) -> np.ndarray:
        """A NumPy copy of the data."""
        return self._data.copy()

    def __array__(self, dtype=None, copy=None):
        if copy is False and dtype is not None and np.dtype(dtype) != self._data.dtype:
            raise ValueError("a copy is needed to change the dtype")
        out = self._data if dtype is None else self._data.astype(dtype, copy=False)
        return out.copy() if copy else out

    def __len__(self) -> int:
        return len(self._data)

    def __getitem__(self, key):
        return self._data[key].copy()

    def __iter__(self):
        return iter(self.numpy())

    def item(self):
        return self._data.item()

    def __float__(self):
        return float(self._data)

    def __int__(self):
        return int(self._data)

    def __bool__(self):
        return bool(self._data)

    def __repr__(self) -> str:
        body = np.array2string(self._data, separator=", ", prefix="pj.Array(")
        return f"pj.Array({body}, dtype={self.dtype}, device={self.device!r})"
