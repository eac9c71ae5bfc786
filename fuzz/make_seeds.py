#!/usr/bin/env python3
"""Writes the hand-made seeds of the fuzz corpus: fuzz/corpus/TARGET/seed-*.

    python3 fuzz/make_seeds.py [REFDATA]

Seeds are inputs that decode to valid problems of every family and option the targets know
(so fuzzing starts deep in the library instead of at the first size check), and .npy files
and case folders of the kinds the reference data holds. With REFDATA (the reference-case
folder: the generated one, `python3 tests/refgen/gen.py build/refcases`, or another set with
the same case names) two small reference cases are added to the case corpus as they are. The encoders
below mirror the decoders of fuzz_kda.c, fuzz_ssm1.c, fuzz_conv1d.c, fuzz_case.c and
fuzz_state_pool.c; the seeds the fuzzer found itself (regress-* and the merged ones) are not
written here.
"""
import json
import os
import re
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def size(v):
    """fz_size: a size v in 1 .. cap is the byte v - 1 (cap above v)."""
    assert 1 <= v <= 243
    return bytes([v - 1])


def exec_bytes(mode=0, chunk=0, threads=0):
    """fz_exec: mode pick(17), chunk index pick(12) into {0,16,32,64,128,...}, threads pick(8)."""
    chunks = {0: 0, 16: 1, 32: 2, 64: 3, 128: 4}
    return bytes([mode, chunks[chunk], {0: 0, 1: 1, 2: 2}[threads]])


def kda_main(B, T, H, K, V, decay, l2=True, logit=False, vfirst=False, gate=False, h0=True,
             alog=False, bias=False, varlen=None, ht=1, scale_i=0, bound_i=0, mode=0, chunk=0,
             threads=0, check_threads=True, d_ht=True, train=1, mask=0x3f, hv_kind=3):
    f1 = (l2 | logit << 1 | vfirst << 2 | gate << 3 | h0 << 4 | (varlen is not None) << 5 |
          alog << 6 | bias << 7)
    f2 = 0x11 | (varlen is not None) << 7  # not weird
    f3 = ht & 3
    f4 = check_threads | d_ht << 1 | train << 2
    out = bytes([0]) + size(B) + bytes([1]) + size(T) + size(H) + bytes([hv_kind])
    out += bytes([1]) + size(K) + bytes([1]) + size(V) + bytes([decay])
    out += bytes([f1, f2, f3, scale_i, bound_i]) + exec_bytes(mode, chunk, threads)
    out += bytes([f4, mask])
    if varlen is not None:
        n, cuts = varlen  # n sequences, the n - 1 inner offsets
        out += bytes([1]) + size(n) + bytes([0])
        for c in cuts:
            out += struct.pack('<I', c)
        out += bytes([0])
    return out


def kda_decode(B, H, K, V, decay, n_rows, rows=None, vfirst=False, gate=False):
    f1 = 1 | vfirst << 2 | gate << 3 | (1 if rows else 0) << 6
    out = bytes([2]) + size(B) + bytes([1]) + size(H) + bytes([0, 1]) + size(K) + bytes([1])
    out += size(V) + bytes([decay, f1, 0x41]) + exec_bytes() + size(n_rows)
    for r in rows or []:
        out += bytes([12, 0]) if r < 0 else bytes([0, r])  # padding (-1), or row r
    return out


def kda_gate(B, T, H, K, per_channel=True, bound_i=0):
    f = 1 | bound_i << 2 | 1 << 5 | 1 << 6 | 1 << 7
    return (bytes([3]) + size(B) + size(T) + size(H) + size(K) +
            bytes([1 if per_channel else 0, f, 7]) + exec_bytes())


def ssm1(B, T, D, N, G=0, skip=True, gate=True, h0=True, softplus=False, bias=False,
         act=0, hT=1, varlen=None, threads=0):
    gk = 0 if G == 0 else 1
    f1 = skip | gate << 1 | h0 << 2 | softplus << 3 | bias << 4 | (3 if varlen else 0) << 5
    f2 = 1 | 1 << 5 | softplus << 6  # d_hT, check threads, ddt_bias with softplus
    f3 = hT & 3
    out = size(B) + bytes([1]) + size(T) + bytes([1]) + size(D) + size(N) + bytes([gk])
    if gk:
        out += bytes([G - 1])
    out += bytes([f1, f2, f3, act, 0xff]) + exec_bytes(threads=threads)
    if varlen:
        n, cuts = varlen
        out += bytes([1]) + size(n) + bytes([0])
        for c in cuts:
            out += struct.pack('<I', c)
        out += bytes([0])
    return out


def conv1d(B, T, D, W, bias=True, state=True, act=0, out_kind=1, varlen=None, big_d=False):
    f1 = bias | state << 1 | (3 if varlen else 0) << 2 | 1 << 4 | out_kind << 6
    f2 = 1 << 6 | 1 << 7  # check threads, d_conv_state_out
    out = size(B) + bytes([1]) + size(T)
    if big_d:
        out += bytes([7, D - 500])
    else:
        out += bytes([4]) + size(D)
    out += bytes([1]) + size(W) + bytes([f1, f2, act, 0x0f]) + exec_bytes()
    if varlen:
        n, cuts = varlen
        out += bytes([1]) + size(n) + bytes([0])
        for c in cuts:
            out += struct.pack('<I', c)
        out += bytes([0])
    return out


def table_ops():
    """The op table's order (src/optable/optable.c's all_ops): fuzz_state_pool picks an op by
    its index there."""
    with open(os.path.join(HERE, '..', 'src', 'optable', 'optable.c')) as f:
        text = f.read()
    body = text[text.index('all_ops[] = {'):]
    return re.findall(r'&ls_op_(\w+)', body[:body.index('};')])


# fuzz_state_pool's sizes per op, in the table's order: (name, required)
POOL_SIZES = {
    'kda': [('B', 1), ('T', 1), ('H', 1), ('HV', 0), ('K', 1), ('V', 1)],
    'ssm1': [('B', 1), ('T', 1), ('D', 1), ('N', 1), ('G', 0)],
    'ema': [('B', 1), ('T', 1), ('D', 1)],
    'ssd': [('B', 1), ('T', 1), ('H', 1), ('P', 1), ('N', 1), ('G', 0)],
}
POOL_VARLEN = ('kda', 'ssm1', 'ssd')


# fz_size's special values (fuzz_util.c) and fuzz_state_pool's huge ones
FZ_SPECIAL = [0, -1, -2**63, 2**63 - 1, 2**62, -2**40, 2**61, 2**32 + 1, 2**62 - 1, 0, 2, 3]
POOL_HUGE = [2**40, 2**62 - 1, 2**63 - 1, 2**32 + 1]


def pool_size(v, required):
    """pick_size: small values by index, 0 for an optional size's default, anything else
    through fz_size's special values."""
    small = [1, 2, 3, 4, 5, 8]
    if v in small:
        return bytes([small.index(v) + (0 if required else 160)])
    if v == 0 and not required:
        return bytes([0])
    return bytes([250, 244 + FZ_SPECIAL.index(v)])


def pool_index_list(rows):
    """make_indices: None (NULL), else each entry a row r >= 0, -1 (padding) or 'pad'."""
    if rows is None:
        return bytes([0])
    out = bytes([1])
    for r in rows:
        out += bytes([11]) if r == 'pad' else bytes([9]) if r < 0 else bytes([0, r])
    return out


def state_pool(op, sizes, prefill=False, T=1, varlen=None, mode=0, chunk=0, n_rows=None,
               stride_extra=None, dtype=0, bits=0, pad=None, src=None, dst=None,
               has_initial=None):
    """fuzz_state_pool: sizes {name: value}; stride_extra None (row_stride 0) or 0 (the state's
    size) or k (k more); dtype 0 f32, 1 bf16, 2 f16; bits 0, 32, 64 or 16 (refused); pad None
    or the pad value (a row)."""
    out = bytes([table_ops().index(op), prefill])
    for name, required in POOL_SIZES[op]:
        out += pool_size(sizes.get(name, 1 if required else 0), required)
    if prefill:
        out += bytes([T - 1])
    out += bytes([0])  # the benchmark's options
    if prefill and op in POOL_VARLEN and T <= 64:
        if varlen:
            n, cuts = varlen
            out += bytes([0, n - 1]) + b''.join(struct.pack('<I', c) for c in cuts) + bytes([0])
        else:
            out += bytes([1])
    out += bytes([mode, [0, 16, 32, 64, 128].index(chunk)]) + bytes(4)
    out += bytes([14, POOL_HUGE.index(n_rows)]) if n_rows in POOL_HUGE else bytes([0, n_rows - 1])
    out += bytes([0]) if stride_extra is None else bytes([3]) if stride_extra == 0 else \
        bytes([4, stride_extra - 1])
    out += bytes([dtype, {0: 0, 64: 1, 32: 2, 16: 6}[bits], pad is not None])
    out += bytes([0, pad if pad is not None else 0])
    out += pool_index_list(src) + pool_index_list(dst)
    if prefill:
        out += bytes([0]) if has_initial is None else bytes([1] + list(has_initial))
    return out + bytes([0])  # aligned


def npy(descr, shape, data, major=1, fortran=False):
    dims = ', '.join(str(d) for d in shape) + (',' if len(shape) == 1 else '')
    head = "{'descr': '%s', 'fortran_order': %s, 'shape': (%s), }" % (
        descr, 'True' if fortran else 'False', dims)
    pre = 10 if major == 1 else 12
    pad = (64 - (pre + len(head) + 1) % 64) % 64
    head = head + ' ' * pad + '\n'
    if major == 1:
        return b'\x93NUMPY\x01\x00' + struct.pack('<H', len(head)) + head.encode() + data
    return b'\x93NUMPY' + bytes([major, 0]) + struct.pack('<I', len(head)) + head.encode() + data


def f32(values):
    return struct.pack('<%df' % len(values), *values)


def case_files():
    """fuzz_case.c's record names, in tag order: the fixed list of case_files.h (the names the
    op table adds after it get their tags at run time; no seed here uses one)."""
    with open(os.path.join(HERE, 'case_files.h')) as f:
        text = f.read()
    body = text[text.index('fz_case_legacy_files[] = {'):text.index('};')]
    return re.findall(r'"([^"]+)"', body)


CASE_FILES = case_files()


def record(name, payload, synth=False):
    tag = CASE_FILES.index(name) | (0x80 if synth else 0)
    return bytes([tag]) + struct.pack('<H', len(payload)) + payload


def shape_rec(name, *dims, i64=False):
    return record(name, bytes([1 if i64 else 0, len(dims)] + list(dims)), synth=True)


def case(meta, *recs, opts=0x31):
    return bytes([opts]) + record('meta.json', json.dumps(meta).encode()) + b''.join(recs)


def write(target, name, data):
    d = os.path.join(HERE, 'corpus', target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, 'seed-' + name), 'wb') as f:
        f.write(data)


def main():
    # KDA: both decays and none, GVA, l2norm off, V-first states, the in-kernel gate with
    # and without the lower bound, varlen with an empty sequence, recurrent and chunked
    # modes with every chunk size, in place and not, T across chunk boundaries, and the
    # column split of one long sequence over threads (V > 32).
    write('kda', 'pc-chunk64', kda_main(2, 70, 2, 16, 8, 2, mode=2, chunk=64))
    write('kda', 'ph-recurrent', kda_main(1, 33, 1, 8, 8, 1, mode=1, chunk=16, l2=False))
    write('kda', 'none-gva', kda_main(2, 17, 2, 8, 12, 0, hv_kind=4, logit=True, train=0))
    write('kda', 'gate-lb', kda_main(1, 40, 1, 12, 12, 2, gate=True, alog=True, bias=True,
                                     bound_i=1, mode=2, chunk=16, vfirst=True, ht=2))
    write('kda', 'gate-ph', kda_main(2, 9, 2, 8, 8, 1, gate=True, alog=True, bias=True,
                                     mode=1, chunk=32, mask=0xff))
    write('kda', 'varlen', kda_main(1, 50, 2, 8, 16, 2, varlen=(3, [0, 20]), mode=2,
                                    chunk=32, train=6))
    write('kda', 'split-v48', kda_main(1, 140, 1, 8, 48, 2, mode=2, chunk=128, threads=2,
                                       train=1))
    write('kda', 'split-recurrent', kda_main(1, 66, 1, 8, 40, 1, mode=1, threads=2, ht=2))
    write('kda', 'saved-corrupt', kda_main(1, 20, 1, 8, 8, 2, mode=2, chunk=16, train=3))
    write('kda', 'decode', kda_decode(4, 2, 8, 8, 2, 6, rows=[3, -1, 0, 5]))
    write('kda', 'decode-vfirst', kda_decode(3, 1, 16, 40, 1, 3, vfirst=True))
    write('kda', 'gate-pc', kda_gate(2, 5, 3, 8, per_channel=True))
    write('kda', 'gate-ph-lb', kda_gate(1, 9, 4, 1, per_channel=False, bound_i=1))

    # SSM1: groups, gate activations, softplus with a bias, varlen, D across 64-lane blocks,
    # T across the backward's 64-token segments.
    write('ssm1', 'gate-h0', ssm1(2, 9, 8, 4))
    write('ssm1', 'groups-softplus', ssm1(1, 70, 12, 5, G=3, softplus=True, bias=True, act=4))
    write('ssm1', 'lanes-inplace', ssm1(1, 130, 70, 3, skip=False, gate=False, hT=2, threads=2))
    write('ssm1', 'varlen', ssm1(1, 30, 6, 4, varlen=(3, [10, 10]), act=5))

    # conv1d: W = 1, W > T + 1, no bias or state, in place, varlen, D beyond one span.
    write('conv1d', 'silu-state', conv1d(2, 9, 8, 4, act=2))
    write('conv1d', 'w1', conv1d(1, 5, 3, 1, act=1))
    write('conv1d', 'short-t', conv1d(2, 2, 6, 6, bias=False, out_kind=2))
    write('conv1d', 'varlen', conv1d(1, 70, 5, 4, varlen=(2, [40]), act=4))
    write('conv1d', 'wide-d', conv1d(1, 3, 530, 3, act=3, big_d=True))

    # state pools: every op with a decode step, both calls, each pool type and index width,
    # rows apart, destinations apart from the sources, padding by a negative row and by the
    # pad value, packed sequences, a sequence without an initial state; and refusals (two
    # requests writing one row, 16-bit indices) that must leave the pool as it was.
    write('state_pool', 'kda-decode-bf16', state_pool(
        'kda', {'B': 3, 'H': 2, 'K': 8, 'V': 4}, n_rows=6, stride_extra=3, dtype=1, bits=32,
        src=[3, -1, 0], dst=[5, 0, 1]))
    write('state_pool', 'kda-decode-inplace', state_pool(
        'kda', {'B': 4, 'H': 1, 'HV': 2, 'K': 4, 'V': 8}, n_rows=5, bits=64, src=[4, 0, 2, 1]))
    write('state_pool', 'kda-prefill-varlen', state_pool(
        'kda', {'H': 1, 'K': 8, 'V': 8}, prefill=True, T=20, varlen=(3, [5, 12]), mode=2,
        chunk=16, n_rows=5, dtype=2, bits=32, src=[4, -1, 1], dst=[0, 0, 3],
        has_initial=[1, 0, 1]))
    write('state_pool', 'ssm1-decode-pad', state_pool(
        'ssm1', {'B': 3, 'D': 5, 'N': 4}, n_rows=4, stride_extra=1, dtype=2, pad=1,
        src=[0, 2, 'pad'], dst=[1, 3, 0]))
    write('state_pool', 'ssm1-prefill', state_pool(
        'ssm1', {'B': 2, 'D': 8, 'N': 3}, prefill=True, T=9, n_rows=3, dtype=1,
        src=[2, 0], has_initial=[0, 1]))
    write('state_pool', 'ema-decode', state_pool(
        'ema', {'B': 5, 'D': 8}, n_rows=8, stride_extra=2, bits=32, src=[7, 1, -1, 3, 0]))
    write('state_pool', 'ema-prefill-f16', state_pool(
        'ema', {'B': 3, 'D': 4}, prefill=True, T=7, n_rows=6, stride_extra=0, dtype=2,
        src=[4, 1, -1], dst=[2, 5, 0], has_initial=[1, 0, 1]))
    write('state_pool', 'ssd-decode', state_pool(
        'ssd', {'B': 3, 'H': 2, 'P': 4, 'N': 4}, n_rows=5, bits=64, src=[1, 3, 4],
        dst=[0, 1, 2]))
    write('state_pool', 'ssd-prefill-varlen', state_pool(
        'ssd', {'H': 2, 'P': 4, 'N': 2}, prefill=True, T=24, varlen=(2, [10]), mode=2,
        chunk=16, n_rows=4, stride_extra=5, dtype=1, src=[3, 0]))
    write('state_pool', 'refuse-same-dst', state_pool(
        'kda', {'B': 2, 'H': 1, 'K': 4, 'V': 4}, n_rows=3, src=[0, 1], dst=[2, 2]))
    write('state_pool', 'refuse-index-bits', state_pool(
        'ema', {'B': 2, 'D': 3}, n_rows=2, dtype=1, bits=16, src=[1, 0]))
    # the sizes fuzz_state_pool found mishandled (tests/test_state_pool.c): a span past int64,
    # B past the index work, a negative size in a gathered decode and in a prefill, and
    # inputs that overflow with a B the pool layer allocated for
    write('state_pool', 'regress-span', state_pool('ema', {'D': 8}, n_rows=2**63 - 1))
    write('state_pool', 'regress-index-count', state_pool('ema', {'B': 2**61}, n_rows=1))
    write('state_pool', 'regress-negative-decode', state_pool(
        'ema', {'B': 2, 'D': -1}, n_rows=2, stride_extra=2))
    write('state_pool', 'regress-negative-prefill', state_pool(
        'ssd', {'H': 2, 'P': -1, 'N': 2}, prefill=True, T=5, n_rows=2))
    write('state_pool', 'regress-inputs-overflow', state_pool(
        'ema', {'B': 2**32 + 1, 'D': 2**32 + 1}, n_rows=4, stride_extra=0))

    # .npy: every version and dtype the reader takes, and the shapes it must handle.
    write('npy', 'f4-2x3', npy('<f4', (2, 3), f32([0.5, -1, 2, 3.25, -0.0, 1e-3])))
    write('npy', 'f4-scalar', npy('<f4', (), f32([1.5])))
    write('npy', 'f4-empty', npy('<f4', (0, 3), b''))
    write('npy', 'i8-cu', npy('<i8', (4,), struct.pack('<4q', 0, 17, 64, 130)))
    write('npy', 'v2', npy('<f4', (3,), f32([1, 2, 3]), major=2))
    write('npy', 'v3-fortran-1d', npy('<f4', (2,), f32([1, 2]), major=3, fortran=True))
    write('npy', 'f4-4d', npy('<f4', (1, 2, 1, 2), f32([1, 2, 3, 4])))

    # cases: small folders of the ops and options written here, from .npy files made by the
    # target (synth records), plus one with its files given byte for byte. A new op needs
    # none: the target reaches every op of the table by its index (fuzz_case.c, table_case.h),
    # which tests/test_op_coverage.c checks.
    conv_meta = {'op': 'causal_conv1d', 'B': 1, 'T': 3, 'D': 2, 'W': 4, 'activation': 'silu',
                 'has_bias': True, 'has_state': True,
                 'inputs': ['x', 'weight', 'bias', 'conv_state'], 'upstream_grads': ['d_y'],
                 'outputs': ['y', 'conv_state_out'],
                 'grads': ['dx', 'dweight', 'dbias', 'dconv_state']}
    write('case', 'conv', case(conv_meta, shape_rec('x', 1, 3, 2), shape_rec('weight', 2, 4),
                               shape_rec('bias', 2), shape_rec('conv_state', 1, 2, 3),
                               shape_rec('d_y', 1, 3, 2)))
    write('case', 'conv-dstate', case(
        dict(conv_meta, upstream_grads=['d_y', 'd_conv_state_out']), shape_rec('x', 1, 3, 2),
        shape_rec('weight', 2, 4), shape_rec('bias', 2), shape_rec('conv_state', 1, 2, 3),
        shape_rec('d_y', 1, 3, 2), shape_rec('d_conv_state_out', 1, 2, 3)))
    conv_raw = dict(conv_meta, inputs=['x', 'weight'], grads=['dx', 'dweight'],
                    has_bias=False, has_state=False, activation=None)
    write('case', 'conv-raw', case(conv_raw, record('x', npy('<f4', (1, 3, 2), f32(range(6)))),
                                   record('weight', npy('<f4', (2, 4), f32([0.5] * 8))),
                                   record('d_y', npy('<f4', (1, 3, 2), f32([1] * 6))),
                                   opts=0x20))
    kda_meta = {'op': 'kda', 'B': 1, 'T': 5, 'H': 2, 'K': 4, 'V': 3, 'N': 2, 'varlen': True,
                'decay': 'per_channel', 'use_qk_l2norm': True, 'scale': None, 'has_h0': True,
                'has_dht': True, 'inputs': ['q', 'k', 'v', 'beta', 'g', 'h0', 'cu_seqlens'],
                'upstream_grads': ['d_o', 'd_ht'], 'outputs': ['o', 'ht'],
                'grads': ['dq', 'dk', 'dv', 'dbeta', 'dg', 'dh0']}
    write('case', 'kda-varlen', case(
        kda_meta, shape_rec('q', 1, 5, 2, 4), shape_rec('k', 1, 5, 2, 4),
        shape_rec('v', 1, 5, 2, 3), shape_rec('beta', 1, 5, 2), shape_rec('g', 1, 5, 2, 4),
        shape_rec('h0', 2, 2, 4, 3),
        record('cu_seqlens', bytes([1, 1, 3, 0, 2, 3]), synth=True),
        shape_rec('d_o', 1, 5, 2, 3), shape_rec('d_ht', 2, 2, 4, 3), opts=0x3a))
    kda_ph = {'op': 'kda', 'B': 2, 'T': 3, 'H': 1, 'HV': 2, 'K': 2, 'V': 2,
              'decay': 'per_head', 'gate_in_kernel': True, 'lower_bound': -5,
              'state_v_first': True, 'beta_is_logit': True,
              'inputs': ['q', 'k', 'v', 'beta', 'g', 'A_log', 'dt_bias'],
              'upstream_grads': ['d_o'], 'outputs': ['o', 'ht'],
              'grads': ['dq', 'dk', 'dv', 'dbeta', 'dg', 'dh0', 'dA_log', 'ddt_bias']}
    write('case', 'kda-gate-in-kernel', case(
        kda_ph, shape_rec('q', 2, 3, 1, 2), shape_rec('k', 2, 3, 1, 2),
        shape_rec('v', 2, 3, 2, 2), shape_rec('beta', 2, 3, 2), shape_rec('g', 2, 3, 2),
        shape_rec('A_log', 2), shape_rec('dt_bias', 2), shape_rec('d_o', 2, 3, 2, 2),
        opts=0x05))
    gate_meta = {'op': 'kda_gate', 'B': 1, 'T': 2, 'H': 2, 'K': 3, 'decay': 'per_channel',
                 'lower_bound': -5.0, 'inputs': ['g_raw', 'A_log', 'dt_bias'],
                 'upstream_grads': ['d_g'], 'outputs': ['g'],
                 'grads': ['dg_raw', 'dA_log', 'ddt_bias']}
    write('case', 'gate', case(gate_meta, shape_rec('g_raw', 1, 2, 2, 3), shape_rec('A_log', 2),
                               shape_rec('dt_bias', 6), shape_rec('d_g', 1, 2, 2, 3)))
    ssm_meta = {'op': 'ssm1', 'B': 2, 'T': 3, 'D': 4, 'N': 2, 'G': 2, 'dt_softplus': True,
                'gate_activation': 'gelu_tanh', 'has_gate': True, 'has_h0': True,
                'inputs': ['x', 'dt', 'A', 'B', 'C', 'D', 'gate', 'h0', 'dt_bias'],
                'upstream_grads': ['d_y', 'd_hT'], 'outputs': ['y', 'hT'],
                'grads': ['dx', 'ddt', 'dA', 'dB', 'dC', 'dD', 'dgate', 'dh0', 'ddt_bias']}
    write('case', 'ssm1', case(ssm_meta, shape_rec('x', 2, 3, 4), shape_rec('dt', 2, 3, 4),
                               shape_rec('A', 4, 2), shape_rec('B', 2, 3, 2, 2),
                               shape_rec('C', 2, 3, 2, 2), shape_rec('D', 4),
                               shape_rec('gate', 2, 3, 4), shape_rec('h0', 2, 4, 2),
                               shape_rec('dt_bias', 4), shape_rec('d_y', 2, 3, 4),
                               shape_rec('d_hT', 2, 4, 2)))

    # the segment summaries: every input they take, q (KDA) and C, D and the gate (SSM1)
    # included although they do not enter, and both upstream gradients
    kseg_meta = {'op': 'kda_segment', 'B': 1, 'T': 5, 'H': 2, 'K': 4, 'V': 3,
                 'decay': 'per_channel', 'use_qk_l2norm': True,
                 'inputs': ['q', 'k', 'v', 'beta', 'g'], 'upstream_grads': ['d_P', 'd_R'],
                 'outputs': ['P', 'R'], 'grads': ['dq', 'dk', 'dv', 'dbeta', 'dg']}
    write('case', 'kda-segment', case(
        kseg_meta, shape_rec('q', 1, 5, 2, 4), shape_rec('k', 1, 5, 2, 4),
        shape_rec('v', 1, 5, 2, 3), shape_rec('beta', 1, 5, 2), shape_rec('g', 1, 5, 2, 4),
        shape_rec('d_P', 1, 2, 4, 4), shape_rec('d_R', 1, 2, 4, 3)))
    sseg_meta = {'op': 'ssm1_segment', 'B': 2, 'T': 3, 'D': 4, 'N': 2, 'G': 2,
                 'dt_softplus': True,
                 'inputs': ['x', 'dt', 'A', 'B', 'C', 'D', 'gate', 'dt_bias'],
                 'upstream_grads': ['d_P', 'd_R'], 'outputs': ['P', 'R'],
                 'grads': ['dx', 'ddt', 'dA', 'dB', 'dC', 'dD', 'dgate', 'ddt_bias']}
    write('case', 'ssm1-segment', case(
        sseg_meta, shape_rec('x', 2, 3, 4), shape_rec('dt', 2, 3, 4), shape_rec('A', 4, 2),
        shape_rec('B', 2, 3, 2, 2), shape_rec('C', 2, 3, 2, 2), shape_rec('D', 4),
        shape_rec('gate', 2, 3, 4), shape_rec('dt_bias', 4), shape_rec('d_P', 2, 4, 2),
        shape_rec('d_R', 2, 4, 2)))

    # the EMA (forward-only, a decode step): every input, no upstream gradients
    ema_meta = {'op': 'ema', 'B': 2, 'T': 3, 'D': 4, 'inputs': ['x', 'a', 'h0'],
                'upstream_grads': [], 'outputs': ['y', 'hT'], 'grads': []}
    write('case', 'ema', case(ema_meta, shape_rec('x', 2, 3, 4), shape_rec('a', 4),
                              shape_rec('h0', 2, 4)))

    # two small reference cases exactly as stored (meta.json as written by the generator);
    # both the generated set (tests/refgen) and the outside one have them under these names
    if len(sys.argv) > 1:
        for name in ['conv_B1_T2_D8_W4_none_nobias_state', 'ssm1_B2_T1_D8_N4_gate_h0']:
            folder = os.path.join(sys.argv[1], name)
            with open(os.path.join(folder, 'meta.json')) as f:
                meta = json.load(f)
            recs = [record('meta.json', json.dumps(
                {k: v for k, v in meta.items()
                 if k not in ('tolerance', 'fp32_torch_recurrent')}).encode())]
            for t in meta['inputs'] + meta['upstream_grads']:
                with open(os.path.join(folder, t + '.npy'), 'rb') as f:
                    recs.append(record(t, f.read()))
            write('case', 'ref-' + name.split('_')[0], bytes([0x21]) + b''.join(recs))


if __name__ == '__main__':
    main()
