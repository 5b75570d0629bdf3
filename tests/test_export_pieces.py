"""`kfactory export`'s pieces that need no judged kernel: renaming the entry, the cuda C export's build script and
its Python module's launch and driver calls (against a fake driver), and the problems whose reference cannot be
embedded in the Python module. The exports of judged kernels are tests/test_export.py's.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kfactory.export import ExportError
from kfactory.export.c import write_c
from kfactory.export.evidence import Judged
from kfactory.export.rename import RenameError, rename_entry
from kfactory.problems import load_problem
from kfactory.v1 import events_pb2 as pb


def test_rename_touches_the_entry_only():
    src = ('/* a kernel */ void kernel(int kernel_size) { const char *s = "kernel"; kernel(kernel_size); }'
           " // kernel\n")
    assert rename_entry(src, "kernel", "kf") == ('/* a kernel */ void kf(int kernel_size) { const char *s = "kernel"; '
                                                 "kf(kernel_size); } // kernel\n")
    ptx = ".visible .entry kernel(\n .param .u64 kernel_param_x\n) { ld.param.u64 %rd1, [kernel_param_x]; }"
    assert rename_entry(ptx, "kernel", "kf", "ptx").startswith(".visible .entry kf(\n .param .u64 kernel_param_x")
    with pytest.raises(RenameError, match="already uses"):
        rename_entry("void kernel(void) { int kf = 0; }", "kernel", "kf")
    with pytest.raises(ExportError):
        rename_entry("void other(void) {}", "kernel", "kf")


def test_cuda_export_builds_a_cubin_with_name(small_softmax, tmp_path):
    """The cuda C export's build script, run where NVRTC and nvJitLink are installed (no GPU needed); the
    generated module's launch rule agrees with kfactory's. The kernel is not judged here (no GPU): this tests
    the files, not a verdict, so it goes through write_c, below export()'s verification gate."""
    pytest.importorskip("cuda.bindings.nvrtc")
    from kfactory.bus import events as kev
    from kfactory.export.python import module_text
    from kfactory.targets.cuda.launch import evaluate_launch

    problem = load_problem(small_softmax)
    fam = problem.families["cuda_cu"]
    params = {"block": 256, "vec": 4, "mapping": "block", "reduce": "shfl", "passes": "online", "cache": "ldg",
              "keep": "smem", "regs": 0, "exp": "ex2"}
    assert fam.valid(params)
    source, flags, threads = fam.render(params)
    rule = json.dumps(fam.launch_rule(params), sort_keys=True)
    cid = kev.candidate_id(source, "cuda", flags, "kernel", threads, "cuda:sm_90a", rule)
    cand = pb.Candidate(id=cid, problem=small_softmax, target="cuda:sm_90a", family="cuda_cu", language="cuda",
                        compile_flags=flags, entry="kernel", threads=threads, launch_json=rule,
                        params_json=json.dumps(params, sort_keys=True))
    j = Judged(cand, source, [], compiled=[pb.Compiled(report=pb.CompileReport(arch="sm_90a"))])
    paths = write_c(j, problem, "kf_cu", tmp_path)
    assert {p.name for p in paths} == {"build.sh", "build_cubin.py", "kf_cu.cu", "kf_cu.h"}
    assert 'extern "C" __global__ void kf_cu(const float *x' in (tmp_path / "kf_cu.h").read_text()
    subprocess.run(["sh", str(tmp_path / "build.sh")], check=True, capture_output=True, timeout=300,
                   env={**os.environ, "PYTHON": sys.executable})
    from kfactory.targets.cuda.report import cubin_functions
    assert "kf_cu" in cubin_functions((tmp_path / "kf_cu.cubin").read_bytes())
    (tmp_path / "kf_cu.py").write_text(module_text(j, problem, "kf_cu"))
    namespace: dict = {"__file__": str(tmp_path / "kf_cu.py"), "__name__": "kf_cu"}
    exec(compile((tmp_path / "kf_cu.py").read_text(), "kf_cu.py", "exec"), namespace)  # noqa: S102
    for shape in problem.shapes("all"):
        want = evaluate_launch(kev.launch_of(cand), shape)
        assert namespace["_kf_launch"](shape) == (want.grid, want.block, want.smem)
    # the module's cuda path (copies, argument packing, launch, frees) against the runtime tests' fake driver,
    # whose "kernel" is a numpy softmax reading the arguments as CUDA would pass them (there is no GPU here)
    from cuda_fake import _Fake, _softmax_kernel
    from kfactory.targets.cuda import child as cuda_child
    fake = _Fake(cuda_child.cu or pytest.importorskip("cuda.bindings.driver"))
    fake.kernels["kf_cu"] = (4, _softmax_kernel)
    namespace["_kf_cuda_driver"] = lambda: fake
    x = np.random.default_rng(1).standard_normal((37, 1027), dtype=np.float32)
    y = namespace["kf_cu"](x)
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    assert np.abs(y - e / e.sum(axis=1, keepdims=True)).max() < 1e-6
    assert fake.launches == 1 and not fake.mem   # every device buffer freed


def _reference_module(problem_name: str, target: str, tmp_path: Path) -> dict:
    """The namespace of the module exported for a problem's reference kernel (not judged: only the module's
    text is under test, so this goes below export()'s verification gate)."""
    from kfactory.bus import events as kev
    from kfactory.export.python import module_text

    problem = load_problem(problem_name)
    source, flags, language, rule = problem.reference_kernel(target.split(":", 1)[0])
    launch = json.dumps(rule, sort_keys=True) if rule else ""
    cand = pb.Candidate(id=kev.candidate_id(source, language, flags, "kernel", 1, target, launch), problem=problem_name,
                        target=target, language=language, compile_flags=flags, entry="kernel", threads=1,
                        launch_json=launch)
    j = Judged(cand, source, [], compiled=[pb.Compiled(report=pb.CompileReport(arch="sm_90a"))])
    path = tmp_path / f"kf_{problem_name}.py"
    path.write_text(module_text(j, problem, f"kf_{problem_name}"))
    namespace: dict = {"__file__": str(path), "__name__": path.stem}
    exec(compile(path.read_text(), path.name, "exec"), namespace)  # noqa: S102
    return namespace


def test_problems_whose_reference_cannot_be_embedded_say_so(tmp_path):
    from kfactory.export.reference import embed

    assert embed(load_problem("softmax")).code and embed(load_problem("rmsnorm")).code
    assert _reference_module("kda", "cpu", tmp_path)["_kf_reference"] is not None
    why = embed(load_problem("kda_bf16")).why_not
    assert "kfactory" in why and "cannot be embedded" in why
    module = _reference_module("kda_bf16", "cuda:sm_90a", tmp_path)
    with pytest.raises(module["SelftestUnavailable"], match="cannot be embedded"):
        module["selftest"]()
