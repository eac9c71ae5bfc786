"""The reference definitions, token by token, in float64 on the tape (docs/semantics.md).

Each op takes its inputs as tape Values (an absent optional tensor is passed as zeros, so
that its gradient "at zeros" exists too) and the case's options (meta.json), and returns
its outputs as Values. Nothing here is tuned for speed: one loop step is one token of one
sequence, with the heads or channels of that token as array axes.
"""
import numpy as np

from tape import Value, concat, einsum, exp, relu, sigmoid, softplus, sqrt, stack, tanh

L2NORM_EPS = 1e-6
GELU_C = np.sqrt(2.0 / np.pi)


def activation(name, z):
    """The activations by their meta.json names; None is the caller's default."""
    if name == 'silu':
        return z * sigmoid(z)
    if name == 'sigmoid':
        return sigmoid(z)
    if name == 'gelu_tanh':
        return 0.5 * z * (1.0 + tanh(GELU_C * (z + 0.044715 * z * z * z)))
    if name == 'relu':
        return relu(z)
    if name in ('identity', 'none'):
        return z
    raise ValueError(f'unknown activation {name!r}')


def kda_decay_from_gate(g_raw, A_log, dt_bias, lower_bound):
    """The KDA gate: A_log broadcasts over what follows the head axis of g_raw."""
    a = exp(A_log)
    if lower_bound:
        return lower_bound * sigmoid(a * (g_raw + dt_bias))
    return -(a * softplus(g_raw + dt_bias))


def sequences(m, T):
    """(state row, first token, end token) of every sequence (varlen or batch rows)."""
    if 'cu' in m:
        cu = m['cu']
        return [(n, int(cu[n]), int(cu[n + 1])) for n in range(len(cu) - 1)]
    return None


def _l2norm(x):
    return x / sqrt((x * x).sum(axis=-1, keepdims=True) + L2NORM_EPS)


def _kda_token(S, q, k, v, beta, g, decay):
    """One token for every value head: S [HV,K,V]; returns (new S, o [HV,V])."""
    if decay == 'per_channel':
        S = exp(g).reshape(*g.shape, 1) * S          # decay first
    elif decay == 'per_head':
        S = exp(g).reshape(g.shape[0], 1, 1) * S
    u = beta.reshape(beta.shape[0], 1) * (v - einsum('hkv,hk->hv', S, k))  # vs decayed S
    S = S + einsum('hk,hv->hkv', k, u)                # rank-1 write
    return S, einsum('hkv,hk->hv', S, q)               # read the updated state


def kda(x, m):
    """x: q k v beta [g] h0 [A_log dt_bias] as Values; m: the options."""
    B, T, H, K, V = (m[n] for n in 'BTHKV')
    HV = m.get('HV') or H
    decay = m.get('decay') or 'none'
    head_of = np.arange(HV) // (HV // H)               # value head hv reads q/k head hv/G
    g = x.get('g')
    if m.get('gate_in_kernel'):
        A_log = x['A_log'].reshape(HV, 1) if decay == 'per_channel' else x['A_log']
        bias = x['dt_bias'].reshape(HV, K) if decay == 'per_channel' else x['dt_bias']
        g = kda_decay_from_gate(g, A_log, bias, m.get('lower_bound') or 0.0)
    beta = sigmoid(x['beta']) if m.get('beta_is_logit') else x['beta']
    h0 = x['h0'].transpose(0, 1, 3, 2) if m.get('state_v_first') else x['h0']
    spans = sequences(m, T) or [(b, 0, T) for b in range(B)]
    o_rows, finals = {}, []
    for row, start, end in spans:
        b = 0 if 'cu' in m else row
        S = h0[row]
        for t in range(start, end):
            q, k = x['q'][b, t][head_of], x['k'][b, t][head_of]
            if m.get('use_qk_l2norm'):
                q, k = _l2norm(q), _l2norm(k)
            q = m['scale'] * q                          # scale after the norm
            S, o = _kda_token(S, q, k, x['v'][b, t], beta[b, t],
                              None if g is None else g[b, t], decay)
            o_rows[(b, t)] = o
        finals.append(S)
    o = stack([stack([o_rows[(b, t)] for t in range(T)]) for b in range(B)])
    ht = stack(finals)
    return {'o': o, 'ht': ht.transpose(0, 1, 3, 2) if m.get('state_v_first') else ht}


def kda_gate(x, m):
    A_log = x['A_log'].reshape(m['H'], 1) if m['decay'] == 'per_channel' else x['A_log']
    shape = (m['H'], m['K']) if m['decay'] == 'per_channel' else (m['H'],)
    g = kda_decay_from_gate(x['g_raw'], A_log, x['dt_bias'].reshape(*shape),
                            m.get('lower_bound') or 0.0)
    return {'g': g}


def ssm1(x, m):
    B, T, D, N = (m[n] for n in 'BTDN')
    G = m.get('G') or 1
    group_of = np.arange(D) // (D // G)
    Bp, Cp = x['B'], x['C']
    if not m.get('G'):                                  # [B,T,N]: one group
        Bp, Cp = Bp.reshape(B, T, 1, N), Cp.reshape(B, T, 1, N)
    act = m.get('gate_activation') or 'silu'
    spans = sequences(m, T) or [(b, 0, T) for b in range(B)]
    y_rows, finals = {}, []
    for row, start, end in spans:
        b = 0 if 'cu' in m else row
        h = x['h0'][row]
        for t in range(start, end):
            dt = x['dt'][b, t]
            if m.get('dt_softplus'):
                dt = softplus(dt + x['dt_bias'])
            dt = dt.reshape(D, 1)
            xt = x['x'][b, t]
            h = exp(x['A'] * dt) * h + (dt * Bp[b, t][group_of]) * xt.reshape(D, 1)
            y = (h * Cp[b, t][group_of]).sum(axis=1) + x['D'] * xt
            if 'gate' in x:
                y = y * activation(act, x['gate'][b, t])   # after the D skip
            y_rows[(b, t)] = y
        finals.append(h)
    y = stack([stack([y_rows[(b, t)] for t in range(T)]) for b in range(B)])
    return {'y': y, 'hT': stack(finals)}


def causal_conv1d(x, m):
    B, T, D, W = (m[n] for n in 'BTDW')
    spans = sequences(m, T) or [(b, 0, T) for b in range(B)]
    act = m.get('activation') or 'identity'
    y_rows, finals = {}, []
    for row, start, end in spans:
        b = 0 if 'cu' in m else row
        # the window: the state (oldest input first), then the sequence's inputs
        xs = concat([x['conv_state'][row]] +
                    [x['x'][b, t].reshape(D, 1) for t in range(start, end)], axis=1)
        for i, t in enumerate(range(start, end)):
            z = (x['weight'] * xs[:, i:i + W]).sum(axis=1)   # weight[:, W-1] hits x_t
            y_rows[(b, t)] = activation(act, z + x['bias'])
        finals.append(xs[:, xs.shape[1] - (W - 1):])
    y = stack([stack([y_rows[(b, t)] for t in range(T)]) for b in range(B)])
    return {'y': y, 'conv_state_out': stack(finals)}


def kda_segment(x, m):
    """KDA's segment summary: S_end = P S_start + R per (sequence, value head). R is the end
    state from zeros; P [K,K] the product of the tokens' (I - beta k k^T) diag(exp g), which is
    the end state of the same recurrence run from the identity with v = 0 (K-major whatever
    the state layout). q enters neither."""
    B, T, K = m['B'], m['T'], m['K']
    HV = m.get('HV') or m['H']
    rows = len(m['cu']) - 1 if 'cu' in m else B
    R = kda(x, m)['ht']
    eye = Value(np.broadcast_to(np.eye(K), (rows, HV, K, K)).copy())
    to_P = dict(x, v=Value(np.zeros((B, T, HV, K))), h0=eye)
    P = kda(to_P, dict(m, V=K, state_v_first=False))['ht']
    return {'P': P, 'R': R}


def ssm1_segment(x, m):
    """SSM1's segment summary: h_end = P * h_start + R elementwise. R is the end state from
    zeros; P = exp(A sum_t dt_t), the end state of the recurrence from ones with x = 0. C_proj,
    D_skip and the gate enter neither."""
    rows = len(m['cu']) - 1 if 'cu' in m else m['B']
    R = ssm1(x, m)['hT']
    to_P = dict(x, x=Value(np.zeros(x['x'].shape)), h0=Value(np.ones((rows, m['D'], m['N']))))
    return {'P': ssm1(to_P, m)['hT'], 'R': R}


def ema(x, m):
    """Per channel: s = a s + (1 - a) x_t, y_t = s, from s = h0 (zeros when absent)."""
    B, T = m['B'], m['T']
    ys, finals = [], []
    for b in range(B):
        s, rows = x['h0'][b], []
        for t in range(T):
            s = x['a'] * s + (1.0 - x['a']) * x['x'][b, t]
            rows.append(s)
        ys.append(stack(rows))
        finals.append(s)
    return {'y': stack(ys), 'hT': stack(finals)}
