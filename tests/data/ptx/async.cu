// Test data for the emulator: cp.async, ldmatrix and atomicAdd as nvcc writes them.
// nvcc -ptx -arch=sm_80 async.cu -o async.ptx
#include <cuda_pipeline.h>

// Each block stages 16 bytes per thread through shared memory with cp.async
// (src-size zero-fills past n bytes), then thread t writes thread (t ^ 1)'s bytes.
extern "C" __global__ void stage_swap(const int4 *src, int4 *dst, unsigned n) {
    __shared__ int4 buf[256];
    unsigned t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    unsigned have = n > 16 * i ? min(16u, n - 16 * i) : 0u;
    unsigned to = (unsigned)__cvta_generic_to_shared(&buf[t]);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(to), "l"(&src[have ? i : 0]), "r"(have) : "memory");
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    dst[i] = buf[t ^ 1];
}

// Each warp loads four 8x8 b16 matrices (rows given by a permutation) with ldmatrix.x4
// and ldmatrix.x4.trans, and writes its registers.
extern "C" __global__ void ldsm(const int4 *src, unsigned *out, const unsigned *perm) {
    __shared__ int4 tile[32];
    unsigned l = threadIdx.x;
    tile[l] = src[l];
    __syncthreads();
    unsigned a = (unsigned)__cvta_generic_to_shared(&tile[perm[l]]);
    unsigned r[8];
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[4]), "=r"(r[5]), "=r"(r[6]), "=r"(r[7]) : "r"(a));
    for (int j = 0; j < 8; j++) out[32 * j + l] = r[j];
}

// Histogram by atomicAdd (red.global.add when the result is unused).
extern "C" __global__ void histogram(const unsigned *x, int *bins, unsigned n, unsigned nbins) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&bins[x[i] % nbins], (int)x[i] - 7);
}
