"""A problem's scalar parameters (problem.yaml `params:`): loaded and typed, given to the reference as keyword
arguments, to the kernel as scalar arguments where the ABI lists them, to templates as Jinja variables; bad ones
refused by the loader in one line that names the file and the field; an exported kernel takes them as keyword
arguments defaulting to the problem's values.

The package here, scaleshift, computes y = x * alpha + shift: alpha is a float argument of the kernel, shift an
int that the template compiles in, so both ways a value reaches a kernel are exercised on the cpu target."""
from __future__ import annotations

import ctypes
import importlib.util
import inspect
import json
import shutil
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml

from kfactory.bus import events as ev
from kfactory.platform.config import Settings
from kfactory.export import export
from kfactory.judge.inputs import draw
from kfactory.judge.checks import InputPool
from kfactory.judge.verify import verify
from kfactory.problems import ProblemError, load_problem
from kfactory.problems.check import (
    ReferenceFailed,
    check_reference,
    problems_of,
    run_reference,
)
from kfactory.problems.params import abi_argtypes
from kfactory.targets import get_target
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb

SPEC = {
    "name": "scaleshift",
    "description": "y = x * alpha + shift elementwise; alpha is a kernel argument, shift is compiled in.",
    "symbols": ["n"],
    "inputs": [{"name": "x", "dtype": "float32", "shape": ["n"]}],
    "outputs": [{"name": "y", "dtype": "float32", "shape": ["n"]}],
    "params": {"alpha": {"type": "float", "value": 2.5, "min": 0.0, "max": 10.0, "doc": "the scale"},
               "shift": 3},
    "shapes": {"optimize": [{"n": 4096}], "verify": [{"n": 1}, {"n": 33}]},
    # x around 1 (never within 30 sigma of -1.2): y = 2.5 x + 3 stays far from 0, where one element's float32
    # rounding is a relative error over norm_rel (a right kernel failed n = 1 in about 1 of 270 draws at N(0, 1))
    "distributions": {"normal": {"x": {"kind": "normal", "mean": 1.0, "std": 0.07}}},
    "tolerance": {"float32": {"atol": 1.0e-5, "rtol": 1.0e-5, "norm_rel": 1.0e-5}},
    "cost": {"bytes": "8 * n", "flops": "2 * n"},
    "abi": {"cpu": {"signature": "void kernel(const float *x, float *y, long long n, float alpha)",
                    "args": ["x", "y", "n", "alpha"]}},
    "families": ["cpu_c"],
}
REFERENCE = textwrap.dedent('''
    import numpy as np


    def reference(inputs, *, alpha, shift):
        return {"y": inputs["x"].astype(np.float64) * alpha + shift}
''')
FAMILY = {"name": "cpu_c", "target": "cpu", "language": "c", "template": "kernel.c.j2",
          "params": {"unroll": [1, 4]}, "compile_flags": "-O2"}
TEMPLATE = textwrap.dedent('''\
    /* scaleshift: unroll {{ unroll }}; shift = {{ shift }} compiled in, alpha an argument */
    void kernel(const float *x, float *y, long long n, float alpha) {
    #pragma GCC unroll {{ unroll }}
      for (long long i = 0; i < n; i++) y[i] = x[i] * alpha + {{ shift }}.0f;
    }
''')
#: a kernel that ignores its alpha argument: right only while the problem's alpha is 2.5
HARDCODED = "void kernel(const float *x, float *y, long long n, float alpha) {\n" \
            "  for (long long i = 0; i < n; i++) y[i] = x[i] * 2.5f + 3.0f;\n}\n"


def _package(root: Path, edit=None, template: str = TEMPLATE, family_edit=None, reference: str = REFERENCE) -> Path:
    """The scaleshift package under root (edit/family_edit change the spec dicts first)."""
    spec, fam = json.loads(json.dumps(SPEC)), json.loads(json.dumps(FAMILY))
    if edit:
        edit(spec)
    if family_edit:
        family_edit(fam)
    (root / "families" / "cpu_c").mkdir(parents=True)
    (root / "problem.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    (root / "reference.py").write_text(reference)
    (root / "families" / "cpu_c" / "family.yaml").write_text(yaml.safe_dump(fam, sort_keys=False))
    (root / "families" / "cpu_c" / "kernel.c.j2").write_text(template)
    return root


@pytest.fixture(scope="module")
def pkg(tmp_path_factory) -> Path:
    return _package(tmp_path_factory.mktemp("params") / "scaleshift")


@pytest.fixture(scope="module")
def cpu(tmp_path_factory):
    """The cpu target with short runner timeouts; verification needs no measured ceilings."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("params-data"), runner_timeout_s=5.0, threads=1)
    return get_target("cpu", settings)


def _x(n: int = 33, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def _run(target, problem, sources: list[str], x: np.ndarray) -> list[np.ndarray]:
    """y of one call of each source (compiled by the target) on x, in one runner of a session of `problem`."""
    session = target.session(problem, 1)
    try:
        ys = []
        for i, source in enumerate(sources):
            res = target.compile(source, "c", "-O2", "kernel")
            assert res.ok, res.message
            session.load_artifact(f"k{i}", res.artifact, "kernel")
            ys.append(session.call(f"k{i}", {"n": x.size}, {"x": x}).outputs["y"])
        return ys
    finally:
        session.close()


def test_a_problem_with_params_loads_typed_and_describes_them(pkg):
    problem = load_problem(pkg)
    assert problem.params == {"alpha": 2.5, "shift": 3}
    assert isinstance(problem.params["alpha"], float) and type(problem.params["shift"]) is int
    assert abi_argtypes(problem, "cpu") == ["ptr", "ptr", "i64", "f32"]
    text = problem.describe()
    assert "alpha = 2.5 (float in [0.0, 10.0]): the scale" in text and "shift = 3 (int)" in text
    assert problems_of(problem) == []


def test_reference_and_template_see_the_values(pkg):
    problem = load_problem(pkg)
    x = draw(problem, {"n": 33}, "normal", 1)
    y = run_reference(problem, x, {"n": 33}, "normal")["y"]
    np.testing.assert_array_equal(y, x["x"].astype(np.float64) * 2.5 + 3)
    source, flags, _ = problem.families["cpu_c"].render({"unroll": 4})
    assert "x[i] * alpha + 3.0f" in source and "shift = 3 compiled in" in source and flags == "-O2"


def test_the_kernel_gets_the_value_and_a_changed_value_changes_the_result(pkg, cpu, tmp_path):
    problem = load_problem(pkg)
    other = load_problem(_package(tmp_path / "scaleshift", lambda s: s["params"].update(
        alpha={"type": "float", "value": 4.0, "min": 0.0, "max": 10.0}, shift=5)))
    x = _x()
    source, _, _ = problem.families["cpu_c"].render({"unroll": 1})
    other_source, _, _ = other.families["cpu_c"].render({"unroll": 1})
    assert other_source != source   # shift is compiled in: another value, another kernel
    [y] = _run(cpu, problem, [source], x)
    np.testing.assert_allclose(y, x * 2.5 + 3, rtol=1e-6)
    y_other, y_same_kernel = _run(cpu, other, [other_source, source], x)
    np.testing.assert_allclose(y_other, x * 4.0 + 5, rtol=1e-6)
    # the same compiled kernel in the other problem's session gets alpha 4.0 as its argument (shift stays 3)
    np.testing.assert_allclose(y_same_kernel, x * 4.0 + 3, rtol=1e-6)
    want = run_reference(other, {"x": x}, {"n": x.size}, "normal")["y"]
    np.testing.assert_allclose(want, x.astype(np.float64) * 4.0 + 5)


def _verdict(target, problem, source: str):
    res = target.compile(source, "c", "-O2", "kernel")
    assert res.ok, res.message
    session = target.session(problem, 1)
    try:
        session.load_artifact("k", res.artifact, "kernel")
        return verify(session, "k", problem, InputPool(problem, 1)), res
    finally:
        session.close()


def test_verification_holds_a_kernel_to_the_problems_values(pkg, cpu, tmp_path):
    """A kernel that hard-codes alpha passes while the problem says 2.5 and is wrong once it says 4.0."""
    v, _ = _verdict(cpu, load_problem(pkg), HARDCODED)
    assert v.passed, v.message
    other = load_problem(_package(tmp_path / "scaleshift", lambda s: s["params"]["alpha"].update(value=4.0)))
    v, _ = _verdict(cpu, other, HARDCODED)
    assert not v.passed and v.reason == pb.WRONG_RESULT, (v.reason, v.message)


BAD_SPECS = [
    (lambda s: s["params"].update(shift={"type": "int", "value": 2.5}), "params.shift",
     "value 2.5 is not an integer"),
    (lambda s: s["params"]["alpha"].update(value=20.0), "params.alpha",
     "value 20.0 is outside the declared range [0.0, 10.0]"),
    (lambda s: s["params"].update(alpha="1e-5"), "params.alpha", "write 1.0e-5, not 1e-5"),
    (lambda s: s["params"]["alpha"].update(type="complex"), "params.alpha.type", "'float' or 'int'"),
    (lambda s: s["params"]["alpha"].update(min=5.0, max=1.0, value=2.0), "params.alpha", "min 5.0 is above max"),
    (lambda s: s["params"].update(alpha=True), "params.alpha", "a boolean is not a parameter value"),
    (lambda s: s["params"].update(n=1), "params: ['n'] already name a tensor or a shape symbol", ""),
    (lambda s: s["params"].update(range=1), "params", "'range' cannot name a parameter"),
    (lambda s: s["params"].update(Alpha=1.0), "params", "'Alpha' and 'alpha' differ only in case"),
    (lambda s: s["abi"]["cpu"].update(signature="void kernel(const float *x, float *y, long long n, long long alpha)"),
     "abi.cpu.signature: param 'alpha'", "a float parameter is passed as float or double, not 'long long'"),
    (lambda s: s["abi"]["cpu"].update(signature="void kernel(const float *x, float *y, long long n, int shift)",
                                      args=["x", "y", "n", "shift"]) or s["params"].update(shift=2 ** 40),
     "abi.cpu.signature: param 'shift'", "value 1099511627776 does not fit its C type 'int'"),
    (lambda s: s["abi"]["cpu"]["args"].append("beta"), "abi.cpu.args: ['beta']", "neither tensors, symbols nor"),
]


@pytest.mark.parametrize("edit,field,what", BAD_SPECS)
def test_bad_params_are_refused_in_one_line_naming_file_and_field(tmp_path, edit, field, what):
    with pytest.raises(ProblemError) as e:
        load_problem(_package(tmp_path / "pkg", edit))
    msg = str(e.value)
    assert "\n" not in msg and str(tmp_path / "pkg" / "problem.yaml") in msg, msg
    assert field in msg and what in msg, msg


def test_a_template_using_an_unknown_name_is_refused_with_its_line(tmp_path):
    bad = TEMPLATE.replace("+ {{ shift }}.0f", "+ {% if unroll > 8 %}{{ shfit }}{% else %}0{% endif %}.0f")
    with pytest.raises(ProblemError) as e:
        load_problem(_package(tmp_path / "pkg", template=bad))
    msg = str(e.value)
    # a branch no point takes: StrictUndefined alone would never see it; the loader reads the whole template
    assert "\n" not in msg and f"{tmp_path / 'pkg' / 'families' / 'cpu_c' / 'kernel.c.j2'}:4:" in msg, msg
    assert "'shfit'" in msg and "(unroll)" in msg and "(alpha, shift)" in msg, msg


@pytest.mark.parametrize("family_edit,what", [
    (lambda f: f.update(compile_flags="-O{{ level }}"), "compile_flags of family cpu_c uses 'level'"),
    (lambda f: f["params"].update(alpha=[1.0, 2.0]), "params: ['alpha'] are also params of the problem"),
])
def test_family_yaml_mistakes_about_params_are_refused(tmp_path, family_edit, what):
    with pytest.raises(ProblemError) as e:
        load_problem(_package(tmp_path / "pkg", family_edit=family_edit))
    msg = str(e.value)
    assert "\n" not in msg and str(tmp_path / "pkg" / "families" / "cpu_c" / "family.yaml") in msg, msg
    assert what in msg, msg


def test_params_in_compile_flags_render(tmp_path):
    problem = load_problem(_package(tmp_path / "pkg", family_edit=lambda f: f.update(
        compile_flags="-O2 -DSHIFT={{ shift }}")))
    assert problem.families["cpu_c"].render({"unroll": 1})[1] == "-O2 -DSHIFT=3"
    assert problems_of(problem) == []   # the flag passes the whitelist


def test_a_reference_that_does_not_take_the_params_says_how_it_is_called(tmp_path):
    old = REFERENCE.replace("def reference(inputs, *, alpha, shift):", "def reference(inputs):")
    problem = load_problem(_package(tmp_path / "pkg", reference=old))
    with pytest.raises(ReferenceFailed) as e:
        check_reference(problem)
    msg = str(e.value)
    assert "\n" not in msg and "unexpected keyword argument" in msg, msg
    assert "it is called as reference(inputs, alpha=..., shift=...)" in msg, msg


def _evidence(problem_dir: Path, target, source: str) -> spb.CandidateEvidence:
    """The evidence memory would hold for `source` verified on the package: its candidate, compile, verdict."""
    problem = load_problem(problem_dir)
    v, res = _verdict(target, problem, source)
    assert v.passed, v.message
    cand_id = ev.candidate_id(source, "c", "-O2", "kernel", 1, "cpu", "")
    cand = pb.Candidate(id=cand_id, campaign_id="cparams", problem=str(problem_dir), target="cpu", language="c",
                        compile_flags="-O2", entry="kernel", threads=1, runner_threads=1, origin="manual:test")
    events = [pb.Event(campaign_id="cparams", candidate_created=pb.CandidateCreated(candidate=cand)),
              pb.Event(campaign_id="cparams", compiled=pb.Compiled(candidate=cand, report=res.report)),
              pb.Event(campaign_id="cparams", verified=pb.Verified(candidate=cand, checks=v.checks))]
    return spb.CandidateEvidence(candidate=cand, events=events, source=source)


def test_python_export_takes_the_param_defaulting_to_the_problems_value(pkg, cpu, tmp_path):
    problem = load_problem(pkg)
    source, _, _ = problem.families["cpu_c"].render({"unroll": 4})
    out = tmp_path / "out"
    written = export(_evidence(pkg, cpu, source), problem, "python", "kf_scale", out)
    assert {p.name for p in written} >= {"kf_scale.py", "kf_scale.h", "kf_scale.c", "build.sh"}
    header = (out / "kf_scale.h").read_text()
    assert "#define KF_SCALE_DEFAULT_ALPHA 2.5\n" in header and "float alpha" in header
    assert "shift = 3: compiled into the kernel, not an argument" in header
    spec = importlib.util.spec_from_file_location("kf_scale", out / "kf_scale.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["kf_scale"] = mod
    try:
        spec.loader.exec_module(mod)
        assert inspect.signature(mod.kf_scale).parameters["alpha"].default == 2.5
        assert "shift" not in inspect.signature(mod.kf_scale).parameters
        x = _x(1000, 7)
        np.testing.assert_allclose(mod.kf_scale(x), x * 2.5 + 3, rtol=1e-6)
        np.testing.assert_allclose(mod.kf_scale(x, alpha=4), x * 4.0 + 3, rtol=1e-6)
        with pytest.raises(ValueError, match=r"alpha=20.0 is outside the range \[0.0, 10.0\]"):
            mod.kf_scale(x, alpha=20.0)
        with pytest.raises(TypeError, match="alpha must be a number, not str"):
            mod.kf_scale(x, alpha="2")
        assert mod.selftest(seed=1) == 2 and mod.selftest(seed=2, alpha=7.5) == 2
        with pytest.raises(TypeError, match="shift = 3 is compiled into this kernel"):
            mod.selftest(seed=3, shift=4)
    finally:
        sys.modules.pop("kf_scale", None)


def test_cuda_child_passes_a_float_param_as_a_c_float(tmp_path, monkeypatch):
    """No GPU here: the cuda runner child's argument packing, through a stand-in for the driver's launch that
    reads each argument at the size the kernel declares (as cuLaunchKernel does), sees alpha as a C float."""
    from kfactory.sandbox.shm import ShmBuffers
    from kfactory.targets.cuda import child as cuda_child, driver
    from kfactory.targets.cuda.allocator import DevTensor
    from kfactory.targets.cuda.launch import Launch
    from kfactory.targets.cuda.program import Program
    from kfactory.sandbox.shm_args import build_argset

    def spec(s):
        s["abi"].update(cuda={
            "signature": 'extern "C" __global__ void kernel(const float *x, float *y, long long n, float alpha)',
            "args": ["x", "y", "n", "alpha"]})

    problem = load_problem(_package(tmp_path / "pkg", spec))
    argtypes = abi_argtypes(problem, "cuda")
    assert argtypes == ["ptr", "ptr", "i64", "f32"]
    child = cuda_child.CudaChild(1)
    child.kinds["k"], child.kernels["k"] = "cubin", Program("fn", argtypes, {}, 0)
    seen = {}

    class Driver:
        def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
            ptrs = (ctypes.c_void_p * 4).from_address(params)
            seen["n"] = ctypes.c_int64.from_address(ptrs[2]).value
            seen["alpha"] = ctypes.c_float.from_address(ptrs[3]).value
            return (0,)   # CUDA_SUCCESS

    monkeypatch.setattr(driver, "cu", Driver())
    with ShmBuffers() as bufs:
        argset, _ = build_argset(problem, problem.spec.abi["cuda"].args, bufs, {"n": 33}, {"x": _x()})
    assert argset[3] == {"name": "alpha", "float": 2.5}
    tensors = {n: DevTensor(n, role, "float32", (33,), 132, 0, 0, 0, np.empty(0, np.uint8))
               for n, role in (("x", "in"), ("y", "out"))}
    run = child._enqueue("k", argset, tensors, Launch((1, 1, 1), (1, 1, 1), 0), 0)
    run()
    assert seen == {"n": 33, "alpha": 2.5}


def test_rmsnorm_takes_eps_as_a_param(tmp_path):
    """The built-in rmsnorm: eps is a param, a float argument of its cuda ABI, and its reference uses it."""
    problem = load_problem("rmsnorm")
    assert problem.params == {"eps": 1e-6}
    assert abi_argtypes(problem, "cuda")[-1] == "f32"
    pkg = tmp_path / "rms"
    shutil.copytree(problem.directory, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    text = (pkg / "problem.yaml").read_text().replace("value: 1.0e-6", "value: 1.0e-2")
    text = text.replace("name: rmsnorm", "name: rmsnorm_big_eps", 1)   # another eps judges differently
    (pkg / "problem.yaml").write_text(text)
    big = load_problem(pkg)
    shape = {"rows": 3, "hidden": 33}
    x = draw(problem, shape, "tiny", 1)   # mean(x^2) ~ 1e-8: eps decides the result
    small_eps = run_reference(problem, x, shape, "tiny")["y"]
    big_eps = run_reference(big, x, shape, "tiny")["y"]
    assert np.abs(small_eps).max() > 10 * np.abs(big_eps).max()
    assert "1e-06" in problem.families["cuda_cu"].render(problem.families["cuda_cu"].first_point())[0]
