"""`kfactory export`: a verified kernel as C, a Python module and a torch op, usable without kfactory.

Every exported kernel here was judged for real first: kfactory.cli.check.check() compiled, verified and measured it
on the small softmax package, and its evidence (CandidateEvidence) is built from that verdict, as memory would
hold it. The torch test runs where torch is importable (pip install torch; then pytest tests/test_export.py).
The pieces that need no judged kernel (renaming, the cuda export, references that cannot be embedded) are
tests/test_export_pieces.py's.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from google.protobuf.json_format import ParseDict

from conftest import KERNELS
from kfactory.cli.check import check
from kfactory.cli.main import main
from kfactory.platform.config import Settings
from kfactory.export import ExportError, NotVerified, export
from kfactory.export.c import Build, _exports_only
from kfactory.export.evidence import Judged
from kfactory.export.params import best_per_device, params_header, slug
from kfactory.problems import load_problem
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb

REPO = Path(__file__).resolve().parents[1]
FAMILY_POINT = {"passes": "online", "vec": 8, "unroll": 2, "exp": "poly", "threads": 2, "split": 0, "prefetch": 0,
                "flags": "-O3"}
THREADS = 2


def evidence_from_check(out: dict, source: str, flags: str, problem: str, family: str = "",
                        params: dict | None = None, campaign: str = "cexport") -> spb.CandidateEvidence:
    """The evidence memory would hold for a kernel `kfactory check` judged: its candidate, and one event per
    stage that ran, carrying the verdict's own figures (compile report, checks, timings, interleaved speedups)."""
    cand = pb.Candidate(id=out["candidate_id"], campaign_id=campaign, problem=problem, target=out["target"],
                        language=out["language"], compile_flags=flags, entry="kernel", threads=THREADS,
                        runner_threads=THREADS, family=family, origin=f"template:{family}" if family else "manual:test",
                        params_json=json.dumps(params, sort_keys=True) if params else "",
                        launch_json=json.dumps(out["launch"], sort_keys=True) if out["launch"] else "")
    events = [pb.Event(campaign_id=campaign, candidate_created=pb.CandidateCreated(candidate=cand))]
    if out["compiled"]:
        events.append(pb.Event(campaign_id=campaign, compiled=pb.Compiled(
            candidate=cand, report=ParseDict(out["compile"], pb.CompileReport()))))
    verdict = out["verdict"]
    if verdict is not None:
        checks = [ParseDict(c, pb.Check()) for c in verdict["checks"]]
        if verdict["passed"]:
            events.append(pb.Event(campaign_id=campaign, verified=pb.Verified(candidate=cand, checks=checks)))
        else:
            events.append(pb.Event(campaign_id=campaign, rejected=pb.Rejected(
                candidate=cand, stage="verifier", reason=pb.RejectReason.Value(verdict["reason"]),
                message=verdict["message"], checks=checks)))
    if m := out["measurement"]:
        device = ParseDict(m["device"], pb.DeviceInfo())
        timings = [ParseDict(per["candidate"], pb.ShapeTiming()) for per in m["shapes"].values()]
        events.append(pb.Event(campaign_id=campaign, measured=pb.Measured(
            candidate=cand, device=device, timings=timings, score_s=timings[0].median_s)))
        for shape, per in m["shapes"].items():
            entries = [pb.ComparisonEntry(name=n, timing=ParseDict(t, pb.ShapeTiming())) for n, t in per.items()]
            events.append(pb.Event(campaign_id=campaign, comparison=pb.Comparison(
                shape=shape, entries=entries, speedups=m["speedups"][shape], candidate_id=cand.id, device=device)))
    return spb.CandidateEvidence(candidate=cand, events=events, source=source)


@pytest.fixture(scope="module")
def judge_settings(tmp_path_factory, host_ceilings) -> Settings:
    data = tmp_path_factory.mktemp("export-data")
    shutil.copy(host_ceilings, data / "ceilings.json")
    return Settings(data_dir=data, runner_timeout_s=4.0, measure_min_s=0.05, measure_max_s=0.2, compare_max_s=0.3,
                    threads=THREADS)


@pytest.fixture(scope="module")
def judged(small_softmax, judge_settings) -> dict[str, spb.CandidateEvidence]:
    """Two kernels that passed `kfactory check` on the small softmax: the problem's reference kernel and a point
    of the cpu_c family."""
    problem = load_problem(small_softmax)
    ref_source, ref_flags = problem.reference_source("cpu")
    source, flags, _ = problem.families["cpu_c"].render(FAMILY_POINT)
    out = {}
    for key, src, fl, family, params in (("reference", ref_source, ref_flags, "", None),
                                         ("family", source, flags, "cpu_c", FAMILY_POINT)):
        verdict = check(small_softmax, "cpu", src, fl, judge_settings)
        assert verdict["verdict"]["passed"], verdict["verdict"]
        out[key] = evidence_from_check(verdict, src, fl, small_softmax, family, params)
    return out


# -- python -----------------------------------------------------------------------------------------------------

#: run in a fresh interpreter: every way to find kfactory is removed (the repository on sys.path, and the
#: editable install's meta-path finder that its .pth installed) before the exported module is imported
ISOLATED = textwrap.dedent("""
    import importlib.util, os, sys
    repo, out_dir, name = sys.argv[1:4]
    # the checkout's own paths only: a venv beside it (/tmp/ci and /tmp/civenv) shares its name's start
    inside = os.path.realpath(repo) + os.sep
    sys.path[:] = [p for p in sys.path if not (os.path.realpath(p) + os.sep).startswith(inside)]
    sys.meta_path[:] = [f for f in sys.meta_path
                        if type(f).__module__.startswith("_frozen_importlib") or not hasattr(f, "find_spec")
                        or f.find_spec("kfactory", None) is None]
    assert importlib.util.find_spec("kfactory") is None, "kfactory is still importable"
    sys.path.insert(0, out_dir)
    import numpy as np
    mod = __import__(name)
    x = np.random.default_rng().standard_normal((1000, 3000), dtype=np.float32) * 3
    y = getattr(mod, name)(x)
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    want = e / e.sum(axis=1, keepdims=True)
    assert y.shape == x.shape and y.dtype == np.float32
    err = float(np.abs(y - want).max())
    assert err <= 1e-5, err
    out = np.empty_like(x)
    assert getattr(mod, name)(x, out=out) is out and np.array_equal(out, y)
    checks = mod.selftest()
    try:
        getattr(mod, name)(x[:, ::2])
    except ValueError as e:
        contiguity = str(e)
    try:
        getattr(mod, name)(x.astype(np.float64))
    except TypeError as e:
        dtype = str(e)
    leaked = sorted(m for m in sys.modules if m == "kfactory" or m.startswith("kfactory."))
    print({"err": err, "checks": checks, "contiguity": contiguity, "dtype": dtype, "leaked": leaked})
""")


def test_python_export_runs_without_kfactory(judged, small_softmax, tmp_path):
    problem = load_problem(small_softmax)
    out_dir = tmp_path / "py"
    paths = export(judged["family"], problem, "python", "kf_softmax", out_dir)
    assert {p.name for p in paths} >= {"kf_softmax.py", "kf_softmax.c", "kf_softmax.h", "build.sh",
                                        "kf_softmax_params.h"}
    assert not (out_dir / "libkf_softmax.so").exists()   # built by the module when it is first used
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PYTHONPATH=str(out_dir), OMP_NUM_THREADS=str(THREADS))
    proc = subprocess.run([sys.executable, "-c", ISOLATED, str(REPO), str(out_dir), "kf_softmax"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = eval(proc.stdout.strip().splitlines()[-1])  # noqa: S307 - our own script's dict
    assert result["err"] <= 1e-5 and result["checks"] == 5 * 6 and result["leaked"] == []
    assert "'x'" in result["contiguity"] and "C-contiguous" in result["contiguity"]
    assert "'x'" in result["dtype"] and "float32" in result["dtype"]
    assert (out_dir / "libkf_softmax.so").is_file()


# -- c ------------------------------------------------------------------------------------------------------------

MAIN_C = r"""
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "kf_ref.h"
#include "kf_fast.h"

int main(void) {
  const int64_t rows = 37, cols = 1027;
  float *x = malloc(sizeof(float) * rows * cols), *a = malloc(sizeof(float) * rows * cols),
        *b = malloc(sizeof(float) * rows * cols);
  unsigned s = 12345;
  for (int64_t i = 0; i < rows * cols; i++) { s = s * 1103515245u + 12345u; x[i] = ((s >> 8) % 20000) / 1000.0f - 10; }
  kf_ref(x, a, rows, cols);
  kf_fast(x, b, rows, cols);
  double worst = 0, total = 0;
  for (int64_t i = 0; i < rows * cols; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (d > 1e-7 + 2e-4 * fabs((double)a[i])) { printf("differ at %ld: %g %g\n", (long)i, a[i], b[i]); return 1; }
    if (d > worst) worst = d;
    total += b[i];
  }
  printf("ok %g %g\n", worst, total / rows);
  return 0;
}
"""


def _nm_defined(lib: Path) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    return {ln.split()[-1] for ln in out.splitlines() if len(ln.split()) == 3 and ln.split()[1].isupper()}


def test_two_c_exports_link_into_one_program(judged, small_softmax, tmp_path):
    problem = load_problem(small_softmax)
    dirs = {"kf_ref": tmp_path / "ref", "kf_fast": tmp_path / "fast"}
    export(judged["reference"], problem, "c", "kf_ref", dirs["kf_ref"])
    export(judged["family"], problem, "c", "kf_fast", dirs["kf_fast"])
    for name, d in dirs.items():
        header = (d / f"{name}.h").read_text()
        cand = judged["reference" if name == "kf_ref" else "family"].candidate
        assert f"void {name}(const float *x, float *y, int64_t rows, int64_t cols);" in header
        assert cand.id in header and "checks passed" in header and "median" in header and "speedup at" in header
        subprocess.run(["sh", str(d / "build.sh")], check=True, capture_output=True, timeout=120)
        assert _nm_defined(d / f"lib{name}.so") - {"_init", "_fini", "_edata", "_end", "__bss_start"} == {name}
        assert cand.compile_flags in (d / "build.sh").read_text()
    (tmp_path / "main.c").write_text(MAIN_C)
    cmd = ["cc", "-O2", "-o", str(tmp_path / "both"), str(tmp_path / "main.c")]
    for name, d in dirs.items():
        cmd += [f"-I{d}", f"-L{d}", f"-l{name}", f"-Wl,-rpath,{d}"]
    subprocess.run(cmd + ["-lm"], check=True, capture_output=True, timeout=120)
    run = subprocess.run([str(tmp_path / "both")], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "OMP_NUM_THREADS": str(THREADS)})
    assert run.returncode == 0 and run.stdout.startswith("ok"), run.stdout + run.stderr
    assert abs(float(run.stdout.split()[2]) - 1.0) < 1e-4   # each row sums to one


def test_params_header_selects_the_device_point(judged, small_softmax, tmp_path):
    """NAME_params.h from the family kernel's real measurement: its device's block and the default block give its
    point; a second device (a prior, here only to exercise the #elif) gets its own."""
    problem = load_problem(small_softmax)
    j = Judged(judged["family"].candidate, judged["family"].source,
               [e.verified for e in judged["family"].events if e.HasField("verified")],
               measured=[e.measured for e in judged["family"].events if e.HasField("measured")])
    other = pb.Prior(family="cpu_c", params_json=json.dumps({**FAMILY_POINT, "vec": 16}), score_s=1e-3,
                     relative=1.0, device="Other CPU (64 threads)", campaign_id="cother", candidate_id="f" * 64)
    assert [p.device for p in best_per_device("cpu_c", [other], j)] == sorted(
        ["Other CPU (64 threads)", j.best_measurement().device.model])
    (tmp_path / "kf_p_params.h").write_text(params_header(j, problem, "kf_p", [other]))
    own = slug(j.best_measurement().device.model)
    for define, vec in ((f"KF_DEVICE_{own}", 8), ("KF_DEVICE_OTHER_CPU_64_THREADS", 16), ("KF_NO_SUCH_DEVICE", 8)):
        probe = tmp_path / "probe.c"
        probe.write_text(f'#define {define} 1\n#include "kf_p_params.h"\n'
                         f'_Static_assert(kf_p_vec == {vec}, "vec");\n_Static_assert(kf_p_threads == 2, "t");\n'
                         'static const char *p = kf_p_passes;\nint main(void) { return p[0] != \'o\'; }\n')
        subprocess.run(["cc", "-fsyntax-only", f"-I{tmp_path}", str(probe)], check=True, capture_output=True)


# -- refusals -----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def rejected(small_softmax, judge_settings) -> spb.CandidateEvidence:
    """A kernel `kfactory check` rejected (WRONG_RESULT)."""
    source = (KERNELS / "wrong.c").read_text()
    verdict = check(small_softmax, "cpu", source, "-O2", judge_settings)
    assert verdict["verdict"]["reason"] == "WRONG_RESULT"
    return evidence_from_check(verdict, source, "-O2", small_softmax)


def test_export_refuses_a_kernel_that_did_not_pass(rejected, judged, small_softmax, judge_settings, tmp_path):
    problem = load_problem(small_softmax)
    with pytest.raises(NotVerified, match="rejected by the verifier.*WRONG_RESULT"):
        export(rejected, problem, "c", "kf_wrong", tmp_path / "wrong")
    # compiled only: no verified event at all
    source = (KERNELS / "softmax_two_pass.c").read_text()
    compiled = check(small_softmax, "cpu", source, "-O2", judge_settings, compile_only=True)
    with pytest.raises(NotVerified, match="no verified event"):
        export(evidence_from_check(compiled, source, "-O2", small_softmax), problem, "python", "kf_x", tmp_path / "x")
    # real evidence, other source: the id no longer names the code
    tampered = spb.CandidateEvidence()
    tampered.CopyFrom(judged["reference"])
    tampered.source = tampered.source.replace("expf(xr[c] - m) / sf", "0.0f")
    with pytest.raises(NotVerified, match="evidence is of other code"):
        export(tampered, problem, "c", "kf_t", tmp_path / "t")
    assert not (tmp_path / "wrong").exists() and not (tmp_path / "x").exists() and not (tmp_path / "t").exists()

def test_a_rejection_in_a_campaign_of_another_problem_is_not_about_this_one(judged, small_softmax, tmp_path):
    """One source may be a kernel of two problems: a package copied under another name with other math rejects
    the kernels its original verified. The copy's rejection refused the export of the original's kernel, without
    saying which campaign or problem had rejected it."""
    from kfactory.export.evidence import judged as judged_as

    problem = load_problem(small_softmax)
    evidence = spb.CandidateEvidence()
    evidence.CopyFrom(judged["reference"])
    elsewhere = pb.Candidate()
    elsewhere.CopyFrom(evidence.candidate)
    elsewhere.problem, elsewhere.campaign_id = "rmsnorm", "cother"   # a campaign of another problem, after
    evidence.events.append(pb.Event(campaign_id="cother", rejected=pb.Rejected(
        candidate=elsewhere, stage="verifier", reason=pb.WRONG_RESULT, message="y[0]: 1.0 != 2.0")))
    assert export(evidence, problem, "c", "kf_both", tmp_path / "both")
    with pytest.raises(NotVerified, match=r"was rejected by the verifier in campaign cother of rmsnorm "
                                          r"\(WRONG_RESULT: y\[0\]: 1.0 != 2.0\)"):
        judged_as(evidence, "rmsnorm")
    # in a campaign of its own problem, it is refused, and the refusal says where
    elsewhere.problem = small_softmax
    evidence.events[-1].rejected.candidate.CopyFrom(elsewhere)
    with pytest.raises(NotVerified, match=f"in campaign cother of {problem.name} \\(WRONG_RESULT"):
        export(evidence, problem, "c", "kf_own", tmp_path / "own")
    # of a problem not known here (evidence imported from a GPU host's temporary copy): its verdict counts
    elsewhere.problem = str(tmp_path / "gone-host-copy" / "softmax")
    evidence.events[-1].rejected.candidate.CopyFrom(elsewhere)
    with pytest.raises(NotVerified, match="rejected by the verifier in campaign cother of softmax"):
        export(evidence, problem, "c", "kf_gone", tmp_path / "gone")



def test_cli_export_refuses_in_one_line(rejected, judged, monkeypatch, tmp_path, capsys):
    from kfactory.cli import client

    monkeypatch.setenv("KFACTORY_DATA_DIR", str(tmp_path / "workspace"))   # an empty workspace: no priors
    monkeypatch.delenv("KFACTORY_MEMORY_ADDR", raising=False)
    found = {e.candidate.id: e for e in (rejected, judged["reference"], judged["family"])}
    # the evidence query as kfactory.cli.client answers it (by id or unique prefix), over these judged kernels
    monkeypatch.setattr(client, "candidate_evidence",
                        lambda settings, ident: next(e for k, e in found.items() if k.startswith(ident)),
                        raising=False)
    assert main(["export", rejected.candidate.id, "--format", "c", "--name", "kf_w", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "WRONG_RESULT" in err
    ref = judged["reference"].candidate.id
    # not identifiers; a Python builtin (the module's function would replace it); a C library function (the
    # export's symbol would replace it in a linked program); a C header's name (NAME.h would hide it)
    for bad in ("1abc", "int", "a-b", "x" * 65, "len", "zip", "free", "memcpy", "exp", "stdlib"):
        assert main(["export", ref, "--format", "c", "--name", bad, "--out", str(tmp_path)]) == 2, bad
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
    # --shape chooses among a problem's kernels: with a candidate id it would be ignored, so it is refused
    assert main(["export", ref, "--shape", "4x8", "--format", "c", "--name", "kf_s", "--out", str(tmp_path)]) == 2
    assert "--shape" in capsys.readouterr().err and not (tmp_path / "kf_s.c").exists()
    assert main(["export", ref, "--format", "c", "--name", "kf_ok", "--out", str(tmp_path / "ok"), "--json"]) == 0
    files = json.loads(capsys.readouterr().out)["files"]
    assert {Path(f).name for f in files} == {"kf_ok.h", "kf_ok.c", "build.sh"}   # no family: no params header
    fam = judged["family"].candidate.id
    assert main(["export", fam[:16], "--format", "c", "--name", "kf_fam", "--out", str(tmp_path / "fam")]) == 0
    assert (tmp_path / "fam" / "kf_fam_params.h").is_file()


def test_a_new_export_under_the_same_name_leaves_nothing_of_the_old_one(judged, small_softmax, tmp_path):
    """A python export, then a c export of another kernel under the same name into the same directory: the old
    module, parameters header and built library are gone (the module would build the new source and call it with
    the old kernel's interface). An engine export's directory is refused."""
    problem = load_problem(small_softmax)
    out = tmp_path / "same"
    export(judged["family"], problem, "python", "kf_same", out)
    (out / "libkf_same.so").write_bytes(b"built from the family kernel")
    assert {"kf_same.py", "kf_same_params.h"} <= {p.name for p in out.iterdir()}
    written = export(judged["reference"], problem, "c", "kf_same", out)
    assert {p.name for p in out.iterdir()} == {p.name for p in written} == {"kf_same.h", "kf_same.c", "build.sh"}
    own = tmp_path / "own"   # a directory that holds no export: the user's files there stay
    own.mkdir()
    (own / "kf_own.py").write_text("# the user's own module\n")
    export(judged["reference"], problem, "c", "kf_own", own)
    assert (own / "kf_own.py").read_text() == "# the user's own module\n"
    export(judged["family"], problem, "c", "kf_own", own)   # again: the earlier export's files go, the user's stay
    assert (own / "kf_own.py").read_text() == "# the user's own module\n"
    with pytest.raises(ExportError, match=r"holds kf_own\.py, which no export of kf_own wrote"):
        export(judged["reference"], problem, "python", "kf_own", own)
    mine = tmp_path / "mine"   # files of the user's that an export would write over: refused, untouched
    mine.mkdir()
    (mine / "kf_mine.py").write_text("# mine\n")
    (mine / "kf_mine.h").write_text("/* mine */\n")
    with pytest.raises(ExportError, match=r"holds kf_mine\.h, kf_mine\.py, which no export of kf_mine wrote"):
        export(judged["reference"], problem, "python", "kf_mine", mine)
    (mine / "build.sh").write_text("#!/bin/sh\nmake\n")
    with pytest.raises(ExportError, match="holds a build.sh that no export of kf_mine wrote"):
        export(judged["reference"], problem, "c", "kf_mine", mine)
    assert {p.name: p.read_text() for p in mine.iterdir()} == {"kf_mine.py": "# mine\n", "kf_mine.h": "/* mine */\n",
                                                             "build.sh": "#!/bin/sh\nmake\n"}
    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "manifest.json").write_text('{"kind": "kfactory engine export", "name": "kf_eng"}')
    with pytest.raises(ExportError, match="engine export"):
        export(judged["reference"], problem, "c", "kf_eng", engine)
    assert sorted(p.name for p in engine.iterdir()) == ["manifest.json"]
    (engine / "manifest.json").write_text('{"name": "some web project"}')   # another project's manifest
    assert export(judged["reference"], problem, "c", "kf_eng", engine)


def test_a_file_the_user_makes_while_the_export_builds_is_not_written_over(judged, small_softmax, tmp_path,
                                                                          monkeypatch):
    """The directory was checked before the export's build (seconds: the shared object is built and its symbols
    read), and not again before writing."""
    from kfactory.export import c as cexport

    out = tmp_path / "late"
    built = cexport._exports_only

    def meanwhile(*args, **kwargs):
        source = built(*args, **kwargs)
        out.mkdir()
        (out / "kf_late.h").write_text("/* the user's, made during the build */\n")
        return source

    monkeypatch.setattr(cexport, "_exports_only", meanwhile)
    with pytest.raises(ExportError, match=r"holds kf_late\.h, which no export of kf_late wrote"):
        export(judged["reference"], load_problem(small_softmax), "c", "kf_late", out)
    assert {p.name: p.read_text() for p in out.iterdir()} == {"kf_late.h": "/* the user's, made during the build */\n"}


# -- torch --------------------------------------------------------------------------------------------------------

def test_torch_op_on_the_cpu_and_under_compile(judged, small_softmax, tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    problem = load_problem(small_softmax)
    export(judged["family"], problem, "torch", "kf_torch_softmax", tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = __import__("kf_torch_softmax_torch")
    x = torch.randn(300, 1027) * 3
    y = mod.kf_torch_softmax(x)
    assert torch.allclose(y.double(), torch.softmax(x.double(), dim=-1), atol=1e-6, rtol=1e-4)
    assert torch.equal(torch.ops.kfactory.kf_torch_softmax(x), y)
    compiled = torch.compile(lambda t: mod.kf_torch_softmax(t) * 2, fullgraph=True, backend="aot_eager")
    assert torch.allclose(compiled(x), 2 * y)
    # the schema, the fake implementation against the real one, and tracing with dynamic shapes
    torch.library.opcheck(torch.ops.kfactory.kf_torch_softmax.default, (torch.randn(5, 33),))
    with pytest.raises(TypeError, match="'x'"):
        mod.kf_torch_softmax(x.double())


# -- pieces -------------------------------------------------------------------------------------------------------

def test_global_helpers_are_renamed_so_only_name_is_exported(judged, tmp_path):
    """A source whose helpers are not static would export them, and two such kernels would interpose each
    other's helpers at run time; the exporter renames them NAME_<helper> (checked with nm)."""
    ev = judged["reference"]
    j = Judged(ev.candidate, ev.source, [], compiled=[e.compiled for e in ev.events if e.HasField("compiled")])
    source = ("#include <stdint.h>\nfloat scale = 2.0f;\nfloat twice(float v) { return scale * v; }\n"
              "void kf_h(const float *x, float *y, int64_t rows, int64_t cols) {\n"
              "  for (int64_t i = 0; i < rows * cols; i++) y[i] = twice(x[i]);\n}\n")
    from kfactory.export.c import build_sh, cpu_build
    script = build_sh(j, cpu_build(j, "kf_h"), "kf_h")
    fixed = _exports_only(j, script, source, "kf_h")
    assert "float kf_h_twice(float v) { return kf_h_scale * v; }" in fixed
    (tmp_path / "kf_h.c").write_text(fixed)
    (tmp_path / "build.sh").write_text(script)
    subprocess.run(["sh", str(tmp_path / "build.sh")], check=True, capture_output=True)
    assert _nm_defined(tmp_path / "libkf_h.so") == {"kf_h", "kf_h_twice", "kf_h_scale"}


def test_build_command_is_the_cpu_targets(judged):
    ev = judged["family"]
    j = Judged(ev.candidate, ev.source, [], compiled=[e.compiled for e in ev.events if e.HasField("compiled")])
    from kfactory.export.c import cpu_build
    build = cpu_build(j, "kf")
    compiled = j.compiler().split()
    # the compile report's command, with the output and source renamed
    assert isinstance(build, Build)
    assert [w for w in build.argv if w not in ("{cc}", "{out}", "kf.c")] == \
        [w for w in compiled[1:] if not w.endswith((".so", ".c"))]
