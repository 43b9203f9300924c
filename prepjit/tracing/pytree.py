"""Pytrees: flatten nested list/tuple/dict containers into leaves and a structure, and back."""
from __future__ import annotations

from typing import Any, Callable

import attrs

from ..errors import TraceError

MAX_DEPTH = 100  # containers nested deeper than this are refused (walks over a treedef recurse per level)


@attrs.frozen
class TreeDef:
    """The structure of a pytree: kind ("leaf", "list", "tuple", "dict", "none"), keys, children."""

    kind: str
    keys: tuple = ()
    children: tuple = ()

    def unflatten(self, leaves) -> Any:
        it = iter(leaves)
        return self._build(it)

    def _build(self, it):
        if self.kind == "leaf":
            return next(it)
        if self.kind == "none":
            return None
        items = [c._build(it) for c in self.children]
        if self.kind == "dict":
            return dict(zip(self.keys, items))
        return list(items) if self.kind == "list" else tuple(items)

    @property
    def num_leaves(self) -> int:
        return 1 if self.kind == "leaf" else sum(c.num_leaves for c in self.children)

    def describe(self) -> str:
        if self.kind == "leaf":
            return "*"
        if self.kind == "none":
            return "None"
        inner = ", ".join(f"{k!r}: {c.describe()}" if self.kind == "dict" else c.describe()
                          for k, c in zip(self.keys or [None] * len(self.children), self.children))
        return {"list": f"[{inner}]", "tuple": f"({inner})", "dict": f"{{{inner}}}"}[self.kind]


def flatten(tree, is_leaf: Callable[[Any], bool] = lambda x: False, path: str = "",
            error: type[Exception] = TraceError) -> tuple[list, list, TreeDef]:
    """(leaves, leaf paths like "x[0]['w']", treedef). Dict keys are kept in insertion order.

    A tree nested deeper than MAX_DEPTH raises `error` (a SignatureError for arguments)."""
    leaves: list = []
    paths: list = []
    treedef = _flatten(tree, is_leaf, path, leaves, paths, error, 0)
    return leaves, paths, treedef


def _flatten(tree, is_leaf, path, leaves, paths, error, depth) -> TreeDef:
    if tree is None:
        return TreeDef("none")
    if not is_leaf(tree) and (isinstance(tree, dict) or type(tree) in (list, tuple)):
        if depth == MAX_DEPTH:
            where = path.split("[")[0] or "the result"
            raise error(f"{where} nests containers more than {MAX_DEPTH} levels deep ({path[:40]}...); "
                        "flatten the structure (or pass an array)")
        if isinstance(tree, dict):
            keys = tuple(tree.keys())
            return TreeDef("dict", keys, tuple(_flatten(tree[k], is_leaf, f"{path}[{k!r}]", leaves, paths, error,
                                                        depth + 1) for k in keys))
        kind = "list" if isinstance(tree, list) else "tuple"
        return TreeDef(kind, (), tuple(_flatten(v, is_leaf, f"{path}[{i}]", leaves, paths, error, depth + 1)
                                       for i, v in enumerate(tree)))
    leaves.append(tree)
    paths.append(path)
    return TreeDef("leaf")
