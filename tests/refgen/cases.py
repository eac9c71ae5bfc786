"""The generated reference cases: every op (defs.py) and every option the case loader
accepts, at sizes small enough that generating them takes seconds and the C tests stay fast.

A case is its meta.json options plus: name, seed, and how to draw inputs (draw.py: g_style
and g_mag for KDA decays, over_threshold and has_params for the gate, dt_max and has_D for
SSM1), 'cu' (packed sequence offsets, making the case varlen), 'dstate_at_zero' (list the
initial state's gradient although there is no initial state) and 'd_state' (give the
upstream gradient of the final state). T > 16, 32, 64 and 128 somewhere, so that every KDA
chunk size has chunk boundaries and the backward's 64-token segments split a sequence.
"""


def kda(name, seed, B, T, H, K, V, decay, l2=True, h0=True, d_state=True, **more):
    c = dict(op='kda', name=name, seed=seed, B=B, T=T, H=H, K=K, V=V, decay=decay,
             use_qk_l2norm=l2, has_h0=h0, d_state=d_state)
    c.update(more)
    return c


def gate(name, seed, B, T, H, K, decay, **more):
    return dict(op='kda_gate', name=name, seed=seed, B=B, T=T, H=H, K=K, decay=decay, **more)


def ssm1(name, seed, B, T, D, N, gate=True, h0=True, d_state=True, act='silu', **more):
    c = dict(op='ssm1', name=name, seed=seed, B=B, T=T, D=D, N=N, has_gate=gate, has_h0=h0,
             d_state=d_state, gate_activation=act if gate else None)
    c.update(more)
    return c


def kda_segment(name, seed, B, T, H, K, V, decay, l2=True, d_state=True, **more):
    """The summary starts from zeros (no h0); d_state: the upstream gradient of R too."""
    return dict(kda(name, seed, B, T, H, K, V, decay, l2=l2, h0=False, d_state=d_state, **more),
                op='kda_segment')


def ssm1_segment(name, seed, B, T, D, N, gate=True, d_state=True, act='silu', **more):
    return dict(ssm1(name, seed, B, T, D, N, gate=gate, h0=False, d_state=d_state, act=act,
                     **more), op='ssm1_segment')


def conv(name, seed, B, T, D, W, act, bias=True, state=True, d_state=False, **more):
    c = dict(op='causal_conv1d', name=name, seed=seed, B=B, T=T, D=D, W=W, activation=act,
             has_bias=bias, has_state=state, d_state=d_state)
    c.update(more)
    return c


def ema(name, seed, B, T, D, h0=True):
    return dict(op='ema', name=name, seed=seed, B=B, T=T, D=D, has_h0=h0)


CASES = [
    # KDA. The first one is small on purpose: tests/check_cli_errors.sh edits copies of it.
    kda('kda_pc_B1_T1_H1_K16_V16_g0.3_l2_h0', 1001, 1, 1, 1, 16, 16, 'per_channel'),
    kda('kda_pc_B2_T37_H2_K8_V8_g1.0_l2_h0', 1002, 2, 37, 2, 8, 8, 'per_channel', g_mag=1.0),
    kda('kda_pc_B1_T70_H1_K16_V8_spikes_nol2_noh0_dh0', 1003, 1, 70, 1, 16, 8, 'per_channel',
        l2=False, h0=False, g_style='spikes', dstate_at_zero=True),
    kda('kda_pc_B1_T40_H2_K8_V8_heavy2.0_l2_h0_scale1', 1004, 1, 40, 2, 8, 8, 'per_channel',
        g_style='heavy', g_mag=2.0, scale=1.0),
    kda('kda_ph_B2_T20_H2_K8_V16_g0.3_l2_h0_nodht', 1005, 2, 20, 2, 8, 16, 'per_head',
        d_state=False),
    kda('kda_ph_B1_T140_H1_K8_V8_spikes_l2_h0', 1006, 1, 140, 1, 8, 8, 'per_head',
        g_style='spikes'),
    kda('kda_none_B1_T33_H2_K8_V8_l2_h0', 1007, 1, 33, 2, 8, 8, 'none'),
    kda('kda_none_B2_T5_H1_K4_V4_nol2_noh0', 1008, 2, 5, 1, 4, 4, 'none', l2=False, h0=False),
    kda('kda_gva_pc_B1_T24_H2_HV4_K8_V8_g0.3_l2_h0_scale0.5', 1009, 1, 24, 2, 8, 8,
        'per_channel', HV=4, scale=0.5),
    kda('kda_vfirst_ph_B2_T17_H1_K8_V12_logit_l2_h0', 1010, 2, 17, 1, 8, 12, 'per_head',
        state_v_first=True, beta_is_logit=True, g_mag=1.0),
    kda('kda_gik_pc_B1_T40_H2_K8_V8_l2_h0', 1011, 1, 40, 2, 8, 8, 'per_channel',
        gate_in_kernel=True),
    kda('kda_gik_ph_lb-5_B2_T20_H1_HV2_K8_V8_vfirst_logit_nol2_noh0', 1012, 2, 20, 1, 8, 8,
        'per_head', HV=2, gate_in_kernel=True, lower_bound=-5.0, state_v_first=True,
        beta_is_logit=True, l2=False, h0=False),
    kda('kda_varlen4_pc_B1_T50_H2_K8_V8_g1.0_l2_h0_empty', 1013, 1, 50, 2, 8, 8,
        'per_channel', cu=[0, 20, 20, 45, 50], g_mag=1.0, N=4),
    kda('kda_varlen3_ph_B1_T30_H1_HV2_K8_V8_gik_nol2_noh0_dh0', 1014, 1, 30, 1, 8, 8,
        'per_head', cu=[0, 0, 12, 30], HV=2, gate_in_kernel=True, l2=False, h0=False,
        dstate_at_zero=True),
    # Every token decaying hard (per-head as fla's Gated DeltaNet tests draw it, per-channel,
    # and through the in-kernel gate): dg is ~1e-11 and below while the other gradients are
    # O(1), and must still match relative to its own scale in every chunk size.
    kda('kda_hard_pc_B1_T140_H1_K16_V8_g25_l2_h0', 1015, 1, 140, 1, 16, 8, 'per_channel',
        g_style='hard', g_mag=25.0),
    kda('kda_hard_ph_B2_T140_H2_K8_V8_g34.5_nol2_h0', 1016, 2, 140, 2, 8, 8, 'per_head',
        l2=False, g_style='hard', g_mag=34.5),
    kda('kda_hard_gik_pc_B1_T140_H1_HV2_K8_V8_g30_l2_h0', 1017, 1, 140, 1, 8, 8,
        'per_channel', HV=2, gate_in_kernel=True, g_style='hard', g_mag=30.0),
    # KDA gate
    gate('kda_gate_pc_B2_T8_H3_K8', 1101, 2, 8, 3, 8, 'per_channel'),
    gate('kda_gate_ph_B2_T8_H4_over20', 1102, 2, 8, 4, None, 'per_head', over_threshold=True),
    gate('kda_gate_pc_B1_T5_H2_K4_lb-5', 1103, 1, 5, 2, 4, 'per_channel', lower_bound=-5.0),
    gate('kda_gate_ph_B1_T6_H2_lb-2_noparams', 1104, 1, 6, 2, None, 'per_head',
         lower_bound=-2.0, has_params=False),
    gate('kda_gate_pc_B1_T4_H2_K3_over20_noparams', 1105, 1, 4, 2, 3, 'per_channel',
         over_threshold=True, has_params=False),
    # SSM1. The first one is small on purpose: fuzz/make_seeds.py stores a copy of it.
    ssm1('ssm1_B2_T1_D8_N4_gate_h0', 1201, 2, 1, 8, 4),
    ssm1('ssm1_B1_T70_D8_N4_nogate_noh0', 1202, 1, 70, 8, 4, gate=False, h0=False),
    ssm1('ssm1_B2_T20_D8_N4_G2_sigmoid_softplus_h0', 1203, 2, 20, 8, 4, G=2, act='sigmoid',
         dt_softplus=True),
    ssm1('ssm1_B1_T10_D6_N3_gelu_tanh_noD_h0_dt0.5', 1204, 1, 10, 6, 3, act='gelu_tanh',
         has_D=False, dt_max=0.5),
    ssm1('ssm1_B1_T9_D4_N2_G4_relu_noh0_dh0', 1205, 1, 9, 4, 2, G=4, act='relu', h0=False,
         dstate_at_zero=True),
    ssm1('ssm1_B2_T6_D4_N3_identity_h0_nodht', 1206, 2, 6, 4, 3, act='identity',
         d_state=False),
    ssm1('ssm1_varlen3_B1_T17_D6_N4_G3_silu_softplus_h0_empty', 1207, 1, 17, 6, 4, G=3,
         dt_softplus=True, cu=[0, 5, 5, 17]),
    # causal conv1d. The first one: tests/check_cli_errors.sh and fuzz/make_seeds.py.
    conv('conv_B1_T2_D8_W4_none_nobias_state', 1301, 1, 2, 8, 4, None, bias=False),
    conv('conv_B2_T5_D4_W1_silu_bias_nostate', 1302, 2, 5, 4, 1, 'silu', state=False),
    conv('conv_B1_T9_D6_W2_none_bias_state_dstate', 1303, 1, 9, 6, 2, None, d_state=True),
    conv('conv_B2_T33_D8_W4_silu_bias_state', 1304, 2, 33, 8, 4, 'silu'),
    conv('conv_B2_T2_D8_W4_none_bias_nostate_dstate0', 1305, 2, 2, 8, 4, None, state=False,
         dstate_at_zero=True),
    conv('conv_B1_T1_D5_W4_silu_nobias_state_dstate', 1306, 1, 1, 5, 4, 'silu', bias=False,
         d_state=True),
    conv('conv_varlen3_B1_T10_D4_W3_sigmoid_bias_state_empty', 1307, 1, 10, 4, 3, 'sigmoid',
         cu=[0, 1, 1, 10], d_state=True),
    conv('conv_B1_T7_D4_W4_gelu_tanh_bias_state', 1308, 1, 7, 4, 4, 'gelu_tanh'),
    conv('conv_B1_T6_D3_W3_relu_bias_nostate', 1309, 1, 6, 3, 3, 'relu', state=False),
    conv('conv_B1_T4_D3_W2_identity_nobias_nostate', 1310, 1, 4, 3, 2, 'identity', bias=False,
         state=False),
    # The segment summaries (context parallelism): P and R of every sequence, T across chunk
    # boundaries; q (KDA) and C, D and the gate (SSM1) are given although they do not enter,
    # so their gradients must come out zero.
    kda_segment('kda_segment_pc_B2_T37_H2_K8_V8_g0.05_l2', 1401, 2, 37, 2, 8, 8, 'per_channel',
                g_mag=0.05),
    kda_segment('kda_segment_varlen3_ph_B1_T70_H1_HV2_K8_V4_g0.05_vfirst_logit_nol2', 1402, 1,
                70, 1, 8, 4, 'per_head', cu=[0, 25, 45, 70], N=3, HV=2, g_mag=0.05,
                state_v_first=True, beta_is_logit=True, l2=False),
    kda_segment('kda_segment_none_varlen2_B1_T20_H1_K4_V8_empty_nodR', 1403, 1, 20, 1, 4, 8,
                'none', cu=[0, 0, 20], N=2, d_state=False),
    kda_segment('kda_segment_gik_pc_lb-3_B2_T10_H1_K8_V8', 1404, 2, 10, 1, 8, 8, 'per_channel',
                gate_in_kernel=True, lower_bound=-3.0),
    ssm1_segment('ssm1_segment_B2_T20_D8_N4_G2_sigmoid_softplus', 1501, 2, 20, 8, 4, G=2,
                 act='sigmoid', dt_softplus=True),
    ssm1_segment('ssm1_segment_varlen3_B1_T17_D6_N3_nogate_noD_nodR', 1502, 1, 17, 6, 3,
                 gate=False, has_D=False, d_state=False, cu=[0, 5, 5, 17]),
    # EMA (forward-only): D past one 64-channel block, and without h0.
    ema('ema_B2_T9_D70_h0', 1401, 2, 9, 70),
    ema('ema_B1_T1_D3_noh0', 1402, 1, 1, 3, h0=False),
    ema('ema_B3_T33_D5_h0', 1403, 3, 33, 5),
]

# Tiny versions of every option for the gradient self-check (finite differences).
CHECKS = [
    kda('pc', 1, 1, 3, 1, 3, 2, 'per_channel'),
    kda('ph_nol2_noh0', 2, 2, 3, 1, 3, 2, 'per_head', l2=False, h0=False,
        dstate_at_zero=True),
    kda('none_gva_vfirst_logit', 3, 1, 3, 1, 2, 3, 'none', HV=2, state_v_first=True,
        beta_is_logit=True, scale=0.7),
    kda('gik_pc', 4, 1, 3, 1, 3, 2, 'per_channel', gate_in_kernel=True, d_state=False),
    kda('gik_ph_lb', 5, 1, 3, 1, 2, 2, 'per_head', gate_in_kernel=True, lower_bound=-3.0),
    kda('varlen_empty', 6, 1, 4, 1, 2, 2, 'per_channel', cu=[0, 1, 1, 4]),
    gate('gate_pc', 7, 1, 2, 2, 3, 'per_channel'),
    gate('gate_ph_lb', 8, 2, 2, 2, None, 'per_head', lower_bound=-4.0),
    ssm1('ssm_silu', 9, 1, 3, 2, 2),
    ssm1('ssm_groups_softplus_gelu', 10, 1, 3, 4, 2, G=2, act='gelu_tanh', dt_softplus=True),
    ssm1('ssm_sigmoid_relu_varlen', 11, 1, 4, 2, 2, act='sigmoid', cu=[0, 1, 1, 4]),
    ssm1('ssm_relu_noD', 12, 2, 2, 2, 2, act='relu', has_D=False, h0=False,
         dstate_at_zero=True),
    conv('conv_silu', 13, 1, 4, 2, 3, 'silu', d_state=True),
    conv('conv_short_nostate', 14, 2, 1, 2, 4, 'gelu_tanh', state=False, dstate_at_zero=True,
         d_state=True),
    conv('conv_varlen_sigmoid', 15, 1, 4, 2, 2, 'sigmoid', cu=[0, 3, 3, 4], d_state=True),
    kda_segment('kda_segment_pc', 16, 1, 3, 1, 3, 2, 'per_channel'),
    kda_segment('kda_segment_gik_vfirst_varlen', 17, 1, 4, 1, 2, 2, 'per_head', HV=2,
                gate_in_kernel=True, state_v_first=True, cu=[0, 1, 1, 4]),
    ssm1_segment('ssm1_segment_groups_softplus', 18, 1, 3, 4, 2, G=2, dt_softplus=True),
    ssm1_segment('ssm1_segment_varlen_noD', 19, 1, 4, 2, 2, has_D=False, cu=[0, 1, 1, 4]),
]
