"""The framework registry: which backend runs a call, by the kind of arrays it was given.

Each backend lives in its own module (_numpy_backend, _torch_backend, _jax_backend) and is
imported only when a call needs it, so importing linseq never imports torch or jax. A backend
module imports neither this registry nor the public functions (api, linseq.torch,
linseq.jax), which import this registry: the imports stay one-way.

A backend has run(spec, arrays, cu_seqlens, opts) -> the op's outputs, kda_decode(arrays,
state, state_rows, opts, inplace) -> (o, state), cast(value, like) and silu(value) (the
gate activation the framework applies where a kernel does not, as in state_space_v2).
"""

import functools

from ._arrays import framework_of


def _numpy():
    from ._numpy_backend import NumpyBackend
    return NumpyBackend


def _torch():
    from ._torch_backend import TorchBackend
    return TorchBackend


def _jax():
    from ._jax_backend import JaxBackend
    return JaxBackend


# framework name -> its backend's loader: adding a framework is one line here and its module
_LOADERS = {"numpy": _numpy, "torch": _torch, "jax": _jax}
_LOADED = {}


def backend_for(values, forced=None):
    """The backend of the framework `forced` names, or of the arrays among `values`."""
    name = forced or framework_of(values)
    backend = _LOADED.get(name)
    if backend is None:
        backend = _LOADED[name] = _LOADERS.get(name, _numpy)()
    return backend


def bind_framework(framework, fn):
    """A public function of api with every call sent to one framework's backend
    (linseq.torch.chunk_kda, linseq.jax.chunk_kda, ...)."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        return fn(*args, _framework=framework, **kwargs)
    return call
