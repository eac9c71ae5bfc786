"""JAX front end: the public functions bound to JAX, as jax.custom_vjp over the C forward and
backward.

Each function is linseq's (api) with every call sent to the JAX backend (_jax_backend): the
kernels run as XLA FFI custom calls under jax.jit, jax.grad / jax.vjp and jax.vmap on the CPU
(jax.pure_callback where the handler library is missing; calls() says which path runs). `run`
is the one generic entry the others are written over: any op of the library's table by name,
its arrays by the table's names, its options as keywords.
"""

from . import api
from ._backends import bind_framework
from ._jax_backend import cached_functions, calls

__all__ = ["run", "kda", "kernel_delta_attention", "kda_decay", "chunk_kda",
           "fused_recurrent_kda", "kda_decode", "state_space_v1", "state_space_v2", "causal_conv1d",
           "calls", "cached_functions"]

run = bind_framework("jax", api.run)
kda = bind_framework("jax", api.kda)
kernel_delta_attention = bind_framework("jax", api.kernel_delta_attention)
kda_decay = bind_framework("jax", api.kda_decay)
chunk_kda = bind_framework("jax", api.chunk_kda)
fused_recurrent_kda = bind_framework("jax", api.fused_recurrent_kda)
kda_decode = bind_framework("jax", api.kda_decode)
state_space_v1 = bind_framework("jax", api.state_space_v1)
state_space_v2 = bind_framework("jax", api.state_space_v2)
causal_conv1d = bind_framework("jax", api.causal_conv1d)
