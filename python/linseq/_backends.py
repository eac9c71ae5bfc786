"""The framework registry: which backend runs a call, by the kind of arrays it was given.

Each backend lives in its own module (NumPy in _numpy, PyTorch in linseq.torch, JAX in
linseq.jax) and is imported only when a call needs it, so importing linseq never imports
torch or jax. The backends and the public functions of api meet here, never in each other's
private names.
"""

import functools
import importlib

from ._arrays import framework_of

# framework name -> (module, class): adding a framework is one line here and its module.
_BACKENDS = {
    "numpy": ("linseq._numpy", "NumpyBackend"),
    "torch": ("linseq.torch", "TorchBackend"),
    "jax": ("linseq.jax", "JaxBackend"),
}


def backend_for(values, forced=None):
    """The backend of the framework `forced` names, or of the arrays among `values`."""
    module, cls = _BACKENDS.get(forced or framework_of(values), _BACKENDS["numpy"])
    return getattr(importlib.import_module(module), cls)


def bind_framework(framework, fn):
    """A public function of api with every call sent to one framework's backend
    (linseq.torch.chunk_kda, linseq.jax.chunk_kda, ...)."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        return fn(*args, _framework=framework, **kwargs)
    return call
