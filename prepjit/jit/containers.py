"""The concrete key of a container argument (a model's weights: dicts, lists and tuples of arrays), for the
prepared-call fast path (`Signature.light_key`, replay.py).

A container's key part is (structure, array parts): the structure lists, in `read`'s order (pytree.flatten's:
dict insertion order), each container's class and keys (a dict) or length, and each leaf's class (np.ndarray,
pj.Array) or None; the array parts each array's dtype, shape and strides (a pj.Array's class, device, dtype and
shape). Its arrays, in the same order, are the plan's inputs. A container holding anything else (its other
leaves are static values: `read` keys them) or nested deeper than MAX_DEPTH has no key part.

`walk` reads its structure and arrays with a Python call per container: ~1.5 us each, 0.2-0.35 ms for SmolLM2's
154 (a decode step of ~8 ms). `ContainerKeys` compiles, for the structure its argument position walked twice in
a row, a reader: straight-line code that checks every container's class and keys or length, unpacks its values and
checks each leaf's class, so it finds the same structure and arrays from the same facts, or None where the
container differs (then the walk reads it). Its structure is one tuple from call to call, so the fast path's
comparison with the last key finds it the same by identity. Both leave the array parts to `key_part`: they are
read anew on every call (an array's shape or dtype may change in place), in Python (`array_parts`) or, where the
fast path checks them against the last call's natively (runtime/array_check.py), not at all. Neither keeps the
container or its arrays alive: a reader holds the structure only.
"""
from __future__ import annotations

import operator

import numpy as np

from ..runtime.array import Array
from ..tracing.pytree import MAX_DEPTH

# the key parts of a NumPy array / a pj.Array argument or leaf, read in C (one map over a container's arrays)
NDARRAY_PARTS = operator.attrgetter("dtype", "shape", "strides")
ARRAY_PARTS = operator.attrgetter("__class__", "_device", "dtype", "shape")
_PARTS = {np.ndarray: NDARRAY_PARTS, Array: ARRAY_PARTS}
_ONLY_NDARRAYS, _ONLY_ARRAYS = {np.ndarray}, {Array}
READER_MAX_NODES = 1 << 14  # a larger structure is walked (its reader's code would be as long)


def array_parts(leaves) -> tuple:
    """The key parts of arrays (np.ndarray and pj.Array, exact classes), in C where they are of one class."""
    kinds = set(map(type, leaves))
    if kinds == _ONLY_NDARRAYS or kinds == _ONLY_ARRAYS:
        return tuple(map(_PARTS[kinds.pop()], leaves))
    return tuple(_PARTS[type(a)](a) for a in leaves)


def key_part(structure: tuple, leaves) -> tuple:
    """A container's key part: its structure (`walk`'s or a reader's) and its arrays' parts."""
    return structure, array_parts(leaves)


def walk(tree) -> tuple | None:
    """(the structure of a dict, list or tuple, its arrays), or None where it has no key part."""
    structure, leaves = [], []
    if not _walk(tree, structure, leaves, 0):
        return None
    return tuple(structure), leaves


def _walk(tree, structure: list, leaves: list, depth: int) -> bool:
    t = type(tree)
    if t is np.ndarray or t is Array:
        structure.append(t)
        leaves.append(tree)
    elif tree is None:
        structure.append(None)
    elif depth == MAX_DEPTH:
        return False
    elif t is dict or t is list or t is tuple:
        values = tuple(tree.values()) if t is dict else tree if t is tuple else tuple(tree)  # (read once: its
        structure.append((t, tuple(tree) if t is dict else len(values)))  # structure and arrays are of its leaves)
        kinds = set(map(type, values))
        if len(kinds) == 1 and (np.ndarray in kinds or Array in kinds):  # a model's layer: its arrays at once
            structure += (type(values[0]),) * len(values)
            leaves += values
            return True
        return all(_walk(v, structure, leaves, depth + 1) for v in values)
    else:
        return False
    return True


class ContainerKeys:
    """The key parts of the containers passed at one argument position: through the reader of the last structure
    walked there twice in a row (a model's weights, passed every call), else by `walk`."""

    __slots__ = ("walked", "reader")

    def __init__(self):
        self.walked = None  # the structure of the last call's walk, None when the last call's reader read it
        self.reader = None

    def __call__(self, tree) -> tuple | None:
        """(structure, arrays) of `tree`, or None where it has no key part."""
        reader = self.reader
        if reader is not None:
            got = reader(tree)
            if got is not None:
                self.walked = None
                return got
        got = walk(tree)
        if got is not None:
            structure = got[0]
            if structure == self.walked and len(structure) <= READER_MAX_NODES:
                self.reader = compile_reader(structure)
            self.walked = structure
        return got


def compile_reader(structure: tuple):
    """tree -> (structure, arrays) of a tree of this structure (as `walk` finds them), or None for any other."""
    lines, names = [], iter(f"t{i}" for i in range(len(structure)))
    keys = []  # the dicts' keys tuples (a one-key dict's key), bound as k0, k1, ... (not written as literals)
    leaves, kinds = [], []
    root = next(names)
    pending = [root]  # the names of the nodes still to read, the next last: a node's children before its siblings
    for node in structure:
        name = pending.pop()
        if node is None:
            lines.append(f"if {name} is not None: return None")
        elif type(node) is tuple:  # a container: (class, keys or length)
            cls, shape = node
            children = [next(names) for _ in range(len(shape) if cls is dict else shape)]
            if cls is dict and len(shape) == 1:  # (a weight in blocks, {kind: blocks}: a lookup is cheaper)
                lines.append(f"if type({name}) is not dict or len({name}) != 1: return None")
                lines.append(f"{children[0]} = {name}[k{len(keys)}]")  # (KeyError: another key)
                keys.append(shape[0])
            else:
                if cls is dict:
                    lines.append(f"if type({name}) is not dict or tuple({name}) != k{len(keys)}: return None")
                    keys.append(shape)
                else:
                    lines.append(f"if type({name}) is not {cls.__name__} or len({name}) != {shape}: return None")
                if children:
                    lines.append(f"{''.join(c + ', ' for c in children)}= {name}{'.values()' * (cls is dict)}")
            pending += reversed(children)
        else:  # a leaf array
            leaves.append(name)
            kinds.append(node)
    leaf_tuple = f"({', '.join(leaves)}{',' if leaves else ''})"
    lines += [f"leaves = {leaf_tuple}", "if tuple(map(type, leaves)) != kinds: return None",
              "return structure, leaves"]
    source = (f"def make({', '.join(['structure', 'kinds'] + [f'k{i}' for i in range(len(keys))])}):\n"
              f"    def read({root}):\n        try:\n" + "".join(f"            {line}\n" for line in lines) +
              "        except KeyError:\n            return None\n    return read\n")
    scope: dict = {}
    exec(source, scope)
    return scope["make"](structure, tuple(kinds), *keys)
