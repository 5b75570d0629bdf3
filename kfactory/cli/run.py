"""`kfactory run`: a whole campaign on this machine: embedded nats-server, six services in one process."""
from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, cast

from rich.console import Console
from rich.live import Live
from rich.table import Table

from kfactory.cli import progress
from kfactory.judge.order import device_budget
from kfactory.platform.app import start_services
from kfactory.bus.natsd import EmbeddedNats
from kfactory.problems import ProblemError
from kfactory.evidence.report import format_params
from kfactory.evidence.verdicts import NOTES, Verdicts
from kfactory.observability import stagetime
from kfactory.platform.service import Context
from kfactory.services.planner.specs import SpecError, StartNotPublished, validate
from kfactory.targets import get_target

if TYPE_CHECKING:
    from kfactory.services.planner.service import PlannerService


def _progress(st, shapes: int, device_budget_s: float) -> Table:
    counts, _ = st.reported()
    snap = progress.snapshot(st, shapes, device_budget_s)
    return progress.table(f"campaign {st.id}: {st.spec.problem} on {st.spec.target} ({st.spec.strategy})", snap,
                          counts, st.in_flight())


def leaderboard_table(summary: dict, rows, verdicts: Verdicts | None = None) -> Table:
    """The campaign's fastest kernels by their own scores, each noted when it is the campaign's result or none
    (`verdicts`: kfactory/evidence/verdicts.py)."""
    t = Table(title="leaderboard")
    rows = list(rows)
    # a weighted score is a sum of medians (kfactory/judge/objective.py), not one shape's median
    scored = "score (ms)" if any(m.objective for m in rows) else "median (ms)"
    for col in ("rank", "candidate", "origin", "params", "flags", scored, "note"):
        t.add_column(col)
    campaign = summary.get("campaign_id", "")
    for i, m in enumerate(rows, 1):
        c = m.candidate
        notes = verdicts.notes(campaign, m) if verdicts else []
        t.add_row(str(i), c.id[:12], c.origin, format_params(c.params_json), c.compile_flags,
                  f"{m.score_s * 1e3:.3f}", "; ".join(NOTES[n] for n in notes))
    return t


#: the exit status of a run ended by Ctrl-C (128 + SIGINT), as shells give
EXIT_INTERRUPTED = 130


async def run_campaign(settings, spec, args) -> int:
    """Run one campaign to its end; print a leaderboard; write the report and the --json summary. The spec is
    checked before any server or service starts (a mistake is one line and exit 2, as `submit` answers it);
    Ctrl-C cancels the campaign, writes the report and summary of what finished, and exits 130 (SIGTERM: the same,
    exit 143)."""
    console = Console(stderr=True)
    if not console.is_terminal:  # a pipe or a log has no width to keep to; 80 columns fold every row's parameters
        console.width = max(console.width, 160)
    try:
        spec, note = validate(spec, settings, Context.problem, lambda t: get_target(t, settings))
    except SpecError as e:
        print(f"kfactory run: {e}", file=sys.stderr)  # one line, unwrapped, as submit's
        return 2
    if note:
        print(f"kfactory run: {note}", file=sys.stderr)
    before = stagetime.snapshot()
    with interrupts() as interrupted:
        return await _run(settings, spec, args, console, before, interrupted)


async def _run(settings, spec, args, console: Console, before, interrupted: dict) -> int:
    """run_campaign's services and campaign, under its interrupts() (see there)."""
    async with local_services(settings, embedded_nats=not args.nats_url) as running:
        if sig := interrupted["signal"]:   # during the start: nothing was submitted
            print(f"interrupted by {CANCELLING[sig]} before the campaign started", file=sys.stderr)
            return 128 + sig
        planner, memory = cast("PlannerService", running.services["planner"]), running.services["memory"]
        try:
            cid = await planner.submit(spec)
        except StartNotPublished as e:   # NATS stopped answering: one line, nothing started
            print(f"kfactory run: {e}", file=sys.stderr)
            return 1
        st = planner.campaigns[cid]
        interrupted["cancel"] = lambda why: planner.cancel(cid, why)
        if sig := interrupted["signal"]:   # between the start and the submit
            await planner.cancel(cid, f"interrupted by {CANCELLING[sig]}")
        await _follow(st, running, console, args.quiet)
        interrupted["cancel"] = None
        if (failure := running.failed()) is not None:
            raise failure
        await _wait_archived(memory, cid)
        code = _finish(settings, st, running, memory, args, console, stagetime.since(before))
        if sig := interrupted["signal"]:
            what = "was cancelled" if st.finished is not None and st.finished.state == "cancelled" else "had ended"
            print(f"interrupted: campaign {cid} {what}; the report and summary hold what finished before "
                  f"{CANCELLING[sig]}", file=sys.stderr)
            return 128 + sig   # (EXIT_INTERRUPTED for Ctrl-C; 143 for SIGTERM)
        return code


@contextlib.asynccontextmanager
async def local_services(settings, embedded_nats: bool = True):
    """The six services started in this process, memory answering, shut down on leaving; over a nats-server
    started for them when `embedded_nats` and the bus is NATS (KFACTORY_BUS=memory: no server at all), else
    over settings.nats_url."""
    nats = None
    if embedded_nats and settings.bus == "nats":
        nats = EmbeddedNats()
        settings = settings.model_copy(update={"nats_url": nats.start()})
    running = None
    try:
        running = await start_services(settings, grpc=False)
        await _memory_ready(running)
        yield running
    finally:
        if running:
            await running.shutdown()
        if nats:
            nats.stop()


#: the signals that cancel a running campaign: Ctrl-C, and what `kill`, `timeout`, docker and Kubernetes send
CANCELLING: dict[int, str] = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


@contextlib.contextmanager
def interrupts():
    """For the whole of a run (its services' start, the campaign, the report, the stop): the first Ctrl-C or
    SIGTERM is recorded ("signal") and, while a campaign runs ("cancel" set), cancels it; the run then ends as a
    cancelled campaign, with its report, and exits 128 + the signal. A second one interrupts at once, as each does
    by default. Without it SIGTERM (kill, timeout, docker, Kubernetes) ended the run where it was: no report, and
    the campaign 'running' in the archive for good."""
    loop = asyncio.get_running_loop()
    state: dict = {"signal": None, "cancel": None}

    def on_signal(sig: int) -> None:
        state["signal"] = sig
        for s in CANCELLING:
            loop.remove_signal_handler(s)
        if state["cancel"] is not None:
            loop.create_task(state["cancel"](f"interrupted by {CANCELLING[sig]}"))

    for s in CANCELLING:
        loop.add_signal_handler(s, on_signal, s)
    try:
        yield state
    finally:
        for s in CANCELLING:
            loop.remove_signal_handler(s)


async def _follow(st, running, console: Console, quiet: bool) -> None:
    """Show progress until the campaign finishes: a live table on a terminal, else a line whenever the counts or
    what the run is doing change (the line's time-left figure is as of that moment)."""
    shapes = _optimise_shapes(st.spec.problem)
    budget = device_budget(st.spec, running.services["planner"].settings.device_seconds)
    live = Live(_progress(st, shapes, budget), console=console, refresh_per_second=2) if not quiet and \
        console.is_terminal else contextlib.nullcontext()
    last = None
    with live:
        while st.finished is None and not running.stop.is_set():
            await asyncio.sleep(0.5)
            if isinstance(live, Live):
                live.update(_progress(st, shapes, budget))
            elif not quiet:
                counts, _ = st.reported()
                snap = progress.snapshot(st, shapes, budget)
                key = (str(counts), snap.best_s, snap.comparing, snap.compared)
                if key != last:
                    console.print(progress.line(snap, counts), highlight=False, soft_wrap=True)
                    last = key


def _optimise_shapes(problem: str) -> int:
    """How many shapes the final comparison times (0 when the problem no longer loads: progress then omits it)."""
    try:
        return len(Context.problem(problem).shapes("optimize"))
    except ProblemError:
        return 0


async def _memory_ready(running, timeout: float = 5.0) -> None:
    """Wait until memory answers on its loopback port, so the planner can ask it for priors."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not running.ctx.memory_addr and loop.time() < deadline and running.failed() is None:
        await asyncio.sleep(0.05)


async def _wait_archived(memory, cid: str, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        if memory.archive.q("SELECT 1 FROM campaigns WHERE id=? AND finished_ns IS NOT NULL", (cid,)):
            return
        memory.progress.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(memory.progress.wait(), 1.0)


def agent_lines(summary: dict) -> list[str]:
    """What the agent coders did, one line per persona, and why they were off or paused."""
    out = [f"agents: {summary['agent_note']}"] if summary.get("agent_note") else []
    for name, a in summary.get("agents", {}).items():
        fails = ", ".join(f"{k} {v}" for k, v in a["failures"].items())
        out.append(f"agent {name}: {a['proposed']} tasks, {a['candidates']} candidates, {a['measured']} measured, "
                   f"{a['improvements']} improvements, tokens {a['tokens_in']} in / {a['tokens_out']} out"
                   + (f"; failures: {fails}" if fails else ""))
    return out


def write_report(settings, memory, cid: str) -> Path:
    """Memory's report of campaign `cid` (report.md, plot.png) under the report dir, and a copy in the
    workspace beside the archive and the sources, which outlive this run's nats-server; the report.md path."""
    from kfactory.evidence.workspace import Workspace

    out_dir = Path(settings.report_dir) / cid
    out_dir.mkdir(parents=True, exist_ok=True)
    md, png = memory.report(cid)
    (out_dir / "report.md").write_text(md)
    (out_dir / "plot.png").write_bytes(png)
    Workspace.of(settings).write_report(cid, md, png)
    return out_dir / "report.md"


def device_line(summary: dict) -> str:
    """The device time the campaign held, in a line: its candidates' and its comparisons', and under a device
    budget what of it the search left for the comparisons and where that figure came from."""
    held, compared = summary.get("device_seconds"), summary.get("device_seconds_comparisons") or 0.0
    if held is None:
        return ""
    line = f"device time {held:.1f} s: {held - compared:.1f} s the candidates'"
    if (each := summary.get("device_seconds_per_candidate")) is not None:
        line += f" ({each:.3f} s each)"
    line += f", {compared:.1f} s the showdown and final comparison" if compared else ", no comparison"
    if budget := summary.get("device_seconds_budget"):
        n, kept = summary.get("device_seconds_reserve_campaigns", 0), summary.get("device_seconds_reserve", 0.0)
        source = f"from {n} earlier campaign{'s' if n > 1 else ''}" if n else "a share of the budget"
        line += f"; budget {budget:g} s, " + (f"of which {kept:.1f} s kept for the comparisons ({source})" if kept
                                             else "none of it kept for comparisons")
    return line


def showdown_line(sd: dict | None) -> str:
    """The showdown in a line (the summary's `showdown`): the leaderboard ranks by each candidate's own score, and
    the result may be another of its near ties, timed together after the search."""
    if not sd:
        return ""
    if sd.get("error"):
        wrong = ", ".join(cid[:12] for cid in sd.get("found_wrong") or [])
        return (f"showdown at {sd['shape']}: {sd['error']}" + (f"; found wrong, never the result: {wrong}" if wrong
                                                               else "") + "; the search's best stays the result")
    timed = sorted(sd["timed"].items(), key=lambda kv: kv[1]["median_seconds"])
    times = ", ".join(f"{cid[:12]} {t['median_seconds'] * 1e3:.3f} ms" for cid, t in timed)
    winner = sd.get("winner") or sd["search_best"]
    why = (f"; tied at {sd['shape']}, it is faster at the other optimisation shapes"
           if sd.get("decided") == "tied, faster elsewhere" else "")
    verdict = ("the search's best stays the result" if winner == sd["search_best"]
               else f"{winner[:12]} is the result (the search's best was {sd['search_best'][:12]}{why})")
    return f"showdown of the near ties at {sd['shape']}, timed together: {times}; {verdict}"


def _finish(settings, st, running, memory, args, console: Console, ledger: dict) -> int:
    summary = json.loads(st.finished.summary_json)
    # where the services' time went in this process (kfactory.observability.stagetime): compile, verify/drawing,
    # verify/references, measure/runner/kernel, lease wait, ... as {path: [seconds, times]}
    summary["stage_seconds"] = {path: [round(sec, 4), n] for path, (sec, n) in sorted(ledger.items())}
    report = write_report(settings, memory, st.id)
    summary["state"] = st.finished.state
    summary["reason"] = st.finished.reason   # why it failed, expired or was cancelled ("" when it completed)
    summary["report"] = str(report)
    summary["services"] = {name: svc.handled for name, svc in running.services.items()}
    rows = [m for m, _ in memory.archive.leaderboard(st.id, 10)]
    console.print(leaderboard_table(summary, rows, memory.archive.verdicts_around(st.id)))
    if line := showdown_line(summary.get("showdown")):
        console.print(line)
    best = summary.get("best")
    if best:
        base = ", ".join(f"{k} {v:.2f}x" for k, v in (best.get("speedup_vs_baselines") or {}).items() if v)
        ref = best.get("speedup_vs_reference")
        console.print(f"best {best['candidate_id'][:12]} at {best['shape']}: {best['median_seconds'] * 1e3:.3f} ms; "
                      f"vs reference {ref:.2f}x" + (f"; vs {base}" if base else "") if ref
                      else "best: no comparison was measured")
    for line in [*agent_lines(summary), device_line(summary)]:
        if line:
            console.print(line)
    why = f" ({st.finished.reason})" if st.finished.reason else ""
    console.print(f"state {st.finished.state}{why}; report {summary['report']}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=2))
    else:
        json.dump(summary, sys.stdout, indent=2)
        print()
    return 0 if st.finished.state == "completed" else 1
