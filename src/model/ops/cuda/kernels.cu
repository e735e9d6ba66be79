// CUDA kernels for the U-Net's non-convolution ops (the convolutions go to cuDNN).
// Compiled to PTX by build.rs with nvcc when the `cuda` feature is on; launched from
// src/model/ops/cuda/launch.rs. Each kernel mirrors one CPU op in src/model/ops and is tested
// against it on the GPU (tests/gpu_ops.rs).
//
// Tensors are contiguous NCDHW, f32 or bf16: every kernel is a template over the element
// type T, instantiated as NAME_f32 and NAME_bf16. Arithmetic is f32 whatever T is (bf16 is
// storage only, as cuDNN's bf16 convolutions accumulate in f32). Reductions are two-level and
// deterministic: a grid of blocks writes per-block partial sums (f32 per thread, f64 across the
// block), and a second kernel adds the partials of one row in a fixed order. No atomics, so a
// result never depends on scheduling.

#include <cuda_bf16.h>

#define THREADS 256

typedef long long i64;
typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float ld(const float *p, i64 i) { return p[i]; }
__device__ __forceinline__ float ld(const bf16 *p, i64 i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st(float *p, i64 i, float v) { p[i] = v; }
__device__ __forceinline__ void st(bf16 *p, i64 i, float v) { p[i] = __float2bfloat16(v); }

// NAME_f32 and NAME_bf16 kernels calling the template body NAME<T>. PARAMS are written with
// `T`: each instance is declared in a namespace where T is its element type (extern "C" keeps
// the names unmangled for the Rust side).
#define BOTH(NAME, PARAMS, ARGS)                                                               \
    namespace as_f32 {                                                                         \
    typedef float T;                                                                           \
    extern "C" __global__ void NAME##_f32 PARAMS { ::NAME<T> ARGS; }                           \
    }                                                                                          \
    namespace as_bf16 {                                                                        \
    typedef bf16 T;                                                                            \
    extern "C" __global__ void NAME##_bf16 PARAMS { ::NAME<T> ARGS; }                          \
    }

// Sum of (a, b) over the block; the result is valid in thread 0. Needs THREADS threads.
__device__ void block_sum2(double &a, double &b) {
    __shared__ double sa[THREADS / 32], sb[THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_down_sync(0xffffffffu, a, o);
        b += __shfl_down_sync(0xffffffffu, b, o);
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sa[warp] = a;
        sb[warp] = b;
    }
    __syncthreads();
    if (warp == 0) {
        a = lane < THREADS / 32 ? sa[lane] : 0.0;
        b = lane < THREADS / 32 ? sb[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) {
            a += __shfl_down_sync(0xffffffffu, a, o);
            b += __shfl_down_sync(0xffffffffu, b, o);
        }
    }
}

// The [begin, end) part of a row of `len` elements that block `part` of `parts` reduces.
__device__ void part_range(i64 len, int part, int parts, i64 &begin, i64 &end) {
    i64 step = (len + parts - 1) / parts;
    begin = step * part;
    end = begin + step < len ? begin + step : len;
    if (begin > len) begin = len;
}

__device__ __forceinline__ float act_slope(float z, float slope) {
    return z > 0.0f ? 1.0f : slope;
}

// ---- group norm + LeakyReLU ----------------------------------------------------------------

// grid (parts, slabs): partial sums of (x - k) and (x - k)^2 over each slab of `len`
// elements, k = the slab's first value (the same shift as the CPU op, against cancellation).
template <typename T>
__device__ void slab_moments(const T *x, i64 len, int parts, double *partials) {
    i64 slab = blockIdx.y, begin, end;
    part_range(len, blockIdx.x, parts, begin, end);
    const T *row = x + slab * len;
    float k = ld(row, 0), s = 0.0f, q = 0.0f;
    for (i64 i = begin + threadIdx.x; i < end; i += THREADS) {
        float v = ld(row, i) - k;
        s += v;
        q += v * v;
    }
    double a = s, b = q;
    block_sum2(a, b);
    if (threadIdx.x == 0) {
        double *out = partials + 2 * (slab * parts + blockIdx.x);
        out[0] = a;
        out[1] = b;
    }
}
BOTH(slab_moments, (const T *x, i64 len, int parts, double *partials), (x, len, parts, partials))

// One thread per slab: (mean, 1/sqrt(var + eps)) from its partials, biased variance.
template <typename T>
__device__ void slab_stats(const T *x, const double *partials, int parts, i64 len, int slabs,
                           double eps, float *stats) {
    int slab = blockIdx.x * blockDim.x + threadIdx.x;
    if (slab >= slabs) return;
    double s = 0.0, q = 0.0;
    for (int p = 0; p < parts; p++) {
        s += partials[2 * ((i64)slab * parts + p)];
        q += partials[2 * ((i64)slab * parts + p) + 1];
    }
    double m = (double)len, mean = s / m;
    double var = q / m - mean * mean;
    if (var < 0.0) var = 0.0;
    stats[2 * slab] = (float)((double)ld(x, (i64)slab * len) + mean);
    stats[2 * slab + 1] = (float)(1.0 / sqrt(var + eps));
}
BOTH(slab_stats,
     (const T *x, const double *partials, int parts, i64 len, int slabs, double eps, float *stats),
     (x, partials, parts, len, slabs, eps, stats))

// y = LeakyReLU(x * scale + shift), scale = w[c] * rstd, shift = b[c] - mean * scale.
// `voxels` per channel, `cg` channels per group: the slab of row (n, c) is (n * C + c) / cg.
template <typename T>
__device__ void norm_act_forward(const T *x, const float *stats, const T *w, const T *b,
                                 i64 numel, i64 voxels, int channels, int cg, float slope, T *y) {
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < numel;
         i += (i64)gridDim.x * blockDim.x) {
        i64 row = i / voxels;
        int c = (int)(row % channels);
        i64 slab = row / cg;
        float mean = stats[2 * slab], rstd = stats[2 * slab + 1];
        float scale = ld(w, c) * rstd, shift = ld(b, c) - mean * scale;
        float z = ld(x, i) * scale + shift;
        st(y, i, z * act_slope(z, slope));
    }
}
BOTH(norm_act_forward,
     (const T *x, const float *stats, const T *w, const T *b, i64 numel, i64 voxels,
      int channels, int cg, float slope, T *y),
     (x, stats, w, b, numel, voxels, channels, cg, slope, y))

// grid (parts, N * C): partial sums over one channel row of dz and dz * xhat, where
// dz = dy * LeakyReLU'(z) and xhat = (x - mean) * rstd.
template <typename T>
__device__ void norm_act_grad_partials(const T *x, const T *dy, const float *stats, const T *w,
                                       const T *b, i64 voxels, int channels, int cg, float slope,
                                       int parts, double *partials) {
    i64 row = blockIdx.y, begin, end;
    part_range(voxels, blockIdx.x, parts, begin, end);
    int c = (int)(row % channels);
    i64 slab = row / cg;
    float mean = stats[2 * slab], rstd = stats[2 * slab + 1];
    float scale = ld(w, c) * rstd, shift = ld(b, c) - mean * scale;
    const T *xr = x + row * voxels, *dr = dy + row * voxels;
    float s = 0.0f, q = 0.0f;
    for (i64 i = begin + threadIdx.x; i < end; i += THREADS) {
        float v = ld(xr, i);
        float dz = ld(dr, i) * act_slope(v * scale + shift, slope);
        s += dz;
        q += dz * ((v - mean) * rstd);
    }
    double a = s, bb = q;
    block_sum2(a, bb);
    if (threadIdx.x == 0) {
        double *out = partials + 2 * (row * parts + blockIdx.x);
        out[0] = a;
        out[1] = bb;
    }
}
BOTH(norm_act_grad_partials,
     (const T *x, const T *dy, const float *stats, const T *w, const T *b, i64 voxels,
      int channels, int cg, float slope, int parts, double *partials),
     (x, dy, stats, w, b, voxels, channels, cg, slope, parts, partials))

// One thread per (n, c) row: its partials summed in order into row_sums (two sums a row).
extern "C" __global__ void rows_reduce(const double *partials, int parts, int rows,
                                       double *row_sums) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    double a = 0.0, b = 0.0;
    for (int p = 0; p < parts; p++) {
        a += partials[2 * ((i64)row * parts + p)];
        b += partials[2 * ((i64)row * parts + p) + 1];
    }
    row_sums[2 * row] = a;
    row_sums[2 * row + 1] = b;
}

// Threads [0, N * G): per slab, the means over the slab of dxhat = w * dz and of dxhat * xhat
// (coef). Threads [N * G, N * G + C): per channel, dweight = sum_n sum dz * xhat and
// dbias = sum_n sum dz, summed in sample order, written after dx in the flat output.
template <typename T>
__device__ void norm_act_grad_coefs(const double *row_sums, const T *w, int batch, int channels,
                                    int cg, i64 voxels, float *coef, T *dparams) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    int groups = channels / cg, slabs = batch * groups;
    if (t < slabs) {
        int n = t / groups, c0 = (t % groups) * cg;
        double a = 0.0, b = 0.0;
        for (int c = c0; c < c0 + cg; c++) {
            a += (double)ld(w, c) * row_sums[2 * ((i64)n * channels + c)];
            b += (double)ld(w, c) * row_sums[2 * ((i64)n * channels + c) + 1];
        }
        double m = (double)cg * (double)voxels;
        coef[2 * t] = (float)(a / m);
        coef[2 * t + 1] = (float)(b / m);
    } else if (t < slabs + channels) {
        int c = t - slabs;
        double db = 0.0, dw = 0.0;
        for (int n = 0; n < batch; n++) {
            db += row_sums[2 * ((i64)n * channels + c)];
            dw += row_sums[2 * ((i64)n * channels + c) + 1];
        }
        st(dparams, c, (float)dw);
        st(dparams, channels + c, (float)db);
    }
}
BOTH(norm_act_grad_coefs,
     (const double *row_sums, const T *w, int batch, int channels, int cg, i64 voxels,
      float *coef, T *dparams),
     (row_sums, w, batch, channels, cg, voxels, coef, dparams))

// dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)).
template <typename T>
__device__ void norm_act_grad_input(const T *x, const T *dy, const float *stats,
                                    const float *coef, const T *w, const T *b, i64 numel,
                                    i64 voxels, int channels, int cg, float slope, T *dx) {
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < numel;
         i += (i64)gridDim.x * blockDim.x) {
        i64 row = i / voxels;
        int c = (int)(row % channels);
        i64 slab = row / cg;
        float mean = stats[2 * slab], rstd = stats[2 * slab + 1];
        float wc = ld(w, c);
        float scale = wc * rstd, shift = ld(b, c) - mean * scale;
        float v = ld(x, i);
        float dxhat = wc * ld(dy, i) * act_slope(v * scale + shift, slope);
        float xhat = (v - mean) * rstd;
        st(dx, i, rstd * (dxhat - coef[2 * slab] - xhat * coef[2 * slab + 1]));
    }
}
BOTH(norm_act_grad_input,
     (const T *x, const T *dy, const float *stats, const float *coef, const T *w, const T *b,
      i64 numel, i64 voxels, int channels, int cg, float slope, T *dx),
     (x, dy, stats, coef, w, b, numel, voxels, channels, cg, slope, dx))

// ---- max pooling (kernel == stride) --------------------------------------------------------

// Index in x of the first maximum of output voxel o's window (scan order d, h, w, as the CPU).
template <typename T>
__device__ i64 window_argmax(const T *x, i64 o, int d, int h, int w, int kd, int kh, int kw) {
    int pd = d / kd, ph = h / kh, pw = w / kw;
    int ow = (int)(o % pw);
    int oh = (int)((o / pw) % ph);
    int od = (int)((o / ((i64)pw * ph)) % pd);
    i64 plane = o / ((i64)pw * ph * pd);
    const T *xp = x + plane * ((i64)d * h * w);
    i64 best = ((i64)od * kd * h + (i64)oh * kh) * w + (i64)ow * kw;
    float best_v = ld(xp, best);
    for (int a = 0; a < kd; a++)
        for (int bb = 0; bb < kh; bb++) {
            i64 row = (((i64)od * kd + a) * h + (i64)oh * kh + bb) * w + (i64)ow * kw;
            for (int e = 0; e < kw; e++) {
                float v = ld(xp, row + e);
                if (v > best_v) {
                    best = row + e;
                    best_v = v;
                }
            }
        }
    return plane * ((i64)d * h * w) + best;
}

template <typename T>
__device__ void max_pool_forward(const T *x, i64 out_numel, int d, int h, int w, int kd, int kh,
                                 int kw, T *y) {
    for (i64 o = blockIdx.x * (i64)blockDim.x + threadIdx.x; o < out_numel;
         o += (i64)gridDim.x * blockDim.x)
        y[o] = x[window_argmax(x, o, d, h, w, kd, kh, kw)];
}
BOTH(max_pool_forward,
     (const T *x, i64 out_numel, int d, int h, int w, int kd, int kh, int kw, T *y),
     (x, out_numel, d, h, w, kd, kh, kw, y))

// dx must be zero on entry; windows do not overlap, so each element is written at most once.
template <typename T>
__device__ void max_pool_backward(const T *x, const T *dy, i64 out_numel, int d, int h, int w,
                                  int kd, int kh, int kw, T *dx) {
    for (i64 o = blockIdx.x * (i64)blockDim.x + threadIdx.x; o < out_numel;
         o += (i64)gridDim.x * blockDim.x)
        dx[window_argmax(x, o, d, h, w, kd, kh, kw)] = dy[o];
}
BOTH(max_pool_backward,
     (const T *x, const T *dy, i64 out_numel, int d, int h, int w, int kd, int kh, int kw,
      T *dx),
     (x, dy, out_numel, d, h, w, kd, kh, kw, dx))

// ---- per-channel bias ------------------------------------------------------------------------

template <typename T>
__device__ void add_channel_bias(const T *x, const T *bias, i64 numel, i64 voxels,
                                 int channels, T *y) {
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < numel;
         i += (i64)gridDim.x * blockDim.x)
        st(y, i, ld(x, i) + ld(bias, (i / voxels) % channels));
}
BOTH(add_channel_bias,
     (const T *x, const T *bias, i64 numel, i64 voxels, int channels, T *y),
     (x, bias, numel, voxels, channels, y))

// grid (parts, N * C): partial sums of each (n, c) row (second slot unused, zero).
template <typename T>
__device__ void row_partial_sums(const T *x, i64 voxels, int parts, double *partials) {
    i64 row = blockIdx.y, begin, end;
    part_range(voxels, blockIdx.x, parts, begin, end);
    const T *xr = x + row * voxels;
    float s = 0.0f;
    for (i64 i = begin + threadIdx.x; i < end; i += THREADS) s += ld(xr, i);
    double a = s, unused = 0.0;
    block_sum2(a, unused);
    if (threadIdx.x == 0) {
        partials[2 * (row * parts + blockIdx.x)] = a;
        partials[2 * (row * parts + blockIdx.x) + 1] = 0.0;
    }
}
BOTH(row_partial_sums, (const T *x, i64 voxels, int parts, double *partials),
     (x, voxels, parts, partials))

// One thread per channel: the sum over samples (in order) of the row sums.
template <typename T>
__device__ void channel_totals(const double *row_sums, int batch, int channels, T *out) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= channels) return;
    double s = 0.0;
    for (int n = 0; n < batch; n++) s += row_sums[2 * ((i64)n * channels + c)];
    st(out, c, (float)s);
}
BOTH(channel_totals, (const double *row_sums, int batch, int channels, T *out),
     (row_sums, batch, channels, out))
