/*
 * A CPU stand-in for the few CUDA features a rendered kfactory kernel uses, for tests on machines without a
 * GPU: the kernel's own source compiled by g++ runs one block at a time, each CUDA thread a ucontext fiber on
 * one OS thread. __syncthreads() waits for every thread of the block, __syncwarp() and each step of
 * __shfl_xor_sync() for every lane of the warp (a shuffle writes its value, waits, reads its partner's, waits).
 * The fibers run in a chosen order (one warp running ahead of the others up to each __syncthreads(), forward
 * or backward, or lanes drawn at random), so a missing barrier shows as results that change with the order. A divergent warp or block barrier (threads waiting at
 * different numbers of barriers, or a barrier some threads never reach) is reported, not hung on.
 *
 * Supported: threadIdx.x, blockIdx.{x,y}, blockDim.x, __shared__ arrays (static: one block runs at a time),
 * the dynamic shared-memory array through the pointer `kf_emu_smem` (the test rewrites the kernel's
 * `extern __shared__ float smem[];` into `float *smem = kf_emu_smem;`), __ldg, __expf, rsqrtf, __uint_as_float,
 * __shfl_xor_sync on floats, __syncwarp, __syncthreads. Not emulated: atomics, other shuffles, asm.
 */
#pragma once
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct kf_dim3 {
  unsigned x = 0, y = 0, z = 0;
};
static kf_dim3 threadIdx, blockIdx, blockDim, gridDim;
static float *kf_emu_smem = nullptr;

template <class P>
static inline P __ldg(const P *p) { return *p; }
#define __expf(x) expf(x)   /* glibc declares its own __expf */
static inline float rsqrtf(float x) { return 1.f / sqrtf(x); }
static inline float __uint_as_float(unsigned int u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

namespace kf_emu {
enum State { RUNNABLE, AT_BLOCK, AT_WARP, DONE };
struct Fiber {
  ucontext_t ctx;
  std::vector<char> stack;
  State state = RUNNABLE;
  long warp_waits = 0, block_waits = 0;
};
static ucontext_t sched;
static std::vector<Fiber> fibers;
static int cur = -1;
static std::vector<float> slots;
static std::function<void()> body;
static std::string error;

static void trampoline() {
  body();
  fibers[cur].state = DONE;
}

static inline void wait(State st) {
  Fiber &f = fibers[cur];
  f.state = st;
  (st == AT_WARP ? f.warp_waits : f.block_waits)++;
  swapcontext(&f.ctx, &sched);
}

/* Releases the warp of thread t when every lane waits at a warp barrier; false on lanes at different ones. */
static bool release_warp(int t, int threads) {
  const int lo = t & ~31, hi = std::min(threads, lo + 32);
  for (int u = lo; u < hi; u++)
    if (fibers[u].state != AT_WARP) return true;
  for (int u = lo; u < hi; u++)
    if (fibers[u].warp_waits != fibers[lo].warp_waits) {
      error = "warp " + std::to_string(lo / 32) + ": lanes at different warp barriers";
      return false;
    }
  for (int u = lo; u < hi; u++) fibers[u].state = RUNNABLE;
  return true;
}

/* One block: `threads` fibers running `fn`. The next fiber to run is the runnable one with the lowest index
 * (order 0), the highest (order 1), or one drawn at random (seed `order`); a warp runs on as soon as all its
 * lanes wait at a warp barrier, so orders 0 and 1 run one warp ahead of the others up to each __syncthreads()
 * (a missing block barrier shows), and random orders interleave lanes and warps. Returns false (and sets
 * `error`) on a divergent barrier. */
static bool run_block(int threads, unsigned order, const std::function<void()> &fn) {
  body = fn;
  fibers.assign(threads, Fiber());
  slots.assign(threads, 0.f);
  for (int t = 0; t < threads; t++) {
    Fiber &f = fibers[t];
    f.stack.resize(1 << 17);
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.data();
    f.ctx.uc_stack.ss_size = f.stack.size();
    f.ctx.uc_link = &sched;
    makecontext(&f.ctx, trampoline, 0);
  }
  std::mt19937 rng(order);
  std::vector<int> runnable;
  for (;;) {
    runnable.clear();
    for (int t = 0; t < threads; t++)
      if (fibers[t].state == RUNNABLE) runnable.push_back(t);
    if (!runnable.empty()) {
      const int t = order == 0 ? runnable.front()
                    : order == 1 ? runnable.back()
                                 : runnable[std::uniform_int_distribution<size_t>(0, runnable.size() - 1)(rng)];
      cur = t;
      threadIdx.x = t;
      swapcontext(&sched, &fibers[t].ctx);
      if (fibers[t].state == AT_WARP && !release_warp(t, threads)) return false;
      continue;
    }
    int done = 0, at_warp = 0;
    for (auto &f : fibers) {
      done += f.state == DONE;
      at_warp += f.state == AT_WARP;
    }
    if (done == threads) return true;
    if (at_warp) {
      error = "a warp barrier that not every lane of the warp reaches";
      return false;
    }
    if (done) {
      error = "__syncthreads() that some threads never reach";
      return false;
    }
    for (auto &f : fibers)
      if (f.block_waits != fibers[0].block_waits) {
        error = "threads at different __syncthreads() counts";
        return false;
      }
    for (auto &f : fibers) f.state = RUNNABLE;
  }
}
}  // namespace kf_emu

static inline void __syncthreads() { kf_emu::wait(kf_emu::AT_BLOCK); }
static inline void __syncwarp(unsigned = 0xffffffffu) { kf_emu::wait(kf_emu::AT_WARP); }
static inline float __shfl_xor_sync(unsigned, float x, int off) {
  const int t = kf_emu::cur;
  kf_emu::slots[t] = x;
  kf_emu::wait(kf_emu::AT_WARP);
  const float y = kf_emu::slots[(t & ~31) | ((t & 31) ^ off)];
  kf_emu::wait(kf_emu::AT_WARP);
  return y;
}

/* Launch over a grid (gx, gy) of blocks of `threads`, `smem` bytes of dynamic shared memory (filled with a
 * NaN pattern first, so a kernel that reads what it never wrote shows it). */
static inline bool kf_emu_launch(int gx, int gy, int threads, long smem, unsigned order,
                                 const std::function<void()> &fn) {
  std::vector<float> dyn(smem / 4 + 1);
  kf_emu_smem = dyn.data();
  blockDim.x = threads;
  gridDim.x = gx;
  gridDim.y = gy;
  for (int y = 0; y < gy; y++)
    for (int x = 0; x < gx; x++) {
      std::fill(dyn.begin(), dyn.end(), nanf(""));
      blockIdx.x = x;
      blockIdx.y = y;
      if (!kf_emu::run_block(threads, order, fn)) {
        fprintf(stderr, "cuda_emu: block (%d, %d): %s\n", x, y, kf_emu::error.c_str());
        return false;
      }
    }
  return true;
}
