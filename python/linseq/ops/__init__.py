"""The kernels on NumPy arrays, forward and backward, with every option of the C API.

These are what the framework front ends (linseq.torch, linseq.jax and the seed-style
functions in linseq.api) call. Inputs may be any array (see _arrays); outputs are new
float32 NumPy arrays (KDA's o is bfloat16 where KdaInputs keeps bfloat16 storage). Every
shape is checked against the sizes the first array fixes before a pointer reaches the
library.

Modes: "chunked" (the default for KDA) or "recurrent"; chunk_size 16, 32, 64 or 128;
threads 0 = the library's default thread count.

Scalar options are honoured as given or refused, never reinterpreted: `scale` None means
K^-0.5, otherwise it must stay finite and non-zero in float32 (0.0 or 1e-50 is refused, not
read as the default); `lower_bound` None means the default gate, otherwise it must stay
finite and negative in float32 (0.0 or -1e-50 is refused, not read as the default gate).

One module per op (kda, kda_gate, ssm1, conv1d) and what they share (_common); the names
below are the package's, as before it was split. run and decode (table) reach every op of
the library's table by its name, a new op included, from the table alone.
"""

from .._arrays import (as_bf16, as_c_int, as_cu_seqlens, as_f32, as_f32_ndim,
                       as_f32_strided, as_row_indices, is_bf16, ptr)
from ._common import (ACTIVATIONS, DTYPE_BF16, DTYPE_F32, PRODUCTS_BF16, PRODUCTS_F32,
                      activation_code, forward_train, lower_bound_option, make_exec,
                      saved_bytes, scale_option)
from .conv1d import Conv1dInputs, conv1d_backward, conv1d_decode, conv1d_forward
from .kda import (KdaInputs, check_decode, kda_backward, kda_bf16_storage, kda_decode,
                  kda_forward, kda_forward_train)
from .kda_gate import GateInputs, kda_gate_backward, kda_gate_forward
from .ssm1 import (Ssm1Inputs, ssm1_backward, ssm1_decode, ssm1_forward,
                   ssm1_forward_train)
from .table import (TableInputs, backward, decode, decode_pool, decode_tokens_pool, forward_pool,
                    forward_pool_blocks, run, shapes_of)
from .table import backward_of as table_backward
from .table import forward_of as table_forward

__all__ = ["run", "decode", "decode_pool", "decode_tokens_pool", "forward_pool",
           "forward_pool_blocks", "TableInputs", "shapes_of", "table_forward", "table_backward",
           "make_exec", "scale_option", "lower_bound_option", "activation_code", "ACTIVATIONS",
           "DTYPE_F32", "DTYPE_BF16", "PRODUCTS_F32", "PRODUCTS_BF16", "forward_train",
           "saved_bytes",
           "KdaInputs", "kda_bf16_storage", "kda_forward", "kda_forward_train", "kda_backward",
           "kda_decode", "check_decode",
           "GateInputs", "kda_gate_forward", "kda_gate_backward",
           "Ssm1Inputs", "ssm1_forward", "ssm1_forward_train", "ssm1_backward", "ssm1_decode",
           "Conv1dInputs", "conv1d_forward", "conv1d_backward", "conv1d_decode",
           # the array conversions the front ends use through ops (from linseq._arrays)
           "as_f32", "as_f32_ndim", "as_f32_strided", "as_bf16", "is_bf16", "as_c_int",
           "as_cu_seqlens", "as_row_indices", "ptr"]
