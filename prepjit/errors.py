"""The error classes of the public contract (API.md); every layer raises these."""


class PrepjitError(Exception):
    """Base class of every error prepjit raises on purpose."""


class VarError(PrepjitError, ValueError):
    """An unknown or fixed var was supplied, or a var is missing."""


class VarBoundError(VarError):
    """A var value lies outside its inclusive [min, max] bounds."""


class SignatureError(PrepjitError, TypeError):
    """Arguments do not fit the prepared signature or the `shapes` spec."""


class TraceError(PrepjitError, TypeError):
    """The function cannot be traced (data-dependent control flow, unsupported op or argument)."""


class DeviceError(PrepjitError, RuntimeError):
    """The device is unavailable; the message says how to install it."""


class CompileError(PrepjitError, RuntimeError):
    """Generated code failed to compile; the message holds the source."""


class DeletedArrayError(PrepjitError, RuntimeError):
    """A pj.Array was used after a prepared call consumed it (donate_argnums / donate_argnames), as JAX's deleted
    arrays: its memory now holds that call's result."""


class IndexBoundError(PrepjitError, IndexError):
    """An index or gather id is out of range for the live shape (NumPy would raise IndexError); nothing is returned."""


class PlanFileError(PrepjitError, ValueError):
    """A saved plan file is malformed, truncated, of another format version or for another device."""
