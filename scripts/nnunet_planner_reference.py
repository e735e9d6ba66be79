"""
nnU-Net v2.8.1's experiment planners (ExperimentPlanner = default "nnUNetPlans", nnUNetPlannerResEncM/L/XL)
written again with numpy and python alone (no torch, no nnunetv2 import): the reference our planner is checked
against without installing PyTorch (docs/nnunet-planner.md says what it computes and how it was checked against
nnunetv2 itself). Every function names the nnunetv2 / dynamic_network_architectures code it follows.

usage: python scripts/nnunet_planner_reference.py dataset_fingerprint.json dataset.json PRESET [reader_writer_name]
       PRESET in {default, M, L, XL}; prints the plans dict as JSON (same content as nnU-Net's plans file,
       except 'dataset_name', which is taken from the dataset.json folder name if possible).
"""
import json
import math
import sys
from copy import deepcopy

import numpy as np

ANISO_THRESHOLD = 3  # nnunetv2/configuration.py:7

PRESETS = {
    # default_experiment_planner.py:50-75 ; residual_encoder_unet_planners.py:16-293
    'default': dict(plans_name='nnUNetPlans', arch='PlainConvUNet', vram_target_gb=8, ref_gb=8,
                    ref_3d=560000000, ref_2d=85000000, enc=(2,) * 14, dec=(2,) * 13, max_dataset_covered=0.05,
                    loop='default', planner='ExperimentPlanner'),
    'M': dict(plans_name='nnUNetResEncUNetMPlans', arch='ResidualEncoderUNet', vram_target_gb=8, ref_gb=8,
              ref_3d=680000000, ref_2d=135000000, enc=(1, 3, 4, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6), dec=(1,) * 12,
              max_dataset_covered=1, loop='resenc', planner='nnUNetPlannerResEncM'),
    'L': dict(plans_name='nnUNetResEncUNetLPlans', arch='ResidualEncoderUNet', vram_target_gb=24, ref_gb=24,
              ref_3d=2100000000, ref_2d=380000000, enc=(1, 3, 4, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6), dec=(1,) * 12,
              max_dataset_covered=1, loop='resenc', planner='nnUNetPlannerResEncL'),
    'XL': dict(plans_name='nnUNetResEncUNetXLPlans', arch='ResidualEncoderUNet', vram_target_gb=40, ref_gb=40,
               ref_3d=3600000000, ref_2d=560000000, enc=(1, 3, 4, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6), dec=(1,) * 12,
               max_dataset_covered=1, loop='resenc', planner='nnUNetPlannerResEncXL'),
}
BASE_FEATURES = 32
MAX_FEATURES_2D, MAX_FEATURES_3D = 512, 320
REF_BS_2D, REF_BS_3D = 12, 2
MIN_FM_EDGE = 4
MIN_BATCH = 2
LOWRES_THRESHOLD = 0.25
SPACING_INCREASE = 1.03


# ----------------------------------------------------------------------------------------------------------------
# numpy statistics, exactly as numpy 2.x computes them (method='linear')
def np_percentile_linear(values, q):
    """np.percentile(values, q) for a 1d list: virtual index (n-1)*(q/100), lerp with numpy's _lerp."""
    v = sorted(float(x) for x in values)
    n = len(v)
    vi = (n - 1) * (q / 100)
    prev = math.floor(vi)
    nxt = min(prev + 1, n - 1)
    prev = min(max(prev, 0), n - 1)
    t = vi - math.floor(vi)
    a, b = v[prev], v[nxt]
    d = b - a
    if t >= 0.5:
        return b - d * (1 - t)
    return a + d * t


def np_median(values):
    """np.median: middle element, or mean of the two middle ones ((a+b)/2) for even n."""
    v = sorted(float(x) for x in values)
    n = len(v)
    if n % 2:
        return v[n // 2]
    return (v[n // 2 - 1] + v[n // 2]) / 2


def py_round(x):
    """python round() on a float: round-half-to-even, returns int"""
    return int(round(float(x)))


# ----------------------------------------------------------------------------------------------------------------
# network_topology.py
def pad_shape(shape, div):
    """network_topology.py:9-27 ; shape entries may be floats (median shapes can end in .5)"""
    new = [shape[i] + div[i] - shape[i] % div[i] for i in range(len(shape))]
    for i in range(len(shape)):
        if shape[i] % div[i] == 0:
            new[i] -= div[i]
    return [int(x) for x in new]  # np.array(...).astype(int): truncation


def get_pool_and_conv_props(spacing, patch_size, min_fm=MIN_FM_EDGE, max_numpool=999999):
    """network_topology.py:30-108"""
    dim = len(spacing)
    cur_sp = [float(s) for s in spacing]
    cur_sz = [float(s) for s in patch_size]
    pool = [[1] * dim]
    conv = []
    npool = [0] * dim
    kernel = [1] * dim
    while True:
        valid = [i for i in range(dim) if cur_sz[i] >= 2 * min_fm]
        if len(valid) < 1:
            break
        min_sp_valid = min(cur_sp[i] for i in valid)
        valid = [i for i in valid if cur_sp[i] / min_sp_valid < 2]
        valid = [i for i in valid if npool[i] < max_numpool]
        if len(valid) == 1 and not (cur_sz[valid[0]] >= 3 * min_fm):
            break
        if len(valid) < 1:
            break
        for d in range(dim):
            if kernel[d] != 3 and cur_sp[d] / min(cur_sp) < 2:
                kernel[d] = 3
        p = [1] * dim
        for v in valid:
            p[v] = 2
            npool[v] += 1
            cur_sp[v] *= 2
            cur_sz[v] = math.ceil(cur_sz[v] / 2)
        pool.append(p)
        conv.append(list(kernel))
    div = [2 ** k for k in npool]
    patch = pad_shape(list(patch_size), div)
    conv.append([3] * dim)
    return npool, pool, conv, patch, div


# ----------------------------------------------------------------------------------------------------------------
# VRAM estimate = net.compute_conv_feature_map_size(patch) with deep_supervision=False (the planner never sets it)
def feature_map_sizes(patch, strides):
    sizes = []
    cur = list(patch)
    for s in strides:
        cur = [c // k for c, k in zip(cur, s)]
        sizes.append(cur)
    return sizes  # sizes[s] = spatial size of stage s output


def prodi(x):
    r = 1
    for i in x:
        r *= int(i)
    return r


def estimate_vram(arch, patch, strides, features, n_enc, n_dec, num_classes):
    """PlainConvUNet (unet.py:96) = PlainConvEncoder (plain_conv_encoder.py:93) + UNetDecoder (unet_decoder.py:127)
       ResidualEncoderUNet (unet.py:183) = ResidualEncoder (residual_encoders.py:147, BasicBlockD residual.py:114)
                                          + UNetDecoder. Input channels never enter."""
    sizes = feature_map_sizes(patch, strides)
    n = len(strides)
    out = 0
    if arch == 'PlainConvUNet':
        for s in range(n):
            out += n_enc[s] * features[s] * prodi(sizes[s])
    else:
        out += features[0] * prodi(patch)  # stem: 1 conv, stride 1, features[0]
        in_ch = features[0]
        cur = list(patch)
        for s in range(n):
            v = features[s] * prodi(sizes[s])
            out += 2 * v  # first block conv1 + conv2
            if in_ch != features[s] or any(a != b for a, b in zip(cur, sizes[s])):
                out += v  # projection / pooled skip of the first block
            out += (n_enc[s] - 1) * 2 * v  # remaining blocks
            in_ch = features[s]
            cur = sizes[s]
    # decoder: stage j (0 = deepest) works at skip level l = n-2-j
    for j in range(n - 1):
        l = n - 2 - j
        v = prodi(sizes[l])
        out += n_dec[j] * features[l] * v  # conv blocks
        out += features[l] * v  # transposed conv output
        if j == n - 2:
            out += num_classes * v  # only the final seg layer (deep_supervision=False)
    return out


# ----------------------------------------------------------------------------------------------------------------
def fullres_target_spacing(fp):
    """default_experiment_planner.py:155-196"""
    spacings = [list(map(float, s)) for s in fp['spacings']]
    sizes = fp['shapes_after_crop']
    dim = len(spacings[0])
    target = [np_percentile_linear([s[a] for s in spacings], 50) for a in range(dim)]
    target_size = [np_percentile_linear([s[a] for s in sizes], 50) for a in range(dim)]
    worst = int(np.argmax(target))  # first index on ties
    others = [i for i in range(dim) if i != worst]
    other_sp = [target[i] for i in others]
    other_sz = [target_size[i] for i in others]
    aniso_sp = target[worst] > ANISO_THRESHOLD * max(other_sp)
    aniso_vox = target_size[worst] * ANISO_THRESHOLD < min(other_sz)
    if aniso_sp and aniso_vox:
        t = np_percentile_linear([s[worst] for s in spacings], 10)
        if t < max(other_sp):
            t = max(max(other_sp), t) + 1e-5
        target[worst] = t
    return target


def get_plans_for_configuration(P, spacing, median_shape, data_identifier, n_vox_dataset, num_classes,
                                norm_schemes, use_mask, cache):
    dim = len(spacing)
    max_f = MAX_FEATURES_2D if dim == 2 else MAX_FEATURES_3D
    feats = lambda ns: [min(max_f, BASE_FEATURES * 2 ** i) for i in range(ns)]
    tmp = 1 / np.array(spacing, dtype=np.float64)
    if dim == 3:
        init = [py_round(i) for i in tmp * (256 ** 3 / np.prod(tmp)) ** (1 / 3)]
    else:
        init = [py_round(i) for i in tmp * (2048 ** 2 / np.prod(tmp)) ** (1 / 2)]
    init = [min(i, j) for i, j in zip(init, list(median_shape)[:dim])]
    _, pool, conv, patch, div = get_pool_and_conv_props(spacing, init)

    def est(patch, pool):
        key = (tuple(patch), tuple(map(tuple, pool)))
        if key not in cache:
            ns = len(pool)
            cache[key] = estimate_vram(P['arch'], patch, pool, feats(ns), P['enc'][:ns], P['dec'][:ns - 1],
                                       num_classes)
        return cache[key]

    e = est(patch, pool)
    reference = (P['ref_2d'] if dim == 2 else P['ref_3d']) * (P['vram_target_gb'] / P['ref_gb'])
    ref_bs = REF_BS_2D if dim == 2 else REF_BS_3D
    too_big = (lambda e: e / ref_bs * 2 > reference) if P['loop'] == 'default' else (lambda e: e > reference)
    while too_big(e):
        ratios = [i / j for i, j in zip(patch, list(median_shape)[:dim])]
        ax = int(np.argsort(ratios, kind='stable')[-1])  # largest ratio, last axis on ties
        patch = list(patch)
        t = list(patch)
        t[ax] -= div[ax]
        _, _, _, _, div = get_pool_and_conv_props(spacing, t)
        patch[ax] -= div[ax]
        _, pool, conv, patch, div = get_pool_and_conv_props(spacing, patch)
        e = est(patch, pool)
    bs = py_round((reference / e) * ref_bs)
    cap = py_round(n_vox_dataset * P['max_dataset_covered'] / float(np.prod(patch, dtype=np.float64)))
    bs = max(min(bs, cap), MIN_BATCH)
    ns = len(pool)
    if P['arch'] == 'PlainConvUNet':
        cls = 'dynamic_network_architectures.architectures.unet.PlainConvUNet'
        blocks = {'n_conv_per_stage': list(P['enc'][:ns])}
    else:
        cls = 'dynamic_network_architectures.architectures.unet.ResidualEncoderUNet'
        blocks = {'n_blocks_per_stage': list(P['enc'][:ns])}
    arch = {'network_class_name': cls, 'arch_kwargs': {
        'n_stages': ns, 'features_per_stage': feats(ns),
        'conv_op': 'torch.nn.modules.conv.Conv%dd' % dim, 'kernel_sizes': conv, 'strides': pool, **blocks,
        'n_conv_per_stage_decoder': list(P['dec'][:ns - 1]), 'conv_bias': True,
        'norm_op': 'torch.nn.modules.instancenorm.InstanceNorm%dd' % dim,
        'norm_op_kwargs': {'eps': 1e-05, 'affine': True}, 'dropout_op': None, 'dropout_op_kwargs': None,
        'nonlin': 'torch.nn.LeakyReLU', 'nonlin_kwargs': {'inplace': True}},
        '_kw_requires_import': ['conv_op', 'norm_op', 'dropout_op', 'nonlin']}
    rs = lambda is_seg, order: {'is_seg': is_seg, 'order': order, 'order_z': 0, 'force_separate_z': None}
    return {
        'data_identifier': data_identifier, 'preprocessor_name': 'DefaultPreprocessor', 'batch_size': bs,
        'patch_size': list(patch), 'median_image_size_in_voxels': [float(i) if not isinstance(i, int) else i
                                                                  for i in median_shape],
        'spacing': [float(s) for s in spacing], 'normalization_schemes': norm_schemes, 'use_mask_for_norm': use_mask,
        'resampling_fn_data': 'resample_data_or_seg_to_shape', 'resampling_fn_seg': 'resample_data_or_seg_to_shape',
        'resampling_fn_data_kwargs': rs(False, 3), 'resampling_fn_seg_kwargs': rs(True, 1),
        'resampling_fn_probabilities': 'resample_data_or_seg_to_shape',
        'resampling_fn_probabilities_kwargs': rs(False, 1), 'architecture': arch,
    }, e


def plan_experiment(fp, dataset_json, preset, dataset_name='DatasetXXX', reader_writer='SimpleITKIO'):
    """default_experiment_planner.py:405-541"""
    P = PRESETS[preset]
    cache = {}
    num_classes = len(dataset_json['labels'])
    chans = dataset_json.get('channel_names', dataset_json.get('modality'))
    mapping = {'ct': 'CTNormalization', 'nonorm': 'NoNormalization', 'zscore': 'ZScoreNormalization',
               'rescale_to_0_1': 'RescaleTo01Normalization', 'rgb_to_0_1': 'RGBTo01Normalization'}
    norm = [mapping.get(c.casefold(), 'ZScoreNormalization') for c in chans.values()]
    if fp['median_relative_size_after_cropping'] < 3 / 4.:
        use_mask = [n == 'ZScoreNormalization' for n in norm]
    else:
        use_mask = [False] * len(norm)

    target = fullres_target_spacing(fp)
    mx = int(np.argmax(target))
    tf = [mx] + [i for i in range(3) if i != mx]
    tb = [tf.index(i) for i in range(3)]
    sp_t = [target[i] for i in tf]
    new_shapes = [[int(round(s_old / s_new * n)) for s_old, s_new, n in zip(sp, target, sh)]
                  for sp, sh in zip(fp['spacings'], fp['shapes_after_crop'])]
    new_median = [np_median([s[a] for s in new_shapes]) for a in range(3)]
    med_t = [new_median[i] for i in tf]
    n_vox = float(prodi_f(med_t) * dataset_json['numTraining'])
    ident = lambda c: (('nnUNetPlans_' + c) if (preset != 'default' and c in ('2d', '3d_fullres'))
                       else P['plans_name'] + '_' + c)
    log = {}
    if med_t[0] != 1:
        full, e = get_plans_for_configuration(P, sp_t, med_t, ident('3d_fullres'), n_vox, num_classes, norm,
                                              use_mask, cache)
        log['3d_fullres'] = e
        median_num_voxels = prodi_f(med_t)
        patch_vox = float(prodi(full['patch_size']))
        low = None
        low_sp = np.array(sp_t, dtype=np.float64)
        full_sp = np.array(sp_t, dtype=np.float64)
        med_arr = np.array(med_t, dtype=np.float64)
        while patch_vox / median_num_voxels < LOWRES_THRESHOLD:
            mxs = max(low_sp)
            m = (mxs / low_sp) > 2
            if np.any(m):
                low_sp[m] *= SPACING_INCREASE
            else:
                low_sp *= SPACING_INCREASE
            shp = full_sp / low_sp * med_arr
            median_num_voxels = float(np.prod(shp, dtype=np.float64))
            low, e = get_plans_for_configuration(P, list(low_sp), tuple(py_round(i) for i in shp),
                                                 ident('3d_lowres'), float(median_num_voxels *
                                                                           dataset_json['numTraining']),
                                                 num_classes, norm, use_mask, cache)
            log['3d_lowres'] = e
            patch_vox = prodi(low['patch_size'])
        if prodi_f(med_t) / median_num_voxels < 2:
            low = None
        if low is not None:
            low['batch_dice'] = False
            full['batch_dice'] = True
        else:
            full['batch_dice'] = False
    else:
        full = low = None
    p2d, e = get_plans_for_configuration(P, sp_t[1:], med_t[1:], ident('2d'), n_vox, num_classes, norm, use_mask,
                                         cache)
    log['2d'] = e
    p2d['batch_dice'] = True
    med_sp = [np_median([s[a] for s in fp['spacings']]) for a in range(3)]
    med_sh = [np_median([s[a] for s in fp['shapes_after_crop']]) for a in range(3)]
    plans = {'dataset_name': dataset_name, 'plans_name': P['plans_name'],
             'original_median_spacing_after_transp': [float(med_sp[i]) for i in tf],
             'original_median_shape_after_transp': [int(round(med_sh[i])) for i in tf],
             'image_reader_writer': reader_writer, 'transpose_forward': tf, 'transpose_backward': tb,
             'configurations': {'2d': p2d}, 'experiment_planner_used': P['planner'], 'label_manager': 'LabelManager',
             'foreground_intensity_properties_per_channel': fp['foreground_intensity_properties_per_channel']}
    if low is not None:
        plans['configurations']['3d_lowres'] = low
        if full is not None:
            low['next_stage'] = '3d_cascade_fullres'
    if full is not None:
        plans['configurations']['3d_fullres'] = full
        if low is not None:
            plans['configurations']['3d_cascade_fullres'] = {'inherits_from': '3d_fullres',
                                                             'previous_stage': '3d_lowres'}
    return plans, log


def prodi_f(x):
    return float(np.prod(np.array(x, dtype=np.float64), dtype=np.float64))


if __name__ == '__main__':
    fp = json.load(open(sys.argv[1]))
    dj = json.load(open(sys.argv[2]))
    plans, log = plan_experiment(fp, dj, sys.argv[3])
    print(json.dumps(plans, indent=4))
