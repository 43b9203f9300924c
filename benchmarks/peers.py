"""Peers: how each other framework compiles and calls a case's function, with NumPy in and out.

Each peer is optional; `available_peers()` lists those importable here. A peer's `prepare(fn)`
takes a function written against that framework's array namespace (handed in by the case) and
returns a callable taking and returning NumPy arrays, so every peer pays the same I/O cost.
Library peers (sentence-transformers, transformers) run a case's model their own way, through the
case's `peer_fns`; llama.cpp runs SmolLM2 in processes of its own (llama_cpp.py, low_precision_models.py).
"""
from __future__ import annotations

import importlib.util
import os

import numpy as np


class Peer:
    name = ""
    module = ""

    def available(self) -> bool:
        return importlib.util.find_spec(self.module) is not None

    def version(self) -> str:
        return getattr(importlib.import_module(self.module), "__version__", "?")


class NumPyPeer(Peer):
    name, module = "numpy", "numpy"

    def namespace(self):
        return np

    def prepare(self, fn):
        return fn


class JaxPeer(Peer):
    name, module = "jax", "jax"

    def namespace(self):
        import jax.numpy as jnp
        return jnp

    def prepare(self, fn):
        import jax
        jitted = jax.jit(fn)

        def call(*args):
            out = jitted(*args)
            return [np.asarray(o) for o in out] if isinstance(out, (tuple, list)) else np.asarray(out)
        return call


class TorchPeer(Peer):
    """PyTorch eager on the cpu (torch.from_numpy in, .numpy() out)."""

    name, module = "torch", "torch"

    def namespace(self):
        return _TorchNamespace()

    def prepare(self, fn):
        import torch

        def call(*args):
            with torch.no_grad():
                out = fn(*(torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in args))
            return out.numpy()
        return call


class _TorchNamespace:
    """The NumPy names the cases use, on torch tensors."""

    @staticmethod
    def sum(x, axis=None, keepdims=False):
        return x.sum() if axis is None else x.sum(dim=axis, keepdim=keepdims)

    @staticmethod
    def max(x, axis=None, keepdims=False):
        return x.max() if axis is None else x.amax(dim=axis, keepdim=keepdims)

    @staticmethod
    def mean(x, axis=None, keepdims=False):
        return x.mean() if axis is None else x.mean(dim=axis, keepdim=keepdims)

    @staticmethod
    def maximum(a, b):
        import torch
        return torch.clamp(a, min=b) if isinstance(b, (int, float)) else torch.maximum(a, b)

    def __getattr__(self, name):
        import torch
        return getattr(torch, name)


class TinygradPeer(Peer):
    """tinygrad's TinyJit on its CPU device (Tensor from NumPy in, .numpy() out)."""

    name, module = "tinygrad", "tinygrad"

    def available(self) -> bool:
        os.environ.setdefault("DEV", "CPU")
        return super().available()

    def version(self) -> str:
        from importlib.metadata import version
        return version("tinygrad")

    def namespace(self):
        return _TinygradNamespace()

    def prepare(self, fn):
        from tinygrad import Tensor, TinyJit
        jitted = TinyJit(lambda *ts: fn(*ts).realize())

        def call(*args):
            return jitted(*(Tensor(a) if isinstance(a, np.ndarray) else a for a in args)).numpy()
        return call


class _TinygradNamespace:
    """The NumPy names the cases use, on tinygrad tensors."""

    @staticmethod
    def sum(x, axis=None, keepdims=False):
        return x.sum(axis=axis, keepdim=keepdims)

    @staticmethod
    def max(x, axis=None, keepdims=False):
        return x.max(axis=axis, keepdim=keepdims)

    @staticmethod
    def mean(x, axis=None, keepdims=False):
        return x.mean(axis=axis, keepdim=keepdims)

    @staticmethod
    def maximum(a, b):
        return a.maximum(b)

    @staticmethod
    def swapaxes(x, a, b):
        return x.transpose(a, b)

    def __getattr__(self, name):
        from tinygrad import Tensor
        return getattr(Tensor, name)


class LibraryPeer(Peer):
    """A library that runs a whole model its own way (no array namespace): only cases with a `peer_fns` entry
    for it use it."""

    namespace = None

    def version(self) -> str:
        from importlib.metadata import version
        return version(self.distribution)


class SentenceTransformersPeer(LibraryPeer):
    name, module, distribution = "sentence-transformers", "sentence_transformers", "sentence-transformers"


class TransformersPeer(LibraryPeer):
    name, module, distribution = "transformers", "transformers", "transformers"


class PrepjitArgumentsPeer(LibraryPeer):
    """prepjit itself called another way, for a case whose prepjit form is not `fn` on all its arrays (e.g. weights
    captured from a closure against the same weights passed as arguments)."""

    name, module, distribution = "prepjit-args", "prepjit", "prepjit"


class LlamaCppPeer(LibraryPeer):
    """llama.cpp through llama-cpp-python, in processes of its own (llama_cpp.py, low_precision_models.py)."""

    name, module, distribution = "llama.cpp", "llama_cpp", "llama-cpp-python"


PEERS = (NumPyPeer(), JaxPeer(), TinygradPeer(), TorchPeer(), SentenceTransformersPeer(), TransformersPeer(),
         PrepjitArgumentsPeer(), LlamaCppPeer())


def available_peers(names=None) -> list[Peer]:
    return [p for p in PEERS if (names is None or p.name in names) and p.available()]
