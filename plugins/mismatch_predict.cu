// Fused mismatch prediction from draft logits (DESIGN.md §3.1).
//
// Reference semantics: recguide_trt/runtime/mismatch.py (topk_reference + predict_mismatch).
//
//   logits   [rows, L, V]  float32 or float16 (row-major, contiguous)
//   lengths  [rows]        int32, valid positions per row (clamped to [0, L]; nullptr = all L)
//   top_ids  [rows, L, 3]  int32, top-1/2/3 ids with MASK excluded (ties: lowest id wins)
//   top_probs[rows, L, 2]  float32, softmax prob (MASK excluded) of top-1 and top-2
//   flag_pos [rows]        int32, first i >= 1 with 1 - (p1 - p2) > tau, else -1
//   correction[rows]       int32, first of top-2/top-3 at flag_pos that is neither the drafted
//                          token (top-1) nor EOS; if there is none, flag_pos = correction = -1
//
// Positions at or beyond a row's length are not read: their top_ids are -1 and top_probs 0.
//
// Kernel 1 (recguide_mismatch_topk_{f32,f16}): one block per (row, position); every thread
// streams a strided slice of the vocabulary once, keeping an online (max, sum-exp) pair for the
// softmax normaliser and its own top-3; warp shuffles and a shared-memory pass merge them.
// No softmax is materialised. Kernel 2 (recguide_mismatch_flag): one thread per row.
//
// Self-contained: device code uses no headers, so NVRTC compiles it as is; the host launcher is
// guarded by __CUDACC_RTC__ and needs only the CUDA runtime.

#define RG_BLOCK 256
#define RG_WARPS (RG_BLOCK / 32)
#define RG_FLAG_BLOCK 128
#define RG_NO_ID 0x7fffffff

struct RgState
{
    float m;   // running max of the non-MASK logits
    float s;   // sum of exp(x - m)
    float v0, v1, v2;
    int i0, i1, i2;
};

__device__ __forceinline__ float rg_neg_inf()
{
    return __int_as_float(0xff800000);
}

__device__ __forceinline__ float rg_half_to_float(unsigned short h)
{
#if defined(__CUDA_ARCH__)
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    // Portable IEEE binary16 -> binary32 (only used when the device code is compiled for the host,
    // e.g. by the CPU emulation test; nvcc/NVRTC device passes take the branch above).
    const unsigned int sign = (unsigned int) (h & 0x8000u) << 16;
    const unsigned int ex = (h >> 10) & 0x1fu;
    const unsigned int man = h & 0x3ffu;
    unsigned int bits;
    if (ex == 0x1fu)
        bits = sign | 0x7f800000u | (man << 13);
    else if (ex != 0)
        bits = sign | ((ex + 112u) << 23) | (man << 13);
    else if (man == 0)
        bits = sign;
    else
    {
        int e = -1;
        unsigned int m = man;
        do
        {
            ++e;
            m <<= 1;
        } while ((m & 0x400u) == 0);
        bits = sign | ((unsigned int) (112 - e) << 23) | ((m & 0x3ffu) << 13);
    }
    return __int_as_float((int) bits);
#endif
}

// a ranks before b: larger value, or equal value and lower id (stable argsort of -logits).
__device__ __forceinline__ bool rg_better(float av, int ai, float bv, int bi)
{
    return av > bv || (av == bv && ai < bi);
}

__device__ __forceinline__ void rg_init(RgState& st)
{
    st.m = rg_neg_inf();
    st.s = 0.f;
    st.v0 = st.v1 = st.v2 = rg_neg_inf();
    st.i0 = st.i1 = st.i2 = RG_NO_ID;
}

// Insert (x, idx) into the sorted top-3 of st.
__device__ __forceinline__ void rg_insert(RgState& st, float x, int idx)
{
    if (!rg_better(x, idx, st.v2, st.i2))
        return;
    if (rg_better(x, idx, st.v1, st.i1))
    {
        st.v2 = st.v1;
        st.i2 = st.i1;
        if (rg_better(x, idx, st.v0, st.i0))
        {
            st.v1 = st.v0;
            st.i1 = st.i0;
            st.v0 = x;
            st.i0 = idx;
        }
        else
        {
            st.v1 = x;
            st.i1 = idx;
        }
    }
    else
    {
        st.v2 = x;
        st.i2 = idx;
    }
}

__device__ __forceinline__ void rg_consider(RgState& st, float x, int idx, int mask_id)
{
    if (idx == mask_id || x != x)  // MASK excluded; NaN ignored
        return;
    if (x != rg_neg_inf())
    {
        if (x > st.m)
        {
            st.s = st.s * __expf(st.m - x) + 1.f;
            st.m = x;
        }
        else
        {
            st.s += __expf(x - st.m);
        }
    }
    rg_insert(st, x, idx);
}

// Merge o into st: normaliser pair and the two sorted top-3 lists (ids are disjoint).
__device__ __forceinline__ void rg_merge(RgState& st, const RgState& o)
{
    float m = fmaxf(st.m, o.m);
    if (m != rg_neg_inf())
    {
        float a = (st.m == rg_neg_inf()) ? 0.f : st.s * __expf(st.m - m);
        float b = (o.m == rg_neg_inf()) ? 0.f : o.s * __expf(o.m - m);
        st.s = a + b;
        st.m = m;
    }
    // Both lists are sorted; once an element of o does not make it, the rest will not either.
    if (!rg_better(o.v0, o.i0, st.v2, st.i2))
        return;
    rg_insert(st, o.v0, o.i0);
    if (!rg_better(o.v1, o.i1, st.v2, st.i2))
        return;
    rg_insert(st, o.v1, o.i1);
    rg_insert(st, o.v2, o.i2);
}

__device__ __forceinline__ RgState rg_shfl_down(const RgState& st, int offset)
{
    RgState o;
    o.m = __shfl_down_sync(0xffffffffu, st.m, offset);
    o.s = __shfl_down_sync(0xffffffffu, st.s, offset);
    o.v0 = __shfl_down_sync(0xffffffffu, st.v0, offset);
    o.v1 = __shfl_down_sync(0xffffffffu, st.v1, offset);
    o.v2 = __shfl_down_sync(0xffffffffu, st.v2, offset);
    o.i0 = __shfl_down_sync(0xffffffffu, st.i0, offset);
    o.i1 = __shfl_down_sync(0xffffffffu, st.i1, offset);
    o.i2 = __shfl_down_sync(0xffffffffu, st.i2, offset);
    return o;
}

__device__ __forceinline__ void rg_warp_reduce(RgState& st)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
    {
        RgState o = rg_shfl_down(st, offset);
        rg_merge(st, o);
    }
}

__device__ __forceinline__ float rg_load(const float* p, int i)
{
    return p[i];
}

__device__ __forceinline__ float rg_load(const unsigned short* p, int i)
{
    return rg_half_to_float(p[i]);
}

// 16-byte vector of logits: 4 floats or 8 halves.
__device__ __forceinline__ void rg_consider_vec(RgState& st, const float* base, int vi, int mask_id)
{
    float4 q = reinterpret_cast<const float4*>(base)[vi];
    int idx = vi * 4;
    rg_consider(st, q.x, idx, mask_id);
    rg_consider(st, q.y, idx + 1, mask_id);
    rg_consider(st, q.z, idx + 2, mask_id);
    rg_consider(st, q.w, idx + 3, mask_id);
}

__device__ __forceinline__ void rg_consider_vec(RgState& st, const unsigned short* base, int vi, int mask_id)
{
    uint4 q = reinterpret_cast<const uint4*>(base)[vi];
    int idx = vi * 8;
    unsigned int w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int k = 0; k < 4; ++k)
    {
        rg_consider(st, rg_half_to_float((unsigned short) (w[k] & 0xffffu)), idx + 2 * k, mask_id);
        rg_consider(st, rg_half_to_float((unsigned short) (w[k] >> 16)), idx + 2 * k + 1, mask_id);
    }
}

template <typename T>
__device__ __forceinline__ void rg_topk_block(const T* __restrict__ logits, const int* __restrict__ lengths,
    int rows, int L, int V, int mask_id, int* __restrict__ top_ids, float* __restrict__ top_probs)
{
    const long long bid = blockIdx.x;
    const int row = (int) (bid / L);
    const int pos = (int) (bid - (long long) row * L);
    if (row >= rows)
        return;
    int* ids_out = top_ids + bid * 3;
    float* probs_out = top_probs + bid * 2;

    const int len = lengths ? lengths[row] : L;
    if (pos >= len)
    {
        if (threadIdx.x == 0)
        {
            ids_out[0] = ids_out[1] = ids_out[2] = -1;
            probs_out[0] = probs_out[1] = 0.f;
        }
        return;
    }

    const T* x = logits + bid * (long long) V;
    RgState st;
    rg_init(st);

    // Head (scalar) up to 16-byte alignment, vector body, scalar tail. Each thread visits its
    // indices in increasing order.
    const int per_vec = 16 / (int) sizeof(T);
    const unsigned long long addr = (unsigned long long) x;
    int head = 0;
    if (addr % sizeof(T) == 0)
    {
        head = (int) (((16 - addr % 16) % 16) / sizeof(T));
        if (head > V)
            head = V;
    }
    else
    {
        head = V;  // misaligned element pointer: scalar path only
    }
    for (int i = threadIdx.x; i < head; i += RG_BLOCK)
        rg_consider(st, rg_load(x, i), i, mask_id);
    const T* body = x + head;
    const int n_vec = (V - head) / per_vec;
    const int body_mask = mask_id - head;
    RgState bst;
    rg_init(bst);
    for (int vi = threadIdx.x; vi < n_vec; vi += RG_BLOCK)
        rg_consider_vec(bst, body, vi, body_mask);
    if (bst.i0 != RG_NO_ID)
    {
        // body ids are relative to `body`; shift them back
        bst.i0 += head;
        if (bst.i1 != RG_NO_ID)
            bst.i1 += head;
        if (bst.i2 != RG_NO_ID)
            bst.i2 += head;
    }
    rg_merge(st, bst);
    for (int i = head + n_vec * per_vec + threadIdx.x; i < V; i += RG_BLOCK)
        rg_consider(st, rg_load(x, i), i, mask_id);

    // Block reduction: warps, then the first warp over the warp results.
    __shared__ RgState warp_states[RG_WARPS];
    rg_warp_reduce(st);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    if (lane == 0)
        warp_states[warp] = st;
    __syncthreads();
    if (warp == 0)
    {
        if (lane < RG_WARPS)
            st = warp_states[lane];
        else
            rg_init(st);
        rg_warp_reduce(st);
        if (lane == 0)
        {
            ids_out[0] = st.i0 == RG_NO_ID ? -1 : st.i0;
            ids_out[1] = st.i1 == RG_NO_ID ? -1 : st.i1;
            ids_out[2] = st.i2 == RG_NO_ID ? -1 : st.i2;
            const bool ok = st.m != rg_neg_inf() && st.s > 0.f;
            probs_out[0] = (ok && st.i0 != RG_NO_ID) ? expf(st.v0 - st.m) / st.s : 0.f;
            probs_out[1] = (ok && st.i1 != RG_NO_ID) ? expf(st.v1 - st.m) / st.s : 0.f;
        }
    }
}

extern "C" __global__ void __launch_bounds__(RG_BLOCK) recguide_mismatch_topk_f32(
    const float* __restrict__ logits, const int* __restrict__ lengths, int rows, int L, int V,
    int mask_id, int* __restrict__ top_ids, float* __restrict__ top_probs)
{
    rg_topk_block<float>(logits, lengths, rows, L, V, mask_id, top_ids, top_probs);
}

extern "C" __global__ void __launch_bounds__(RG_BLOCK) recguide_mismatch_topk_f16(
    const unsigned short* __restrict__ logits, const int* __restrict__ lengths, int rows, int L, int V,
    int mask_id, int* __restrict__ top_ids, float* __restrict__ top_probs)
{
    rg_topk_block<unsigned short>(logits, lengths, rows, L, V, mask_id, top_ids, top_probs);
}

// One thread per row: the first risky position i >= 1 and its correction token.
extern "C" __global__ void recguide_mismatch_flag(const int* __restrict__ top_ids,
    const float* __restrict__ top_probs, const int* __restrict__ lengths, int rows, int L, int eos_id,
    float tau, int* __restrict__ flag_pos, int* __restrict__ correction)
{
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows)
        return;
    int len = lengths ? lengths[row] : L;
    len = len < 0 ? 0 : (len > L ? L : len);
    int p_out = -1;
    int c_out = -1;
    for (int i = 1; i < len; ++i)
    {
        const long long o = (long long) row * L + i;
        const float risk = 1.f - (top_probs[o * 2] - top_probs[o * 2 + 1]);
        if (risk > tau)
        {
            const int drafted = top_ids[o * 3];
            for (int k = 0; k < 3; ++k)
            {
                const int cand = top_ids[o * 3 + k];
                if (cand != drafted && cand != eos_id && cand >= 0)
                {
                    p_out = i;
                    c_out = cand;
                    break;
                }
            }
            break;  // only the first risky position counts, even without a usable correction
        }
    }
    flag_pos[row] = p_out;
    correction[row] = c_out;
}

#ifndef __CUDACC_RTC__
#include <cuda_runtime.h>

#if defined(_WIN32)
#define RG_EXPORT extern "C" __declspec(dllexport)
#else
#define RG_EXPORT extern "C" __attribute__((visibility("default")))
#endif

// Returns a cudaError_t (0 = cudaSuccess). All pointers are device pointers; nothing is synchronised.
RG_EXPORT int recguide_mismatch_predict(const void* logits, int dtype /*0=f32,1=f16*/, const int* lengths,
    int rows, int L, int V, int mask_id, int eos_id, float tau, int* top_ids /*[rows,L,3]*/,
    float* top_probs /*[rows,L,2]*/, int* flag_pos /*[rows]*/, int* correction /*[rows]*/,
    cudaStream_t stream)
{
    if (rows < 0 || L < 0 || V <= 0 || (dtype != 0 && dtype != 1))
        return (int) cudaErrorInvalidValue;
    if (rows == 0)
        return (int) cudaSuccess;
    if (flag_pos == nullptr || correction == nullptr)
        return (int) cudaErrorInvalidValue;
    if (L > 0 && (logits == nullptr || top_ids == nullptr || top_probs == nullptr))
        return (int) cudaErrorInvalidValue;
    const long long blocks = (long long) rows * L;
    if (blocks > 0x7fffffffLL)
        return (int) cudaErrorInvalidConfiguration;
    if (blocks > 0)
    {
        if (dtype == 0)
            recguide_mismatch_topk_f32<<<(unsigned) blocks, RG_BLOCK, 0, stream>>>(
                static_cast<const float*>(logits), lengths, rows, L, V, mask_id, top_ids, top_probs);
        else
            recguide_mismatch_topk_f16<<<(unsigned) blocks, RG_BLOCK, 0, stream>>>(
                static_cast<const unsigned short*>(logits), lengths, rows, L, V, mask_id, top_ids, top_probs);
        cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess)
            return (int) err;
    }
    const unsigned flag_blocks = (unsigned) ((rows + RG_FLAG_BLOCK - 1) / RG_FLAG_BLOCK);
    recguide_mismatch_flag<<<flag_blocks, RG_FLAG_BLOCK, 0, stream>>>(
        top_ids, top_probs, lengths, rows, L, eos_id, tau, flag_pos, correction);
    return (int) cudaGetLastError();
}

// Block size of the top-k kernel (for callers launching the NVRTC-compiled kernels themselves).
RG_EXPORT int recguide_mismatch_block_size(void)
{
    return RG_BLOCK;
}
#endif  // __CUDACC_RTC__
