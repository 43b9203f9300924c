"""pj.Array: a result of a prepared function, living on its device until read."""
from __future__ import annotations

import numpy as np


class Array:
    """A device array returned by a prepared function; `np.asarray(a)` / `a.numpy()` read it.

    On the cpu the buffer is a NumPy array; on other devices it is device memory that is read
    only when asked, and passed to another prepared function on the same device without a copy.
    """

    __slots__ = ("buffer", "shape", "dtype", "_device")

    def __init__(self, buffer, shape: tuple[int, ...], dtype: np.dtype, device):
        self.buffer, self.shape, self.dtype, self._device = buffer, tuple(shape), np.dtype(dtype), device

    @property
    def device(self) -> str:
        return self._device.name

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def numpy(self) -> np.ndarray:
        """A NumPy copy of the data."""
        return self._device.to_numpy(self.buffer, self.shape, self.dtype, copy=True)

    def __array__(self, dtype=None, copy=None):
        out = self._device.to_numpy(self.buffer, self.shape, self.dtype, copy=bool(copy))
        if dtype is not None and np.dtype(dtype) != out.dtype:
            if copy is False:
                raise ValueError("a copy is needed to change the dtype")
            out = out.astype(dtype)
        return out

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __getitem__(self, key):
        return np.asarray(self)[key].copy()

    def __iter__(self):
        return iter(self.numpy())

    def item(self):
        return np.asarray(self).item()

    def __float__(self):
        return float(np.asarray(self))

    def __int__(self):
        return int(np.asarray(self))

    def __bool__(self):
        return bool(np.asarray(self))

    def __repr__(self) -> str:
        body = np.array2string(np.asarray(self), separator=", ", prefix="pj.Array(")
        return f"pj.Array({body}, dtype={self.dtype}, device={self.device!r})"
