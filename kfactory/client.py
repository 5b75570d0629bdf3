"""gRPC client commands: submit, status, watch, cancel, best, report."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
from google.protobuf.json_format import MessageToDict

from kfactory import events as ev
from kfactory import security
from kfactory.grpcutil import clip
from kfactory.report import verification_table
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb
from kfactory.v1 import services_pb2_grpc as sgrpc


class ClientError(RuntimeError):
    """A client command failed; `code` is the process exit status."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def check_campaign_id(value: str, flag: str) -> None:
    """Raise ClientError (exit 2) unless `value` is a campaign id (events.CAMPAIGN_ID): anything else names no
    campaign, and in a NATS subject it would be a wildcard or several tokens."""
    if not ev.CAMPAIGN_ID.fullmatch(value):
        raise ClientError(f"{flag} {_shown(value)} is not a campaign id: 1-64 letters, digits, '_' or '-' "
                          "(kfactory status lists the campaigns)", 2)


def check_stage(value: str, flag: str = "--stage") -> None:
    """Raise ClientError (exit 2) unless `value` can be a stage's name (one subject token, as a campaign id)."""
    if not ev.CAMPAIGN_ID.fullmatch(value):
        raise ClientError(f"{flag} {_shown(value)} is not a stage name: coder, compiler, verifier, benchmarker "
                          "or agent_<persona>", 2)


def _shown(value: str) -> str:
    """A user's value as an error quotes it: its start only, when it is long."""
    return repr(value) if len(value) <= 80 else f"{value[:80]!r}... ({len(value)} characters)"


def _print(msg, as_json: bool, text: str) -> None:
    print(json.dumps(MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True),
                     indent=2) if as_json else text)


def _status_line(s: spb.CampaignStatus) -> str:
    c = s.counts
    best = f"best {s.best_candidate_id[:12]} {s.best_score_s * 1e3:.3f} ms" if s.best_candidate_id else "no best yet"
    return (f"{s.id} {s.spec.problem}/{s.spec.target} {s.state} {s.elapsed_s:.0f}s proposed {c.proposed} "
            f"compiled {c.compiled} verified {c.verified} rejected {c.rejected + c.compile_failed} "
            f"measured {c.measured}; {best}")


#: the settings client commands run with (TLS and token of the secure profile); set by dispatch()
_settings = None


async def _call(addr: str, fn):
    async with security.channel(addr, _settings) as ch:
        try:
            return await fn(ch)
        except grpc.aio.AioRpcError as e:
            code = 2 if e.code() == grpc.StatusCode.INVALID_ARGUMENT else 1
            # clipped: a server that predates grpcutil.ClipDetails may quote megabytes of the request back
            raise ClientError(f"{addr}: {e.code().name}: {clip(e.details() or '')}", code) from e


async def _watch(ch, cid: str) -> None:
    async for event in sgrpc.CampaignsStub(ch).Watch(spb.WatchRequest(id=cid)):
        kind = ev.kind_of(event)
        body = getattr(event, kind)
        cand = ev.candidate_of(event)
        extra = ""
        if kind == "measured":
            extra = f" {body.score_s * 1e3:.3f} ms"
        elif kind in ("rejected", "compile_failed"):
            extra = f" {pb.RejectReason.Name(body.reason)}"
        elif kind == "campaign_finished":
            extra = f" {body.state}"
        elif kind == "dead_letter":
            extra = f" {body.stage} after {body.deliveries} deliveries: {body.reason}"
        elif kind == "resend_answered":
            extra = f" sent back to {body.subject}" if body.accepted else f" refused: {body.reason}"
        print(f"{kind:18s} {(cand.id[:12] if cand and cand.id else ''):12s}{extra}", flush=True)


def dispatch(args, settings, spec_fn) -> int:
    """Run one client command against the addresses in settings (with its TLS and token, if any)."""
    global _settings
    _settings = settings
    return asyncio.run(_dispatch(args, settings, spec_fn))


async def _dispatch(args, settings, spec_fn) -> int:
    plan, mem, as_json = settings.planner_addr, settings.memory_addr, getattr(args, "as_json", False)
    if args.cmd == "submit":
        s = await _call(plan, lambda ch: sgrpc.CampaignsStub(ch).Submit(spb.SubmitRequest(spec=spec_fn(args))))
        _print(s, as_json, f"submitted {s.id}")
        if args.wait:
            await _call(plan, lambda ch: _watch(ch, s.id))
        return 0
    if args.cmd == "status":
        if args.id:
            s = await _call(plan, lambda ch: sgrpc.CampaignsStub(ch).Get(spb.GetCampaignRequest(id=args.id)))
            _print(s, as_json, _status_line(s))
        else:
            r = await _call(plan, lambda ch: sgrpc.CampaignsStub(ch).List(spb.ListCampaignsRequest()))
            _print(r, as_json, "\n".join(_status_line(s) for s in r.campaigns) or "no campaigns")
        return 0
    if args.cmd == "watch":
        await _call(plan, lambda ch: _watch(ch, args.id))
        return 0
    if args.cmd == "cancel":
        s = await _call(plan, lambda ch: sgrpc.CampaignsStub(ch).Cancel(spb.CancelRequest(id=args.id)))
        _print(s, as_json, _status_line(s))
        return 0
    if args.cmd == "priors":
        req = spb.PriorsRequest(problem=args.problem, families=args.family, limit=args.limit)
        r = await _call(mem, lambda ch: sgrpc.EvidenceStub(ch).Priors(req))
        _print(r, as_json, "\n".join(f"{p.relative:6.3f}x of its campaign's best  {p.score_s * 1e3:9.3f} ms  "
                                     f"{p.device}  {p.family} {p.params_json}  (campaign {p.campaign_id})"
                                     for p in r.priors) or "no priors: no campaign of this problem measured yet")
        return 0
    if args.cmd == "best":
        return await _best(args, mem, as_json)
    if args.cmd == "lessons":
        req = spb.LessonsRequest(problem=args.problem, target=args.target, limit=args.limit)
        r = await _call(mem, lambda ch: sgrpc.EvidenceStub(ch).Lessons(req))
        _print(r, as_json, r.text or f"no lessons yet: no campaign of {args.problem} is in memory")
        return 0
    if args.cmd == "report":
        check_campaign_id(args.id, "campaign")  # it names a directory too
        r = await _call(mem, lambda ch: sgrpc.EvidenceStub(ch).Report(spb.ReportRequest(campaign_id=args.id)))
        out = args.out or Path(settings.report_dir) / args.id
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.md").write_text(r.markdown)
        (out / "plot.png").write_bytes(r.plot_png)
        print(out / "report.md")
        return 0
    raise ClientError(f"unknown command {args.cmd}", 2)


async def _best(args, mem: str, as_json: bool) -> int:
    stub = lambda ch: sgrpc.EvidenceStub(ch)  # noqa: E731
    if args.candidate:
        r = await _call(mem, lambda ch: stub(ch).Candidate(spb.CandidateRequest(id=args.candidate)))
        kinds = ", ".join(ev.kind_of(e) for e in r.events)
        verdicts = [getattr(e, k) for e in r.events for k in ("verified", "rejected") if e.HasField(k)]
        table = "\n".join(verification_table(verdicts[-1].checks)) if verdicts else "no verdict yet"
        _print(r, as_json, f"{r.candidate.id} {r.candidate.origin} {r.candidate.params_json}\nevidence: {kinds}\n"
                           f"verification:\n{table}")
        return 0
    if args.campaign:
        check_campaign_id(args.campaign, "--campaign")
        r = await _call(mem, lambda ch: stub(ch).Leaderboard(spb.LeaderboardRequest(campaign_id=args.campaign)))
        _print(r, as_json, "\n".join(f"{i:3d} {e.candidate_id[:12]} {e.score_s * 1e3:9.3f} ms {e.origin} "
                                     f"{e.params_json}" for i, e in enumerate(r.entries, 1)) or "no measurements")
        return 0
    if not args.problem:
        raise ClientError("kfactory best: name a problem, or give --campaign or --candidate", 2)
    r = await _call(mem, lambda ch: stub(ch).Best(spb.BestRequest(problem=args.problem, shape=args.shape,
                                                                  device=args.device)))
    _print(r, as_json, f"{r.candidate_id} {r.score_s * 1e3:.3f} ms on {r.device} ({r.origin} {r.params_json}; "
           f"campaign {r.campaign_id})\nverification:\n" + "\n".join(verification_table(r.checks)))
    return 0
