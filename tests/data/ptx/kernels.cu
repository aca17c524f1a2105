// Small integer CUDA kernels whose PTX (kernels.ptx, from `nvcc -ptx -arch=sm_80 kernels.cu`,
// nvcc 13.0) tests the emulator on code a real compiler wrote. Regenerate with that command.
extern "C" __global__ void vadd(const int* a, const int* b, int* c, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

extern "C" __global__ void grid_stride(const unsigned* x, unsigned* y, unsigned n) {
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
    y[i] = x[i] * 3u + 1u;
}

extern "C" __global__ void reduce(const int* x, int* out, unsigned n) {
  __shared__ int buf[256];
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  buf[threadIdx.x] = i < n ? x[i] : 0;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = buf[0];
}

extern "C" __global__ void byte_perm(const unsigned* a, const unsigned* b, const unsigned* s,
                                     unsigned* out, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __byte_perm(a[i], b[i], s[i]);
}

// 2-D grid and block, a padded shared tile, bounds checks on both sides.
extern "C" __global__ void transpose(const int* in, int* out, unsigned rows, unsigned cols) {
  __shared__ int tile[16][17];
  unsigned c = blockIdx.x * 16 + threadIdx.x, r = blockIdx.y * 16 + threadIdx.y;
  if (r < rows && c < cols) tile[threadIdx.y][threadIdx.x] = in[r * cols + c];
  __syncthreads();
  unsigned oc = blockIdx.y * 16 + threadIdx.x, orow = blockIdx.x * 16 + threadIdx.y;
  if (orow < cols && oc < rows) out[orow * rows + oc] = tile[threadIdx.x][threadIdx.y];
}

// int8 dot products: signed byte loads, a loop, multiply-add.
extern "C" __global__ void dot_s8(const signed char* x, const signed char* w, int* y,
                                  unsigned rows, unsigned k) {
  unsigned r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  int acc = 0;
  for (unsigned j = 0; j < k; ++j) acc += (int)x[r * k + j] * (int)w[j];
  y[r] = acc;
}

// Per-thread trip counts: a divergent loop that must reconverge.
extern "C" __global__ void collatz(const unsigned* x, unsigned* steps, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned v = x[i], s = 0;
  while (v > 1) {
    v = (v & 1) ? 3 * v + 1 : v >> 1;
    ++s;
  }
  steps[i] = s;
}

// Signed vs unsigned compares and shifts, selected by data.
extern "C" __global__ void compare_shift(const int* a, const int* b, unsigned* out, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int x = a[i], y = b[i];
  unsigned r = (x < y) | (((unsigned)x < (unsigned)y) << 1) | ((x >= y) << 2);
  r |= ((unsigned)(x >> (y & 31)) & 0xFF) << 8;          // arithmetic shift
  r |= (((unsigned)x >> (y & 31)) & 0xFF) << 16;         // logical shift
  out[i] = r;
}

// The reduction with its first __syncthreads() forgotten: a shared-memory race that
// lockstep execution would hide; the emulator must report it.
extern "C" __global__ void reduce_nosync(const int* x, int* out, unsigned n) {
  __shared__ int buf[256];
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  buf[threadIdx.x] = i < n ? x[i] : 0;
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = buf[0];
}
