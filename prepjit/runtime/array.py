"""pj.Array: a result of a prepared function, living on its device until read.

Outside a prepared function an Array also works as a read-only NumPy array, computed on the host: operators
(`a + 1`, `a @ b`, `a > 0`), indexing, NumPy's functions (`np.sum(a)`, `np.sort(a)`, through `__array__`) and
every ndarray attribute and method it does not define itself (`a.T`, `a.astype`, `a.reshape`, `a.sum(axis=0)`,
`a.tolist()`, ...) give what they give on `a.numpy()`: NumPy arrays and scalars. On the cpu that reads the
buffer in place; on a GPU it copies the data to the host first. To keep work on the device, do it inside a
prepared function (an Array passed to one on its device is not copied).
"""
from __future__ import annotations

import operator
import sys

import numpy as np

from ..errors import DeletedArrayError


class Array:
    """A device array returned by a prepared function; `np.asarray(a)` / `a.numpy()` read it.

    On the cpu the buffer is a NumPy array; on other devices it is device memory that is read
    only when asked, and passed to another prepared function on the same device without a copy.
    """

    __slots__ = ("_buffer", "shape", "dtype", "_device")

    def __init__(self, buffer, shape: tuple[int, ...], dtype: np.dtype, device):
        self._buffer, self.shape, self.dtype, self._device = buffer, tuple(shape), np.dtype(dtype), device

    @property
    def buffer(self):
        """The device memory (on the cpu a NumPy array); pj.DeletedArrayError once a call consumed it (donation)."""
        buffer = self._buffer  # read once: a donating call in another thread may take it at any moment
        if buffer is None:
            raise self.deleted_error()
        return buffer

    def is_deleted(self) -> bool:
        """Whether a prepared call consumed this array (donate_argnums / donate_argnames), as JAX's is_deleted."""
        return self._buffer is None

    def deleted_error(self, where: str = "") -> DeletedArrayError:
        what = f"{where} is a pj.Array that" if where else "this pj.Array"
        return DeletedArrayError(f"{what} has been deleted (shape {self.shape}, {self.dtype}): it was donated to a "
                                 "prepared call (donate_argnums / donate_argnames), which wrote its result into the "
                                 "array's memory; use that result instead")

    def _give_up_memory(self):
        """For a donating call: the memory, which this array then no longer has (is_deleted), or None when
        something else still references it and could read it after the call writes there: a NumPy view from
        np.asarray(a) or a.T, a.buffer held, another call reading it now. (NumPy's ndarray.resize makes the same
        reference-count test; JAX likewise does not donate a buffer with external references.)"""
        buffer = self._buffer  # references: this local, the slot and getrefcount's argument
        if buffer is None or sys.getrefcount(buffer) > 3 or not _views_point_at(buffer):
            return None
        self._buffer = None
        if sys.getrefcount(buffer) > 2:  # another thread took a reference meanwhile
            self._buffer = buffer
            return None
        return buffer

    def _take_back_memory(self, buffer) -> None:
        """Undo _give_up_memory (a donating call that fails before any kernel ran): the array is whole again."""
        self._buffer = buffer

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

    def _host(self) -> np.ndarray:
        """A read-only NumPy view of the data (on the cpu the buffer itself; elsewhere a host copy)."""
        view = np.asarray(self).view()
        view.flags.writeable = False
        return view

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __getitem__(self, key):
        return np.asarray(self)[key].copy()

    def __iter__(self):
        return iter(self.numpy())

    def item(self, *args):
        return np.asarray(self).item(*args)

    def __float__(self):
        return float(np.asarray(self))

    def __int__(self):
        return int(np.asarray(self))

    def __index__(self):
        return operator.index(np.asarray(self))

    def __bool__(self):
        return bool(np.asarray(self))

    def __complex__(self):
        return complex(np.asarray(self))

    def __format__(self, spec: str) -> str:
        return format(self._host() if self.shape else self._host().item(), spec)

    def __repr__(self) -> str:
        if self._buffer is None:
            return f"pj.Array(<donated>, shape={self.shape}, dtype={self.dtype}, device={self.device!r})"
        body = np.array2string(np.asarray(self), separator=", ", prefix="pj.Array(")
        return f"pj.Array({body}, dtype={self.dtype}, device={self.device!r})"

    __hash__ = object.__hash__  # identity, as before (plans and caches may key on an argument's id)


def _views_point_at(buffer) -> bool:
    """Whether every view of `buffer` keeps `buffer` itself alive (its `base`), so its reference count sees them:
    true of device memory, and of a NumPy array that owns its memory or lives on a non-array owner (host_pool's
    leases); NumPy collapses a view of a view onto the array below, which a count of `buffer` would miss."""
    return not isinstance(buffer, np.ndarray) or buffer.flags.owndata or not isinstance(buffer.base, np.ndarray)


def _host_operator(fn, reflected: bool = False):
    if reflected:
        def method(self, other):
            return fn(other, self._host())
    else:
        def method(self, *other):
            return fn(self._host(), *other)
    return method


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor", "lshift",
              "rshift"):
    _fn = getattr(operator, _name + "_" if _name in ("and", "or") else _name)
    setattr(Array, f"__{_name}__", _host_operator(_fn))
    setattr(Array, f"__r{_name}__", _host_operator(_fn, reflected=True))
for _name in ("lt", "le", "gt", "ge", "eq", "ne", "neg", "pos", "abs", "invert"):
    setattr(Array, f"__{_name}__", _host_operator(getattr(operator, _name)))
Array.__divmod__ = _host_operator(divmod)
Array.__rdivmod__ = _host_operator(divmod, reflected=True)
Array.__round__ = _host_operator(round)


def _host_attribute(name: str) -> property:
    return property(lambda self: getattr(self._host(), name), doc=f"`ndarray.{name}` of the data, on the host")


# ndarray's public attributes and methods (`.T`, `.astype`, `.reshape`, `.sum`, `.tolist`, ...) it does not define
# itself, read on the host. Properties rather than a __getattr__: NumPy looks for __array_struct__ and
# __array_interface__ on every np.asarray(a), and a Python __getattr__ raising for each cost 2 of its 2.7 us.
for _name in dir(np.ndarray):
    if not _name.startswith("_") and not hasattr(Array, _name):
        setattr(Array, _name, _host_attribute(_name))
del _name, _fn
