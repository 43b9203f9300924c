"""prepjit: trace NumPy-style functions once, replay prepared kernels with new shapes."""
from . import lax
from . import quant
from . import random
from .transforms.autodiff import grad, value_and_grad, vjp
from .transforms.vmap import vmap
from .errors import (CompileError, DeletedArrayError, DeviceError, IndexBoundError, PlanFileError, PrepjitError,
                     SignatureError, TraceError, VarBoundError, VarError)
from .jit.function import PreparedFunction
from .jit.prepare import prepare, profile, trace
from .distributed.multi_device import MultiDeviceFunction
from .runtime.collectives_job import init_distributed
from .tracing.collectives import all_gather, device_index, pmean, psum
from .jit.profiler import Profile
from .runtime.array import Array
from .runtime.cache import CachedKernel
from .runtime.plan import ExecutionPlan, PreparedKernel
from .runtime.var_table import RuntimeVar
from .jit.loaded import load
from .tracing.control import cond, scan, switch
from .tracing.loop import fori_loop, while_loop
from .tracing.precision import default_matmul_precision
from .uop.var import BoundVar, Var

__all__ = ["CompileError", "DeletedArrayError", "DeviceError", "IndexBoundError", "PlanFileError", "PrepjitError",
           "SignatureError", "TraceError", "VarBoundError", "VarError", "PreparedFunction", "prepare", "trace", "load",
           "Profile", "profile", "Array", "CachedKernel", "ExecutionPlan", "PreparedKernel", "RuntimeVar", "fori_loop",
           "while_loop", "cond", "switch", "scan", "vmap", "BoundVar", "Var", "random", "quant", "lax", "grad",
           "value_and_grad", "vjp", "MultiDeviceFunction", "init_distributed", "psum", "pmean", "all_gather",
           "device_index", "default_matmul_precision"]
__version__ = "0.1.0"
