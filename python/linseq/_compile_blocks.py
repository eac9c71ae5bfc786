"""torch.compile over linseq's public functions that take arrays of any framework, without
importing torch.

Under torch.compile, Dynamo cannot trace linseq's Python (the checks build ctypes structs, the
backend is picked by the arrays' type): a public function runs instead as a non-strict traced
block (torch.compiler.nonstrict_trace), inside which linseq's custom ops are what lands in the
graph, so there is no graph break. A function that takes arrays of any framework
(linseq.chunk_kda, linseq.compat.fla's) cannot become a block when it is defined, since
importing linseq must not import torch: `compilable` registers it, and its block is made once
torch is there: when the function is defined after torch is imported, at its first call, or
when linseq.torch is imported (bind_torch), whichever comes first. (Compiled before any of
these, the function is traced by Dynamo itself, which breaks the graph.)
"""

import functools
import sys

# "module.qualname" -> the function as written; the same -> its non-strict traced block
_ENTRIES, _BLOCKS = {}, {}


def nonstrict_trace(torch):
    """torch's nonstrict_trace where it has one and linseq has custom ops there
    (torch.library.custom_op, PyTorch 2.4 and later), else None."""
    trace = (getattr(getattr(torch, "compiler", None), "nonstrict_trace", None)
             or getattr(getattr(torch, "_dynamo", None), "nonstrict_trace", None))
    return trace if trace is not None and hasattr(torch.library, "custom_op") else None


def bind_torch(torch):
    """Makes the blocks of every function registered so far."""
    trace = nonstrict_trace(torch)
    if trace is not None:
        _BLOCKS.update({key: trace(fn) for key, fn in _ENTRIES.items() if key not in _BLOCKS})


def compilable(fn):
    """fn, which under torch.compile runs as a non-strict traced block (see the module)."""
    key = f"{fn.__module__}.{fn.__qualname__}"
    _ENTRIES[key] = fn

    @functools.wraps(fn)
    def entry(*args, **kwargs):
        block = _BLOCKS.get(key)
        if block is None:
            if "torch" in sys.modules:
                bind_torch(sys.modules["torch"])
            block = _BLOCKS.get(key, fn)
        return block(*args, **kwargs)

    if "torch" in sys.modules:
        bind_torch(sys.modules["torch"])
    return entry
