"""The cuda target's compile path: NVRTC + nvJitLink from the PyPI wheels, no GPU needed."""
from __future__ import annotations

import sys

import pytest

pytest.importorskip("cuda.bindings")

from kfactory.targets.cuda import arch as cuda_arch  # noqa: E402
from kfactory.targets.cuda import cubin_cache, link, nvrtc, toolchain  # noqa: E402
from kfactory.targets.cuda.arch import ARCHES, resolve_arch  # noqa: E402
from kfactory.targets.cuda.compile import compile_cuda, compile_count  # noqa: E402
from kfactory.targets.cuda.report import cubin_functions  # noqa: E402
from kfactory.targets.cuda.toolchain import CudaToolchainMissing  # noqa: E402
from kfactory.v1 import events_pb2 as pb  # noqa: E402

SOFTMAX = r"""
#define BLOCK 256
#define NEG_INF __int_as_float(0xff800000)  // NVRTC has no <math.h>: INFINITY and FLT_MAX are undefined
__device__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
float warp_sum(float v) {  // no __device__: -default-device makes it one
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
extern "C" __global__ void __launch_bounds__(BLOCK) softmax(const float* x, float* y, int n) {
    __shared__ float red[32];
    const float* row = x + (size_t)blockIdx.x * n;
    float* out = y + (size_t)blockIdx.x * n;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float m = NEG_INF;
    for (int i = threadIdx.x; i < n; i += BLOCK) m = fmaxf(m, row[i]);
    m = warp_max(m);
    if (lane == 0) red[warp] = m;
    __syncthreads();
    m = warp_max(lane < BLOCK / 32 ? red[lane] : NEG_INF);
    __syncthreads();
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += BLOCK) s += __expf(row[i] - m);
    s = warp_sum(s);
    if (lane == 0) red[warp] = s;
    __syncthreads();
    s = warp_sum(lane < BLOCK / 32 ? red[lane] : 0.f);
    for (int i = threadIdx.x; i < n; i += BLOCK) out[i] = __expf(row[i] - m) / s;
}
"""

# y[i] = x[i] * 2; .target sm_80 (not arch-specific) so the same PTX links for sm_90a and sm_100a too
PTX_DOUBLE = r"""
.version 7.0
.target sm_80
.address_size 64

.visible .entry kernel(.param .u64 x, .param .u64 y, .param .u64 n)
{
    .reg .pred %p<2>;
    .reg .f32 %f<3>;
    .reg .b32 %r<5>;
    .reg .b64 %rd<10>;

    ld.param.u64 %rd1, [x];
    ld.param.u64 %rd2, [y];
    ld.param.u64 %rd3, [n];
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mad.lo.s32 %r4, %r1, %r2, %r3;
    cvt.u64.u32 %rd4, %r4;
    setp.ge.u64 %p1, %rd4, %rd3;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd5, %rd1;
    cvta.to.global.u64 %rd6, %rd2;
    shl.b64 %rd7, %rd4, 2;
    add.s64 %rd8, %rd5, %rd7;
    ld.global.f32 %f1, [%rd8];
    add.f32 %f2, %f1, %f1;
    add.s64 %rd9, %rd6, %rd7;
    st.global.f32 [%rd9], %f2;
DONE:
    ret;
}
"""

TINY = 'extern "C" __global__ void k(float* y) { y[threadIdx.x] = 1.0f; }'


# ----------------------------------------------------------------------------------------------- successful compiles

@pytest.mark.parametrize("arch", ARCHES)
def test_softmax_compiles_with_a_resource_report(arch):
    r = compile_cuda(SOFTMAX, "cuda", "-O3 --use_fast_math -DUNUSED=1", "softmax", arch, None)
    assert r.ok, r.message + r.log
    assert r.reason == pb.REJECT_REASON_UNSPECIFIED
    assert r.artifact[:4] == b"\x7fELF"
    assert "softmax" in cubin_functions(r.artifact)
    rep = r.report
    assert rep.arch == arch and rep.compiler.endswith(f"-arch={arch}") and rep.compiler.startswith("nvrtc ")
    assert rep.artifact_bytes == len(r.artifact)
    assert 0 < rep.registers <= 255
    assert rep.shared_bytes == 32 * 4            # red[32]: ptxas's count, not nvJitLink's (+1 KiB on sm_90a)
    assert rep.spill_store_bytes == 0 and rep.spill_load_bytes == 0 and rep.stack_bytes == 0
    assert rep.seconds > 0
    assert "Compiling entry function 'softmax'" in rep.log_excerpt and len(rep.log_excerpt) <= 2000


def test_report_is_the_same_on_a_repeat():
    """nvJitLink 13.0 has a cache of its own whose hits print no ptxas lines: -no-cache keeps reports stable."""
    reports = [compile_cuda(SOFTMAX, "cuda", "--use_fast_math", "softmax", "sm_90a", None).report for _ in range(2)]
    assert reports[0].shared_bytes == reports[1].shared_bytes == 128
    assert "Compiling entry function 'softmax'" in reports[1].log_excerpt


def test_the_arch_is_in_the_cubin_header():
    """e_flags of a cubin carry the SM number: sm_90a and sm_100a cubins differ there."""
    flags = {}
    for arch in ("sm_90a", "sm_100a"):
        r = compile_cuda(TINY, "cuda", "", "k", arch, None)
        assert r.ok, r.message
        flags[arch] = int.from_bytes(r.artifact[0x30:0x34], "little")
    assert flags["sm_90a"] != flags["sm_100a"]


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_hand_written_ptx_links(arch):
    r = compile_cuda(PTX_DOUBLE, "ptx", "", "kernel", arch, None)
    assert r.ok, r.message + r.log
    assert "kernel" in cubin_functions(r.artifact)
    assert r.report.registers > 0 and r.report.shared_bytes == 0 and r.report.arch == arch
    assert r.report.artifact_bytes == len(r.artifact)


def test_register_cap_reaches_ptxas():
    """NVRTC stops at PTX, so -maxrregcount must be handed to nvJitLink to mean anything."""
    src = r'''extern "C" __global__ void k(const float* x, float* y, int n) {
        float a[48];
        for (int i = 0; i < 48; i++) a[i] = x[i * n + threadIdx.x];
        float s = 0.f;
        for (int i = 0; i < 48; i++) for (int j = 0; j < 48; j++) s += a[i] * a[j] * (i ^ j);
        y[threadIdx.x] = s;
    }'''
    free = compile_cuda(src, "cuda", "", "k", "sm_90a", None)
    capped = compile_cuda(src, "cuda", "-maxrregcount 32", "k", "sm_90a", None)
    assert free.ok and capped.ok, free.message + capped.message
    assert free.report.registers > 32
    assert capped.report.registers <= 32
    assert capped.report.spill_store_bytes > 0 or capped.report.stack_bytes > 0
    assert "-maxrregcount=32" in link.link_options("sm_90a", "-maxrregcount 32")


def test_candidate_flags_are_normalised():
    assert nvrtc.candidate_flags("-O3 --use_fast_math -DBLOCK=256 -Xptxas -v -maxrregcount 64") == [
        "--use_fast_math", "-DBLOCK=256", "-Xptxas=-v", "-maxrregcount=64"]
    assert link.link_options("sm_100a", "--ptxas-options=-O2 -DX=1") == [
        "-arch=sm_100a", "-verbose", "-Xptxas=-v", "-no-cache", "-Xptxas=-O2"]
    opts = nvrtc.nvrtc_options("sm_90a", "-DBLOCK=128")
    assert opts[:3] == ["-arch=compute_90a", "--std=c++17", "-default-device"] and opts[-1] == "-DBLOCK=128"


def test_bf16_header():
    """cuda_bf16.h is not built into NVRTC; it comes from the nvidia-cuda-runtime wheel when that is installed."""
    src = r'''#include <cuda_bf16.h>
    #include <cuda_fp16.h>
    extern "C" __global__ void k(const __nv_bfloat16* x, __half* y) {
        int i = threadIdx.x;
        y[i] = __float2half(__bfloat162float(x[i]) * 2.0f);
    }'''
    r = compile_cuda(src, "cuda", "", "k", "sm_90a", None)
    if toolchain._toolchain().header_dir:
        assert r.ok, r.message + r.log
        assert r.report.registers > 0
    else:
        assert r.reason == pb.COMPILE_ERROR and "cuda_bf16.h" in r.message


# ----------------------------------------------------------------------------------------------- typed failures

def test_syntax_error_is_a_compile_error_with_nvrtcs_words():
    r = compile_cuda('extern "C" __global__ void k(float* y) { int x = ; }', "cuda", "", "k", "sm_90a", None)
    assert not r.ok and r.reason == pb.COMPILE_ERROR
    assert "expected an expression" in r.message
    assert "expected an expression" in r.log and r.artifact == b""


def test_bad_ptx_is_a_compile_error():
    bad = ".version 7.0\n.target sm_80\n.address_size 64\n.visible .entry kernel() { foo.bar; ret; }\n"
    r = compile_cuda(bad, "ptx", "", "kernel", "sm_90a", None)
    assert not r.ok and r.reason == pb.COMPILE_ERROR
    assert "ERROR_PTX_COMPILE" in r.message and "foo" in r.log


def test_unknown_flag_is_refused_before_the_compiler():
    r = compile_cuda(TINY, "cuda", "--no-such-flag", "k", "sm_90a", None)
    assert not r.ok and r.reason == pb.STATIC_CHECK and "no-such-flag" in r.message


def test_too_much_shared_memory_is_a_resource_limit():
    src = r'''extern "C" __global__ void k(const float* x, float* y) {
        __shared__ float s[100000];
        s[threadIdx.x] = x[threadIdx.x];
        __syncthreads();
        y[threadIdx.x] = s[99999 - threadIdx.x];
    }'''
    r = compile_cuda(src, "cuda", "", "k", "sm_90a", None)
    assert not r.ok and r.reason == pb.RESOURCE_LIMIT
    assert "too much shared data" in r.message


def test_too_much_constant_memory_is_a_resource_limit():
    src = '__constant__ float c[40000];\nextern "C" __global__ void k(float* y, int n) { y[0] = c[n]; }'
    r = compile_cuda(src, "cuda", "", "k", "sm_90a", None)
    assert not r.ok and r.reason == pb.RESOURCE_LIMIT and "constant data" in r.message


def test_parameter_overflow_is_a_resource_limit():
    src = 'struct B { float a[10000]; };\nextern "C" __global__ void k(B b, float* y, int n) { y[0] = b.a[n]; }'
    r = compile_cuda(src, "cuda", "", "k", "sm_90a", None)
    assert not r.ok and r.reason == pb.RESOURCE_LIMIT and "parameter space" in r.message


@pytest.mark.parametrize("arch", ["sm_1", "sm_999", "sm_80a", "sm90", "gfx90a"])
def test_unknown_architecture(arch):
    r = compile_cuda(TINY, "cuda", "", "k", arch, None)
    assert not r.ok and r.reason == pb.UNSUPPORTED_ARCH
    assert arch in r.message or arch.replace("sm_", "compute_") in r.message
    # the PTX path must refuse too: nvJitLink itself would crash the process on some of these names
    r = compile_cuda(PTX_DOUBLE, "ptx", "", "kernel", arch, None)
    assert not r.ok and r.reason == pb.UNSUPPORTED_ARCH


def test_arch_specific_ptx_does_not_link_for_a_later_arch():
    ptx = PTX_DOUBLE.replace(".version 7.0", ".version 8.0").replace(".target sm_80", ".target sm_90a")
    assert compile_cuda(ptx, "ptx", "", "kernel", "sm_90a", None).ok
    r = compile_cuda(ptx, "ptx", "", "kernel", "sm_100a", None)
    assert not r.ok and r.reason == pb.UNSUPPORTED_ARCH and "sm_90a" in r.message


def test_missing_entry_is_a_compile_error():
    r = compile_cuda(TINY, "cuda", "", "softmax", "sm_90a", None)
    assert not r.ok and r.reason == pb.COMPILE_ERROR
    assert "'softmax'" in r.message and "'k'" in r.message
    assert r.report.registers == 0          # the report's numbers belong to the entry, and there is none


def test_mangled_entry_says_extern_c():
    r = compile_cuda("__global__ void k(float* y) { y[0] = 1.f; }", "cuda", "", "k", "sm_90a", None)
    assert not r.ok and r.reason == pb.COMPILE_ERROR
    assert 'extern "C"' in r.message and "_Z1kPf" in r.message


def test_unknown_language():
    r = compile_cuda(TINY, "c", "", "k", "sm_90a", None)
    assert not r.ok and r.reason == pb.COMPILE_ERROR and "'c'" in r.message


# ----------------------------------------------------------------------------------------------- cache

def test_cache_hit_does_not_recompile(tmp_path):
    first = compile_cuda(SOFTMAX, "cuda", "--use_fast_math", "softmax", "sm_90a", tmp_path)
    assert first.ok
    key = cubin_cache.cache_key(SOFTMAX, "cuda", "--use_fast_math", "softmax", "sm_90a")
    assert (tmp_path / f"{key}.cubin").read_bytes() == first.artifact
    assert (tmp_path / f"{key}.json").is_file()
    assert not list(tmp_path.glob("*.tmp"))
    before = compile_count()
    second = compile_cuda(SOFTMAX, "cuda", "--use_fast_math", "softmax", "sm_90a", tmp_path)
    assert compile_count() == before
    assert second.ok and second.artifact == first.artifact
    assert second.report.cached and not first.report.cached
    assert second.report.seconds < first.report.seconds
    second.report.cached, second.report.seconds = False, first.report.seconds
    assert second.report == first.report and second.log == first.log
    # any change of input is another key
    compile_cuda(SOFTMAX, "cuda", "--use_fast_math", "softmax", "sm_100a", tmp_path)
    assert compile_count() == before + 1
    assert len(list(tmp_path.glob("*.cubin"))) == 2


def test_cache_keeps_typed_failures(tmp_path):
    bad = 'extern "C" __global__ void k() { int x = ; }'
    first = compile_cuda(bad, "cuda", "", "k", "sm_90a", tmp_path)
    before = compile_count()
    second = compile_cuda(bad, "cuda", "", "k", "sm_90a", tmp_path)
    assert compile_count() == before
    assert (second.ok, second.reason, second.message) == (False, pb.COMPILE_ERROR, first.message)
    assert not list(tmp_path.glob("*.cubin"))


def test_torn_cache_entry_recompiles(tmp_path):
    first = compile_cuda(TINY, "cuda", "", "k", "sm_90a", tmp_path)
    key = cubin_cache.cache_key(TINY, "cuda", "", "k", "sm_90a")
    (tmp_path / f"{key}.cubin").write_bytes(first.artifact[:10])
    before = compile_count()
    again = compile_cuda(TINY, "cuda", "", "k", "sm_90a", tmp_path)
    assert compile_count() == before + 1 and again.artifact == first.artifact


def test_cache_key_covers_every_input():
    base = ("src", "cuda", "", "k", "sm_90a")
    keys = {cubin_cache.cache_key(*base)}
    for i, other in enumerate(["src2", "ptx", "-DX", "k2", "sm_100a"]):
        args = list(base)
        args[i] = other
        keys.add(cubin_cache.cache_key(*args))
    assert len(keys) == 6
    assert (cubin_cache.cache_key("ab", "cuda", "c", "k", "sm_90a")
            != cubin_cache.cache_key("a", "cuda", "bc", "k", "sm_90a"))


# ----------------------------------------------------------------------------------------------- resolve_arch

def _has_gpu() -> bool:
    try:
        cuda_arch._gpu0_capability()
        return True
    except ValueError:
        return False


def test_resolve_arch_named():
    assert resolve_arch("sm_90a") == "sm_90a"
    assert resolve_arch("sm_80") == "sm_80"
    assert resolve_arch("sm_999") == "sm_999"    # well formed: compile_cuda answers UNSUPPORTED_ARCH
    for bad in ("90a", "sm90", "sm_", "compute_90", "sm_90b", "sm_90a;rm"):
        with pytest.raises(ValueError, match="malformed"):
            resolve_arch(bad)


@pytest.mark.skipif(_has_gpu(), reason="a GPU is visible here")
def test_resolve_arch_without_gpu():
    with pytest.raises(ValueError, match="no GPU here: name the architecture, e.g. cuda:sm_90a"):
        resolve_arch("")


@pytest.mark.parametrize("cap,arch", [((9, 0), "sm_90a"), ((10, 0), "sm_100a"), ((8, 0), "sm_80"),
                                      ((8, 6), "sm_86"), ((12, 0), "sm_120")])
def test_resolve_arch_from_capability(monkeypatch, cap, arch):
    monkeypatch.setattr(cuda_arch, "_gpu0_capability", lambda: cap)
    assert resolve_arch("") == arch


def test_toolchain_missing(monkeypatch):
    toolchain._toolchain.cache_clear()
    monkeypatch.setitem(sys.modules, "cuda.bindings.nvrtc", None)   # `from cuda.bindings import nvrtc` fails
    try:
        with pytest.raises(CudaToolchainMissing, match="pip install cuda-bindings nvidia-cuda-nvrtc nvidia-nvjitlink"):
            compile_cuda(TINY, "cuda", "", "k", "sm_90a", None)
    finally:
        monkeypatch.undo()
        toolchain._toolchain.cache_clear()
    assert compile_cuda(TINY, "cuda", "", "k", "sm_90a", None).ok
