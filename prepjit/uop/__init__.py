"""The IR: UOp nodes, ops, dtypes, pattern rewriting and symbolic integer algebra."""
from .dtypes import DType, dtypes, promote, to_dtype
from .ops import Ops
from .rewrite import PatternMatcher, UPat, graph_rewrite
from .symbolic import provably_lt, simplify
from .var import BoundVar, Var
from .uop import UOp, as_int_if_const, as_uop, eval_uop, render_python, sint, sym_prod

__all__ = ["DType", "dtypes", "promote", "to_dtype", "Ops", "PatternMatcher", "UPat", "graph_rewrite",
           "provably_lt", "simplify", "UOp", "as_int_if_const", "as_uop", "eval_uop", "render_python", "sint",
           "sym_prod", "Var", "BoundVar"]
