"""Scalar dtypes of the IR and the promotion rules between them: NumPy's (NEP 50), and JAX's lattice wherever
bfloat16 takes part (NumPy has no bfloat16; ml_dtypes', which JAX uses, is ours).

The 16-bit floats store narrow and compute wide: `DType.compute` is the dtype their values are computed and
accumulated in (float32), and every result is rounded once to the narrow dtype."""
from __future__ import annotations

import functools

import attrs
import numpy as np

_NUMPY: dict[str, np.dtype] = {}  # name -> NumPy dtype, each found once (DType.np)


def _ml_dtypes():
    """ml_dtypes (bfloat16's NumPy type, its finfo), imported at its first use: its import takes ~1 s of CPU
    (ml_dtypes 0.7.0; NumPy's own ~0.2 s), which a program that never meets a bfloat16 need not pay, and a program
    that passes bfloat16 arrays has paid already."""
    import ml_dtypes
    return ml_dtypes


@attrs.frozen(repr=False, eq=False)
class DType:
    """A scalar dtype. It equals the NumPy dtypes, scalar types and names of its kind (`x.dtype == np.float32`,
    `x.dtype == "bfloat16"`) and `np.dtype(d)` is its NumPy dtype, as jax.numpy's dtypes are."""
    name: str
    itemsize: int
    kind: str  # "b" bool, "i" signed int, "u" unsigned int, "f" float

    def __eq__(self, other):
        if isinstance(other, DType):
            return self.name == other.name
        if other is None:  # np.dtype(None) is float64
            return False
        try:
            return self.np == np.dtype(other)
        except TypeError:
            return NotImplemented

    def __hash__(self) -> int:
        return hash(self.name)

    @property
    def dtype(self) -> np.dtype:
        """The NumPy dtype (what `np.dtype(d)` reads)."""
        return self.np

    @property
    def np(self) -> np.dtype:
        known = _NUMPY.get(self.name)
        if known is None:
            known = _NUMPY[self.name] = np.dtype(self.name) if self.name != "bfloat16" else _bfloat16_numpy()
        return known

    @property
    def narrow(self) -> bool:
        """A 16-bit float: stored in 16 bits, computed in float32 and rounded once per result."""
        return self.kind == "f" and self.itemsize == 2

    @property
    def compute(self) -> DType:
        """The dtype values of this dtype are computed and accumulated in (float32 for the 16-bit floats)."""
        return dtypes.float32 if self.narrow else self

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_int(self) -> bool:
        return self.kind in "iu"

    @property
    def is_unsigned(self) -> bool:
        return self.kind == "u"

    @property
    def bits(self) -> int:
        return 1 if self.kind == "b" else self.itemsize * 8

    @property
    def finfo(self):
        """The float dtype's limits and significand (ml_dtypes.finfo: NumPy's finfo refuses bfloat16 from NumPy 2.5)."""
        return _ml_dtypes().finfo(self.np) if self.name == "bfloat16" else np.finfo(self.np)

    # integer limits from the bits, not np.iinfo: its construction took 25 ms of SmolLM2's first calls (every integer
    # node's bounds ask for them)
    def min(self):
        if self.kind == "b":
            return False
        return float("-inf") if self.is_float else -(1 << (self.bits - 1)) if self.kind == "i" else 0

    def max(self):
        if self.kind == "b":
            return True
        return float("inf") if self.is_float else (1 << (self.bits - 1 if self.kind == "i" else self.bits)) - 1

    def __repr__(self) -> str:
        return f"dtypes.{self.name}"


class dtypes:
    bool = DType("bool", 1, "b")
    int8 = DType("int8", 1, "i")
    int16 = DType("int16", 2, "i")
    int32 = DType("int32", 4, "i")
    int64 = DType("int64", 8, "i")
    uint8 = DType("uint8", 1, "u")
    uint16 = DType("uint16", 2, "u")
    uint32 = DType("uint32", 4, "u")
    uint64 = DType("uint64", 8, "u")
    float16 = DType("float16", 2, "f")
    bfloat16 = DType("bfloat16", 2, "f")  # ml_dtypes.bfloat16: float32's exponent, 8 bits of significand
    float32 = DType("float32", 4, "f")
    float64 = DType("float64", 8, "f")
    index = int64  # symbolic integers (shapes, indices, vars) are int64

    all: tuple[DType, ...] = ()


dtypes.all = (dtypes.bool, dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8,
              dtypes.uint16, dtypes.uint32, dtypes.uint64, dtypes.float16, dtypes.bfloat16, dtypes.float32,
              dtypes.float64)
_BY_NAME = {d.name: d for d in dtypes.all}
# (a NumPy dtype's .name is slow: every array argument's is read); bfloat16's joins at its first DType.np
_BY_NUMPY = {d.np: d for d in dtypes.all if d is not dtypes.bfloat16}


def _bfloat16_numpy() -> np.dtype:
    """bfloat16's NumPy dtype (ml_dtypes': NumPy cannot name it itself), known to to_dtype's lookup from here on."""
    known = np.dtype(_ml_dtypes().bfloat16)
    _BY_NUMPY[known] = dtypes.bfloat16
    return known


def to_dtype(x) -> DType:
    """A DType from a DType, a NumPy dtype or type, or a name ("float32", "f4", float, ...)."""
    if isinstance(x, DType):
        return x
    if isinstance(x, np.dtype):
        known = _BY_NUMPY.get(x)  # (a NumPy dtype equal to one of these has its name: other byte orders are not)
        if known is not None:
            return known
    if isinstance(x, str) and x in _BY_NAME:  # ("bfloat16" before ml_dtypes is imported: NumPy cannot read it)
        return _BY_NAME[x]
    try:
        name = np.dtype(x).name
    except TypeError:
        raise TypeError(f"not a dtype: {x!r}") from None
    if name not in _BY_NAME:
        raise TypeError(f"dtype {name} is not supported (supported: {', '.join(_BY_NAME)})")
    return _BY_NAME[name]


def promote(*operands: tuple[DType, bool]) -> DType:
    """The promoted dtype of (dtype, is_weak_python_scalar) operands: NumPy 2's (NEP 50), and JAX's lattice
    where an array operand is bfloat16 (integers and bools below every float, a Python scalar keeping the array's
    dtype, two different 16-bit floats meeting at float32)."""
    return _promoted(operands)


@functools.lru_cache(maxsize=None)
def _promoted(operands: tuple[tuple[DType, bool], ...]) -> DType:
    """promote's answer, found once for each combination (NumPy's result_type: ~2 us an elementwise op traced)."""
    if any(d == dtypes.bfloat16 and not weak for d, weak in operands):
        floats = {d for d, weak in operands if d.is_float and not weak}
        widest = max(floats, key=lambda d: d.itemsize)
        return dtypes.float32 if widest.narrow and len(floats) > 1 else widest
    strong = [d.np for d, weak in operands if not weak]
    weak = [{"b": False, "i": 0, "u": 0, "f": 0.0}[d.kind] for d, w in operands if w]
    if not strong:  # only Python scalars: the widest kind wins, at Python's default width
        kind = max((d.kind for d, _ in operands), key="biuf".index)
        return {"b": dtypes.bool, "i": dtypes.int64, "u": dtypes.int64, "f": dtypes.float64}[kind]
    return to_dtype(np.result_type(*strong, *weak))
