"""Compile ahead, anywhere (issue 24, deliverable 1): `kfactory precompile` compiles softmax's and RMSNorm's cuda
points for sm_90a and sm_100a on this machine (NVRTC and nvJitLink from the wheels, no GPU), each cubin checked by
its ELF header (EM_CUDA, the SM number in e_flags) and its resource report; the cuda compiler, and the compiler
service a campaign runs, serve a bundled cubin without calling NVRTC."""
from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
from pathlib import Path

import pytest
from google.protobuf import json_format

pytest.importorskip("cuda.bindings")
cc = pytest.importorskip("kfactory.targets.cuda.compile")

from kfactory.bus import events as ev  # noqa: E402
from kfactory.targets.cuda import precompile  # noqa: E402
from kfactory.targets.cuda.report import cubin_functions  # noqa: E402
from kfactory.platform.app import start_services  # noqa: E402
from kfactory.cli.main import main  # noqa: E402
from kfactory.platform.config import Settings  # noqa: E402
from kfactory.judge.screening import prune  # noqa: E402
from kfactory.problems import load_problem  # noqa: E402
from kfactory.targets import get_target  # noqa: E402
from kfactory.v1 import events_pb2 as pb  # noqa: E402

BUILDS = [(problem, arch) for problem in ("softmax", "rmsnorm") for arch in ("sm_90a", "sm_100a")]
#: points per bundle: the reference kernel and two of the families' points (softmax: one of each of its families)
LIMIT = 3


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> Path:
    """The four bundles, written by the command itself into one folder (as gpu_check.sh carries them)."""
    root = tmp_path_factory.mktemp("precompiled")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KFACTORY_DATA_DIR", str(root / "no-workspace"))  # no evidence here: no priors to put first
        for problem, arch in BUILDS:
            rc = main(["precompile", problem, "--target", f"cuda:{arch}", "--limit", str(LIMIT),
                       "--out", str(root / f"{problem}-{arch}")])
            assert rc == 0, (problem, arch)
    return root


def _point_source(problem, point: dict) -> str:
    """The source a campaign's coder renders for a bundled point (the reference kernel's, for 'reference')."""
    if point["family"] == "reference":
        return problem.reference_kernel("cuda")[0]
    if point["family"] == "reference_f64":
        return problem.reference_f64("cuda")[0]
    if point["family"] == "judge":
        from kfactory.targets.cuda import judge_kernels
        return judge_kernels.source()
    return problem.families[point["family"]].render(point["params"])[0]


@pytest.mark.parametrize("problem_name,arch", BUILDS)
def test_each_cubin_is_an_elf_for_its_arch_with_its_resource_report(bundles, problem_name, arch):
    bundle = bundles / f"{problem_name}-{arch}"
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert (manifest["format"], manifest["version"], manifest["problem"], manifest["arch"]) == \
        (precompile.FORMAT, 1, problem_name, arch)
    assert manifest["toolchain"].startswith("nvrtc ") and manifest["target"] == f"cuda:{arch}"
    points = manifest["points"]
    # the device judge's two kernels come beside the --limit's sample of the problem's own
    judged = [p for p in points if p["family"] in precompile.JUDGE_FAMILIES]
    own = [p for p in points if p["family"] not in precompile.JUDGE_FAMILIES]
    assert [p["family"] for p in judged] == list(precompile.JUDGE_FAMILIES)
    assert len(own) + len(manifest["pruned"]) == LIMIT and len(own) >= 2
    assert own[0]["family"] == "reference" and {p["family"] for p in own[1:]} <= set(
        load_problem(problem_name).families)
    problem = load_problem(problem_name)
    for p in points:
        cubin = (bundle / p["cubin"]).read_bytes()
        assert hashlib.sha256(cubin).hexdigest() == p["cubin_sha256"]
        head = precompile.cubin_header(cubin)
        assert head["machine"] == precompile.EM_CUDA == 190 and head["sm"] == precompile.arch_sm(arch), head
        assert p["entry"] in cubin_functions(cubin)
        report = p["report"]
        assert report["arch"] == arch and 0 < report["registers"] <= 255 and int(report["artifact_bytes"]) == len(cubin)
        assert not report.get("spill_store_bytes") and not report.get("spill_load_bytes")
        assert "Compiling entry function" in p["log"]
        # the key is what the device's coder will render at this point: the same source finds this cubin there
        source = _point_source(problem, p)
        assert p["key"] == precompile.bundle_key(source, p["language"], p["flags"], p["entry"], arch)
        assert p["source_sha256"] == hashlib.sha256(source.encode()).hexdigest()
        assert prune(json_format.ParseDict(report, pb.CompileReport()), p["launch"], problem) == ""


def test_the_sm_number_tells_hopper_and_blackwell_cubins_apart(bundles):
    sms = {arch: {precompile.cubin_header(f.read_bytes())["sm"] for f in (bundles / f"softmax-{arch}").glob("cubins/*")}
           for arch in ("sm_90a", "sm_100a")}
    assert sms == {"sm_90a": {90}, "sm_100a": {100}}
    assert precompile.cubin_header(b"\x7fELF" + b"\x01" * 60) == {}  # a 32-bit ELF is no cubin


def test_what_the_resource_report_rules_out_ships_no_cubin(tmp_path):
    """A compile failure, a kernel over the shared-memory limit, and a launch whose dynamic shared memory no
    multiprocessor has are listed as pruned with the reason; only the good point gets a cubin."""
    problem = load_problem("softmax")
    good = 'extern "C" __global__ void kernel(float* y) { y[threadIdx.x] = 1.0f; }'
    big = 'extern "C" __global__ void kernel(float* y) { __shared__ float s[80000]; s[threadIdx.x] = 1; ' \
          'y[threadIdx.x] = s[threadIdx.x ^ 1]; }'
    points = [precompile.Point("x", {"n": 0}, good, "cuda", "", "kernel", {"grid": "1", "block": "32", "params": {}}),
              precompile.Point("x", {"n": 1}, good + " syntax error", "cuda", "", "kernel", None),
              precompile.Point("x", {"n": 2}, big, "cuda", "", "kernel", None),
              precompile.Point("x", {"n": 3}, good.replace("1.0f", "2.0f"), "cuda", "", "kernel",
                               {"grid": "1", "block": "32", "smem": "300000", "params": {}})]
    manifest = precompile.build(problem, "sm_90a", tmp_path / "b", points, jobs=2)
    assert [p["params"] for p in manifest["points"]] == [{"n": 0}]
    why = {p["params"]["n"]: (p["reason"], p["message"]) for p in manifest["pruned"]}
    assert why[1][0] == "COMPILE_ERROR" and why[2][0] == "RESOURCE_LIMIT", why
    assert why[3][0] == "RESOURCE_LIMIT" and "exceeds" in why[3][1], why
    assert [f.name for f in (tmp_path / "b" / "cubins").iterdir()] == [f"{manifest['points'][0]['key']}.cubin"]


def test_the_cuda_compiler_serves_a_bundled_cubin_without_nvrtc(bundles, tmp_path):
    problem = load_problem("softmax")
    settings = Settings(data_dir=tmp_path / "data", precompiled=str(bundles))
    manifest = json.loads((bundles / "softmax-sm_90a" / "manifest.json").read_text())
    point = manifest["points"][1]
    source = _point_source(problem, point)
    for arch in ("sm_90a", "sm_100a"):  # the same candidate is served per architecture, from its own bundle
        before = cc.compile_count()
        r = get_target(f"cuda:{arch}", settings).compile(source, point["language"], point["flags"], point["entry"])
        assert cc.compile_count() == before, "NVRTC ran for a bundled candidate"
        assert r.ok and r.report.compiler.endswith(f"(precompiled: softmax-{arch})"), r.report.compiler
        assert precompile.cubin_header(r.artifact)["sm"] == precompile.arch_sm(arch)
    assert r.artifact == (bundles / "softmax-sm_100a" / json.loads(
        (bundles / "softmax-sm_100a" / "manifest.json").read_text())["points"][1]["cubin"]).read_bytes()

    # a candidate no bundle holds is compiled, as without bundles
    other = source.replace("extern \"C\"", "// not bundled\nextern \"C\"", 1)
    before = cc.compile_count()
    r = get_target("cuda:sm_90a", settings).compile(other, point["language"], point["flags"], point["entry"])
    assert r.ok and cc.compile_count() == before + 1 and "precompiled" not in r.report.compiler

    # a damaged cubin is never served: its digest no longer matches, so the candidate is compiled
    copy = tmp_path / "copy"
    shutil.copytree(bundles / "softmax-sm_90a", copy / "softmax-sm_90a")
    damaged = copy / "softmax-sm_90a" / point["cubin"]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    r = get_target("cuda:sm_90a", Settings(data_dir=tmp_path / "data", precompiled=str(copy))).compile(
        source, point["language"], point["flags"], point["entry"])
    assert r.ok and cc.compile_count() == before + 2 and "precompiled" not in r.report.compiler

    # a folder whose manifest cannot be read costs compiles, never the candidate
    (copy / "softmax-sm_90a" / "manifest.json").write_text("{")
    fresh = tmp_path / "fresh"  # no compile cache of the compile above
    r = get_target("cuda:sm_90a", Settings(data_dir=fresh, precompiled=f"{copy}:{bundles}")).compile(
        source, point["language"], point["flags"], point["entry"])
    assert r.ok and cc.compile_count() == before + 3 and "precompiled" not in r.report.compiler


async def test_a_campaigns_compiler_service_serves_the_bundle(bundles, nats_url, tmp_path):
    """The compiler service, as a campaign drives it (a candidate on its work subject), publishes the bundled
    cubin with the bundle named in its compile report, and NVRTC never runs."""
    problem = load_problem("rmsnorm")
    manifest = json.loads((bundles / "rmsnorm-sm_90a" / "manifest.json").read_text())
    point = [p for p in manifest["points"] if p["family"] in problem.families][-1]
    fam = problem.families[point["family"]]
    source = fam.render(point["params"])[0]
    # no host ceilings: nothing here is measured
    settings = Settings(nats_url=nats_url, data_dir=tmp_path / "data", memory_addr="127.0.0.1:0",
                        precompiled=str(bundles))
    # the coder's role is what queues compiler work (kfactory/bus/topology.py); it has none of its own here
    running = await start_services(settings, names=("coder", "compiler", "memory"))
    try:
        bus, memory = running.ctx.bus, running.services["memory"]
        cid = "cprecompiled"
        cand = pb.Candidate(id=ev.sha256_hex(source), campaign_id=cid, problem="rmsnorm", target="cuda:sm_90a",
                            family=fam.name, params_json=json.dumps(point["params"]), language=point["language"],
                            compile_flags=point["flags"], entry=point["entry"], origin=f"template:{fam.name}",
                            launch_json=ev.canonical_json(fam.launch_rule(point["params"])))
        cand.source_digest = await bus.put_artifact(source.encode())
        spec = pb.CampaignSpec(problem="rmsnorm", target="cuda:sm_90a", budget_candidates=1)
        await bus.publish(ev.make_event(cid, "planner", "start", campaign_started=pb.CampaignStarted(spec=spec)))
        created = ev.make_event(cid, "coder", cand.id, candidate_created=pb.CandidateCreated(candidate=cand))
        await bus.publish(created)
        before = cc.compile_count()
        await bus.send_work("compiler", created)
        async with asyncio.timeout(30):
            while not (done := [e for e in memory.archive.events(campaign=cid) if ev.kind_of(e) != "campaign_started"
                                and ev.kind_of(e) != "candidate_created"]):
                assert running.failed() is None, running.failed()
                await asyncio.sleep(0.05)
        [compiled] = done
        assert compiled.HasField("compiled"), compiled
        assert compiled.compiled.report.compiler.endswith("(precompiled: rmsnorm-sm_90a)")
        assert compiled.compiled.artifact_digest == point["cubin_sha256"]
        assert cc.compile_count() == before
    finally:
        await running.shutdown()


def test_precompile_needs_a_named_architecture(tmp_path, capsys):
    assert main(["precompile", "softmax", "--target", "cuda", "--out", str(tmp_path / "b")]) == 2
    assert main(["precompile", "softmax", "--target", "cuda:sm_90a", "--limit", "0", "--out", str(tmp_path)]) == 2
    assert main(["precompile", "no_such_problem", "--target", "cuda:sm_90a", "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "name a cuda architecture" in err and "no_such_problem" in err
    assert not (tmp_path / "b").exists()
