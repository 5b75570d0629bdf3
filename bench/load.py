"""Load: drive N candidates (default 10,000) through the whole pipeline and report what the factory sustains.

Six `kfactory serve` processes over a real nats-server and a real redis-server, on the replay target: every
stage does its real bus, claims and archive work (coder renders and stores the source, compiler looks the
configuration up and stores the artifact, verifier runs the judge's checks against the replayed outputs,
benchmarker takes the recorded samples through the judge's statistics, memory archives every event), and only
the device answers from a recording. The recorded space is synthetic (12,500 configurations, written here).

Prints: throughput (terminal candidates per second, overall and in the steady middle), p50/p99 latency of each
stage (from the previous stage's event to this stage's, queueing included), and each service's peak memory
(VmHWM) and CPU seconds per candidate. The service with the most CPU per candidate is the ceiling on this
machine; the ceiling's figure is 1 / (its CPU seconds per candidate) x the cores it can use.

    python bench/load.py [--candidates 10000] [--workers 8] [--parallel 256]

Measured 2026-11-30 on the 2-core dev machine shared with four other jobs (load average ~5): 10,000 candidates
in 424 s, 23.6 candidates/s (steady 22.3); 42.4 ms of CPU per candidate over the six services (benchmarker 10.1,
planner 9.1, verifier 7.5, memory 6.4, compiler 5.4, coder 3.9), i.e. the one core the run got in all: the
ceiling here is CPU, ~24 candidates/s per free core. Per stage p50/p99: coder 25/558 ms, compiler 33/1596 ms,
verifier 9726/15308 ms (the 256 points in flight queue there: 256 / 23.6 per s = 10.8 s), benchmarker 478/3300
ms. Peak RSS: planner 235 MiB (it folds every event), the others 99-110 MiB.
"""
from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from kfactory.bus.natsd import EmbeddedNats
from kfactory.services.memory.archive import Archive
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb
from kfactory.v1 import services_pb2_grpc as sgrpc

SERVICES = ("planner", "coder", "compiler", "verifier", "benchmarker", "memory")
PARAMS = {"bx": list(range(25)), "by": list(range(20)), "tile": list(range(5)), "unroll": list(range(5))}
#: (stage, the event that ends it, the event that starts it)
STAGES = (("coder", "candidate_created", "point_proposed"), ("compiler", "compiled", "candidate_created"),
          ("verifier", "verified", "compiled"), ("benchmarker", "measured", "verified"))


def write_space(directory: Path) -> Path:
    """A Kernel Tuner cache file with every configuration of PARAMS (12,500), a few of them failing."""
    directory.mkdir(parents=True, exist_ok=True)
    cache = {}
    for values in itertools.product(*PARAMS.values()):
        p = dict(zip(PARAMS, values))
        t = "RuntimeFailedConfig" if (p["bx"] * 7 + p["by"]) % 97 == 0 else \
            1.0 + 0.01 * abs(p["bx"] - 12) + 0.02 * abs(p["by"] - 7) + 0.05 * abs(p["tile"] - 2) + 0.03 * p["unroll"]
        cache[",".join(map(str, values))] = {**p, "time": t, "times": [t] * 3 if isinstance(t, float) else [],
                                             "compile_time": 1.0, "benchmark_time": 1.0}
    path = directory / "loadspace-SYNTH.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"device_name": "SYNTH", "kernel_name": "loadspace", "problem_size": [1],
                   "tune_params_keys": list(PARAMS), "tune_params": PARAMS, "objective": "time", "cache": cache}, f)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(directory: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    directory.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(directory)], stdout=subprocess.DEVNULL)
    time.sleep(0.3)
    return proc, f"redis://127.0.0.1:{port}/0"


def proc_figures(pid: int) -> tuple[float, float]:
    """(peak resident MiB, CPU seconds) of a live process, from /proc."""
    hwm = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
               if line.startswith("VmHWM:"))
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return hwm / 1024, cpu


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def stage_latencies(archive: Archive, cid: str) -> dict[str, list[float]]:
    """Per stage: seconds from the event that queued a candidate's work to the stage's own event."""
    times: dict[str, dict[str, int]] = {}
    point_of: dict[str, str] = {}
    for kind, payload, t in archive.q("SELECT kind, payload, time_ns FROM events WHERE campaign=?", (cid,)):
        e = pb.Event.FromString(payload)
        if kind == "point_proposed":
            times.setdefault(e.point_proposed.point_id, {})[kind] = t
        elif kind in ("candidate_created", "compiled", "verified", "measured"):
            cand = getattr(e, kind).candidate
            point_of[cand.id] = cand.point_id
            times.setdefault(cand.point_id, {})[kind] = t
    out: dict[str, list[float]] = {s: [] for s, _, _ in STAGES}
    for stamps in times.values():
        for stage, end, start in STAGES:
            if end in stamps and start in stamps:
                out[stage].append((stamps[end] - stamps[start]) / 1e9)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--candidates", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=8, help="messages in flight per stage service")
    ap.add_argument("--parallel", type=int, default=256, help="design points in flight (the campaign's parallel)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kf-load-"))
    space = write_space(tmp / "space")
    nats = EmbeddedNats(tmp / "nats")
    nats.start()
    redis_proc, redis_url = start_redis(tmp / "redis")
    planner_addr = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "KFACTORY_NATS_URL": nats.url, "KFACTORY_REDIS_URL": redis_url,
           "KFACTORY_PLANNER_ADDR": planner_addr, "KFACTORY_MEMORY_ADDR": f"127.0.0.1:{free_port()}",
           "KFACTORY_DATA_DIR": str(tmp / "data"), "KFACTORY_WORKERS": str(args.workers), "KFACTORY_THREADS": "1",
           "KFACTORY_LOG_LEVEL": "warning", "KFACTORY_ACK_WAIT_S": "60"}
    procs = {s: subprocess.Popen([sys.executable, "-m", "kfactory.cli.main", "serve", s], env=env,
                                 stdout=open(tmp / f"{s}.log", "wb"), stderr=subprocess.STDOUT) for s in SERVICES}
    try:
        return drive(args, space, planner_addr, procs, tmp)
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        redis_proc.terminate()
        nats.stop()
        print(f"(files in {tmp})")


def drive(args, space: Path, planner_addr: str, procs: dict, tmp: Path) -> int:
    spec = pb.CampaignSpec(problem=f"replay:{space}", target=f"replay:{space}", strategy="grid",
                           budget_candidates=args.candidates, parallel=args.parallel, seed=1, warm_start=0)
    with grpc.insecure_channel(planner_addr) as ch:
        stub = sgrpc.CampaignsStub(ch)
        grpc.channel_ready_future(ch).result(timeout=120)
        deadline = time.monotonic() + 120
        while True:  # the planner answers once it has caught up with the (empty) events stream
            try:
                cid = stub.Submit(spb.SubmitRequest(spec=spec), timeout=60).id
                break
            except grpc.RpcError:
                assert time.monotonic() < deadline, f"planner not answering; see {tmp}/planner.log"
                time.sleep(0.5)
        t0, samples, peaks = time.monotonic(), [], {}
        while True:
            s = stub.Get(spb.GetCampaignRequest(id=cid), timeout=30)
            done = s.counts.measured + s.counts.rejected + s.counts.compile_failed
            samples.append((time.monotonic() - t0, done))
            for name, p in procs.items():
                assert p.poll() is None, f"{name} died; see {tmp}/{name}.log"
                peaks[name] = proc_figures(p.pid)
            if s.state != "running":
                break
            time.sleep(1.0)
    wall = samples[-1][0]
    report(args, cid, s, samples, wall, peaks, tmp)
    return 0 if s.state == "completed" else 1


def report(args, cid: str, s, samples, wall: float, peaks: dict, tmp: Path) -> None:
    done = samples[-1][1]
    lo = next(((t, n) for t, n in samples if n >= 0.2 * done), samples[0])
    hi = next(((t, n) for t, n in samples if n >= 0.8 * done), samples[-1])
    steady = (hi[1] - lo[1]) / (hi[0] - lo[0]) if hi[0] > lo[0] else float("nan")
    time.sleep(2.0)  # memory archives the last events
    archive = Archive(tmp / "data" / "archive.sqlite")
    lat = stage_latencies(archive, cid)
    archived = archive.q("SELECT COUNT(*) FROM outcomes WHERE campaign=?", (cid,))[0][0]
    archive.close()
    c = s.counts
    print(f"campaign {cid}: {s.state}; proposed {c.proposed}, measured {c.measured}, rejected {c.rejected}, "
          f"compile_failed {c.compile_failed}; outcomes archived {archived}")
    print(f"throughput: {done / wall:.1f} candidates/s over {wall:.0f} s; steady (20%..80%): {steady:.1f} "
          f"candidates/s  [workers {args.workers}, parallel {args.parallel}, {os.cpu_count()} cpus]")
    print(f"{'stage':12s} {'n':>6s} {'p50 ms':>9s} {'p99 ms':>9s}")
    for stage, values in lat.items():
        print(f"{stage:12s} {len(values):6d} {pct(values, 0.5) * 1e3:9.1f} {pct(values, 0.99) * 1e3:9.1f}")
    print(f"{'service':12s} {'peak MiB':>9s} {'cpu s':>8s} {'cpu ms/cand':>12s}")
    for name, (mib, cpu) in peaks.items():
        print(f"{name:12s} {mib:9.1f} {cpu:8.1f} {cpu / max(done, 1) * 1e3:12.2f}")
    top = max(peaks, key=lambda n: peaks[n][1])
    print(f"ceiling: {top} uses the most CPU per candidate ({peaks[top][1] / max(done, 1) * 1e3:.2f} ms): one "
          f"process of it sustains at most {max(done, 1) / peaks[top][1]:.0f} candidates/s on one core; "
          f"total CPU across services {sum(v[1] for v in peaks.values()) / max(done, 1) * 1e3:.1f} ms/candidate "
          f"on {os.cpu_count()} shared cores")


if __name__ == "__main__":
    sys.exit(main())
