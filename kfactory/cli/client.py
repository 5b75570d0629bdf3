"""Client commands: submit, status, watch, cancel (the planner's Campaigns service), and best, report, priors,
lessons (memory's Evidence service).

The query commands (best, report, priors, lessons, and status) answer from a running factory when its address is
configured, that is, given by flag (--memory, --planner) or environment (KFACTORY_MEMORY_ADDR,
KFACTORY_PLANNER_ADDR); otherwise from the local workspace under KFACTORY_DATA_DIR (kfactory/evidence/workspace.py),
with no service running. Both ways answer through the same queries (kfactory/services/memory/queries.py), so with the
same answers; every id they take may be a unique prefix of it. Memory is asked through
kfactory/platform/evidence_client.py.
"""
from __future__ import annotations

import asyncio
import functools
import json
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path

import grpc
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import DecodeError

from kfactory.bus import events as ev
from kfactory.cli import EXIT_UNAVAILABLE
from kfactory.platform import security
from kfactory.platform.evidence_client import EvidenceClient
from kfactory.evidence import warm_sources
from kfactory.platform.grpcserver import clip
from kfactory.evidence.report import TITLE_RE, foreign_files, format_params, verification_table
from kfactory.evidence.verdicts import NOTES
from kfactory.services import paging
from kfactory.services.memory import queries as qmod
from kfactory.services.memory.archive import Archive, resolved_name
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb
from kfactory.v1 import services_pb2_grpc as sgrpc
from kfactory.evidence.workspace import Workspace


class ClientError(RuntimeError):
    """A client command failed; `code` is the process exit status; `status` the gRPC status it came from, if
    any."""

    def __init__(self, message: str, code: int = 1, status: grpc.StatusCode | None = None):
        super().__init__(message)
        self.code = code
        self.status = status


class NoWorkspace(ClientError):
    """No campaign has run in the local workspace (it has no archive): nothing is found there, as a memory service
    answers NOT_FOUND, and the message says where it looked."""


def check_campaign_id(value: str, flag: str) -> None:
    """Raise ClientError (exit 2) unless `value` is a campaign id (events.CAMPAIGN_ID): anything else names no
    campaign, and in a NATS subject it would be a wildcard or several tokens."""
    if not ev.CAMPAIGN_ID.fullmatch(value):
        raise ClientError(f"{flag} {_shown(value)} is not a campaign id: 1-64 letters, digits, '_' or '-' "
                          "(kfactory status lists the campaigns)", 2)


def check_stage(value: str, flag: str = "--stage") -> None:
    """Raise ClientError (exit 2) unless `value` is a work stage's name (kfactory.bus.topology: a mistyped one
    listed no dead letter, as if its stage had none)."""
    from kfactory.bus.topology import AGENT_STAGES

    if value not in (*ev.STAGES, *AGENT_STAGES):
        raise ClientError(f"{flag} {_shown(value)} is not a stage name: {', '.join((*ev.STAGES, *AGENT_STAGES))}", 2)


def _shown(value: str) -> str:
    """A user's value as an error quotes it: its start only, when it is long."""
    return repr(value) if len(value) <= 80 else f"{value[:80]!r}... ({len(value)} characters)"


def _print(msg, as_json: bool, text: str) -> None:
    print(json.dumps(MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True),
                     indent=2) if as_json else text)


def _status_line(s: spb.CampaignStatus, source: str = "") -> str:
    """One campaign's status, why it ended when it did not complete, and where it came from (`source`, when
    status lists more than one)."""
    c = s.counts
    best = f"best {s.best_candidate_id[:12]} {s.best_score_s * 1e3:.3f} ms" if s.best_candidate_id else "no best yet"
    why = f"; {s.state}: {s.reason}" if s.reason else ""
    late = _after_finish(s.after_finish)
    return (f"{s.id} {s.spec.problem}/{s.spec.target} {s.state} {s.elapsed_s:.0f}s proposed {c.proposed} "
            f"compiled {c.compiled} verified {c.verified} rejected {c.rejected + c.compile_failed} "
            f"measured {c.measured}; {best}{why}{late}" + (f"  [{source}]" if source else ""))


def _after_finish(c: pb.Counts) -> str:
    """What reached a campaign after it finished, in a clause ("" for nothing): kept, but not in its counts."""
    parts = [f"{n} {name}" for name, n in (("compiled", c.compiled), ("verified", c.verified),
                                          ("rejected", c.rejected + c.compile_failed), ("measured", c.measured)) if n]
    return f"; after it finished (not counted above): {', '.join(parts)}" if parts else ""


#: where `status` read a campaign: the planner (a running factory's campaigns), the memory service (a factory's
#: archive: what its planners ran, and what `kfactory evidence import` brought it), or the local archive (what
#: ran here, and what was imported here), which best and report read when no memory is configured
PLANNER, MEMORY, ARCHIVE = "planner", "memory", "archive"


def _status_json(s: spb.CampaignStatus, source: str) -> dict:
    return {**MessageToDict(s, preserving_proto_field_name=True, always_print_fields_with_no_presence=True),
            "source": source}


#: the settings client commands run with (TLS and token of the secure profile); set by dispatch()
_settings = None


def _client_error(addr: str, e: grpc.aio.AioRpcError) -> ClientError:
    """A service's refusal as the CLI tells it: exit code 2 for a bad request, 69 (EX_UNAVAILABLE, as `kfactory run`
    exits when the host is too busy to check a reference) for a service that cannot answer now (unreachable, NATS
    down, its host busy: the same command may succeed later), 1 otherwise."""
    code = {grpc.StatusCode.INVALID_ARGUMENT: 2, grpc.StatusCode.UNAVAILABLE: EXIT_UNAVAILABLE}.get(e.code(), 1)
    # clipped: a server that predates grpcutil.ClipDetails may quote megabytes of the request back
    return ClientError(f"{addr}: {e.code().name}: {clip(e.details() or '')}", code, e.code())


async def _call(addr: str, fn, settings=None):
    async with security.channel(addr, settings or _settings) as ch:
        try:
            return await fn(ch)
        except grpc.aio.AioRpcError as e:
            raise _client_error(addr, e) from e


async def _ask_memory(settings, method: str, request):
    """One query to the configured memory service (kfactory/platform/evidence_client.py); a refusal or no answer
    becomes a ClientError."""
    try:
        async with EvidenceClient(settings.memory_addr, settings) as memory:
            return await memory.ask(method, request)
    except grpc.aio.AioRpcError as e:
        raise _client_error(settings.memory_addr, e) from e


# -- where the answers come from: a configured service, else the local workspace ------------------------------
def memory_configured(settings) -> bool:
    """Whether the query commands ask a memory service: its address was given by --memory or
    KFACTORY_MEMORY_ADDR (the default address alone is not a factory the user named)."""
    return "memory_addr" in settings.model_fields_set and bool(settings.memory_addr)


def planner_configured(settings) -> bool:
    """Whether `status` asks the planner: its address was given by --planner or KFACTORY_PLANNER_ADDR."""
    return "planner_addr" in settings.model_fields_set and bool(settings.planner_addr)


#: the local query that answers each Evidence RPC
LOCAL_QUERY = {"Best": "best", "Leaderboard": "leaderboard", "Candidate": "candidate", "Report": "report",
               "Priors": "priors", "Lessons": "lessons", "RegressionInputs": "regression_inputs",
               "Campaigns": "campaigns"}


def _local(settings, ask: Callable[[qmod.Queries], object]):
    """Answer from the local workspace: `ask` run on Queries over its archive (opened read-only: a memory of
    this machine may be writing it) and its object store; the queries' typed errors become ClientErrors."""
    ws = Workspace.of(settings)
    try:
        archive = Archive.reader(ws.archive_path, qmod.problem_name)
    except FileNotFoundError:
        raise NoWorkspace(f"no campaign has run here yet: no archive at {ws.archive_path} (KFACTORY_DATA_DIR "
                          "names the workspace; --memory or KFACTORY_MEMORY_ADDR a running factory)", 1,
                          grpc.StatusCode.NOT_FOUND) from None
    except sqlite3.DatabaseError as e:  # opening reads its names table: a file that is no archive fails here
        raise _unreadable(ws.archive_path, e) from e
    try:
        return ask(qmod.Queries(archive, ws.get))
    except qmod.NotFound as e:   # with the status a memory service answers it with: callers tell them apart alike
        raise ClientError(str(e), 1, grpc.StatusCode.NOT_FOUND) from e
    except qmod.InvalidRequest as e:
        raise ClientError(str(e), 2, grpc.StatusCode.INVALID_ARGUMENT) from e
    except (sqlite3.DatabaseError, DecodeError) as e:  # not an archive, or damaged: say which file, not a traceback
        raise _unreadable(ws.archive_path, e) from e
    finally:
        archive.close()


class ArchiveUnreadable(ClientError):
    """The local archive is not one, or its rows do not decode (damaged on disk)."""


def _unreadable(path, e: Exception) -> ClientError:
    """The one line for an archive that is not one, or whose rows do not decode (damaged on disk)."""
    return ArchiveUnreadable(f"cannot read the archive {path}: {type(e).__name__}: {e} (a damaged or foreign file: "
                             "restore it, or point KFACTORY_DATA_DIR at another workspace)", 1)


async def _evidence(settings, method: str, request):
    """One Evidence query: through the memory service when it is configured, else from the local workspace."""
    if memory_configured(settings):
        return await _ask_memory(settings, method, request)
    return _local(settings, lambda q: getattr(q, LOCAL_QUERY[method])(request))


def candidate_evidence(settings, id_or_prefix: str) -> spb.CandidateEvidence:
    """One candidate's evidence (candidate, events, lineage, source) by its id or a unique prefix of it, from the
    memory service when it is configured (memory_configured), else from the local workspace. Raises ClientError
    (code 1: no such candidate, or no answer; code 2: an ambiguous prefix, listing the matches). Call it outside
    a running event loop."""
    return asyncio.run(_evidence(settings, "Candidate", spb.CandidateRequest(id=id_or_prefix)))


def best_entry(settings, problem: str, shape: str = "", target: str = "") -> spb.LeaderboardEntry:
    """The best kernel of a problem as memory's Best answers (kfactory/services/memory/archive.py Archive.best: what
    campaigns finished with, or the fastest measured at `shape`; for `target`: "cuda" takes any cuda target,
    "cuda:sm_90a" only that one), with its verdict's figures, local or remote as candidate_evidence. Raises
    ClientError (code 1: nothing measured). Call it outside a running event loop."""
    return asyncio.run(_best_entry(settings, problem, shape, target))


async def _best_entry(settings, problem: str, shape: str, target: str) -> spb.LeaderboardEntry:
    return await _evidence(settings, "Best", spb.BestRequest(problem=problem, shape=shape, target=target))


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


def _check_text(args) -> None:
    """Raise ClientError (exit 2) for an argument that is no text (bytes the locale could not decode reach Python
    as lone surrogates, which no request, and no query of the archive, can carry)."""
    for name, value in vars(args).items():
        if isinstance(value, str):
            try:
                value.encode()
            except UnicodeEncodeError:
                shown = value.encode(errors="backslashreplace").decode()
                raise ClientError(f"the {name} argument ({shown[:80]}) is not valid UTF-8 text", 2) from None


async def _dispatch(args, settings, spec_fn) -> int:
    _check_text(args)
    plan, as_json = settings.planner_addr, getattr(args, "as_json", False)
    if args.cmd == "submit":
        s = await _call(plan, lambda ch: sgrpc.CampaignsStub(ch).Submit(spb.SubmitRequest(spec=spec_fn(args))))
        _print(s, as_json, f"submitted {s.id}")
        if args.wait:
            await _call(plan, lambda ch: _watch(ch, s.id))
        return 0
    if args.cmd == "status":
        both = planner_configured(settings)   # the planner's and an archive's: each marked where it came from
        if args.id:
            s, source = await _status_of(settings, args.id)
            print(json.dumps(_status_json(s, source), indent=2) if as_json else
                  _status_line(s, source if both else ""))
        else:
            listed = await _status_list(settings)
            print(json.dumps({"campaigns": [_status_json(s, source) for s, source in listed]}, indent=2) if as_json
                  else "\n".join(_status_line(s, source if both else "") for s, source in listed) or "no campaigns")
        return 0
    if args.cmd == "watch":
        cid = (await _campaign_status(settings, args.id)).id   # a unique prefix, as status takes it
        await _call(plan, lambda ch: _watch(ch, cid))
        return 0
    if args.cmd == "cancel":
        cid = (await _campaign_status(settings, args.id)).id
        s = await _call(plan, lambda ch: sgrpc.CampaignsStub(ch).Cancel(spb.CancelRequest(id=cid)))
        _print(s, as_json, _status_line(s))
        return 0
    if args.cmd == "priors":
        families = _priors_families(args)
        r = await _evidence(settings, "Priors", spb.PriorsRequest(problem=args.problem, families=families,
                                                                  limit=args.limit,
                                                                  require_known=not loads_here(args.problem)))
        trust = await _warm_trust(settings, args, families)  # which sources a new campaign would trust, and why
        if as_json:
            print(json.dumps({**MessageToDict(r, preserving_proto_field_name=True,
                                              always_print_fields_with_no_presence=True), "trust": trust}, indent=2))
            return 0
        print("\n".join(f"{p.relative:6.3f}x of its campaign's best  {p.score_s * 1e3:9.3f} ms  "
                        f"{p.device}  {p.family} {format_params(p.params_json)}  "
                        f"(campaign {p.campaign_id})"
                        for p in r.priors) or "no priors: no campaign of this problem measured yet")
        print(warm_sources.priors_text(trust))
        return 0
    if args.cmd == "best":
        return await _best(args, settings, as_json)
    if args.cmd == "lessons":
        req = spb.LessonsRequest(problem=args.problem, target=args.target, limit=args.limit,
                                 require_known=not loads_here(args.problem))
        r = await _evidence(settings, "Lessons", req)
        on = f" on {args.target}" if args.target else ""
        _print(r, as_json, r.text or f"no lessons yet: no campaign of {args.problem}{on} is in memory")
        return 0
    if args.cmd == "report":
        check_campaign_id(args.id, "campaign")  # it names a directory too
        r = await _evidence(settings, "Report", spb.ReportRequest(campaign_id=args.id))
        cid = _report_campaign(r, args.id)
        out = args.out or Path(settings.report_dir) / cid
        if theirs := foreign_files(out):
            raise ClientError(f"{out} holds {', '.join(theirs)}, which no report wrote: the report would write over "
                              "it; choose another --out", 2)
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.md").write_text(r.markdown)
        (out / "plot.png").write_bytes(r.plot_png)
        print(json.dumps({"campaign_id": cid, "report": str(out / "report.md")}) if as_json else out / "report.md")
        return 0
    raise ClientError(f"unknown command {args.cmd}", 2)


def loads_here(problem: str) -> bool:
    """Whether `problem` is a problem on this machine (a built-in's name, a package directory that loads, a replay
    or engine locator). A query about one that is not asks the evidence to know it (require_known): a name no
    archived campaign ran is then a usage error naming it, not an empty answer (a mistyped name)."""
    from kfactory.problems import ProblemError, load_problem

    try:
        load_problem(problem)
    except ProblemError:
        return False
    return True


def _report_campaign(r: spb.ReportResponse, asked: str) -> str:
    """The full id of the campaign a report is of (`asked` may be a prefix of it): the response's campaign_id, or,
    from a memory that predates that field, the report's title (else the id as asked)."""
    if r.campaign_id and ev.CAMPAIGN_ID.fullmatch(r.campaign_id):
        return r.campaign_id
    title = TITLE_RE.match(r.markdown)   # the first line of a report names the campaign in full
    return title.group(1) if title and title.group(1).startswith(asked) else asked


async def _campaign_status(settings, cid: str) -> spb.CampaignStatus:
    """A campaign's status by id or unique prefix: from the planner when it is configured, else from the archive."""
    if not planner_configured(settings):
        return _local(settings, lambda q: q.status(spb.GetCampaignRequest(id=cid)))
    plan = settings.planner_addr
    try:
        return await _call(plan, lambda ch: sgrpc.CampaignsStub(ch).Get(spb.GetCampaignRequest(id=cid)), settings)
    except ClientError as e:
        if e.status != grpc.StatusCode.NOT_FOUND or not cid:
            raise
        # not an id the planner knows: perhaps a prefix of one (the planner takes full ids only)
        known = [s for s in (await _campaign_list(settings)).campaigns if s.id.startswith(cid)]
        if len(known) == 1:
            return known[0]
        if known:
            raise ClientError(str(qmod.Ambiguous("campaign", cid, [_status_line(s) for s in known[:qmod.MATCHES_SHOWN]],
                                                 len(known) > qmod.MATCHES_SHOWN)), 2) from None
        raise


async def _status_list(settings) -> list[tuple[spb.CampaignStatus, str]]:
    """What `status` lists, each campaign once with where it came from: the planner's campaigns when it is
    configured, and then those only the archive best and report read holds (the memory service's when one is
    configured, else the local workspace's): campaigns imported with `kfactory evidence import`, run here, or
    run by a planner that is gone."""
    listed = [(s, PLANNER) for s in (await _campaign_list(settings)).campaigns] if planner_configured(settings) \
        else []
    known = {s.id for s, _ in listed}
    if memory_configured(settings):
        try:
            held = (await _every_page(lambda req: _ask_memory(settings, "Campaigns", req),
                                      f"the memory service at {settings.memory_addr}")).campaigns
        except ClientError as e:
            if e.status == grpc.StatusCode.UNIMPLEMENTED:   # a memory service older than this client
                e = ClientError(f"the memory service at {settings.memory_addr} predates the Campaigns query: "
                                "upgrade it (or leave KFACTORY_MEMORY_ADDR unset to list this workspace's)", 1,
                                e.status)
            if not planner_configured(settings):
                raise e from None
            print(f"kfactory: warning: the planner's campaigns only: {e}", file=sys.stderr)
            return listed
        return listed + [(s, MEMORY) for s in held if s.id not in known]
    if not planner_configured(settings):
        return [(s, ARCHIVE) for s in (await _campaign_list(settings)).campaigns]
    return listed + [(s, ARCHIVE) for s in _archive_campaigns(settings) if s.id not in known]


def _archive_campaigns(settings) -> list[spb.CampaignStatus]:
    """The local archive's campaigns; none when no campaign has run here (no archive: nothing to add to a
    planner's list, which is no error), or when the archive cannot be read (said on stderr: the planner's list
    still answers)."""
    try:
        return list(_local_campaigns(settings).campaigns)
    except NoWorkspace:
        return []
    except ArchiveUnreadable as e:
        print(f"kfactory: warning: the planner's campaigns only: {e}", file=sys.stderr)
        return []


async def _status_of(settings, cid: str) -> tuple[spb.CampaignStatus, str]:
    """A campaign's status by id or unique prefix, and where it came from, among what `status` lists
    (_status_list): the planner's answer for an id it knows, else the one campaign of the list the prefix names."""
    if not planner_configured(settings) and not memory_configured(settings):
        return await _campaign_status(settings, cid), ARCHIVE
    not_found = ClientError(f"no campaign {cid!r} (an id or a unique prefix of one) in the memory service at "
                            f"{settings.memory_addr}", 1)
    if planner_configured(settings):
        try:
            s = await _call(settings.planner_addr,
                            lambda ch: sgrpc.CampaignsStub(ch).Get(spb.GetCampaignRequest(id=cid)), settings)
            return s, PLANNER
        except ClientError as e:
            if e.status != grpc.StatusCode.NOT_FOUND or not cid:
                raise
            not_found = e
    listed = await _status_list(settings)
    known = [(s, source) for s, source in listed if s.id == cid] or \
        [(s, source) for s, source in listed if s.id.startswith(cid)]
    if len(known) == 1:
        return known[0]
    if known:
        marked = planner_configured(settings)   # as `status` lists them: marked only beside a planner's
        raise ClientError(str(qmod.Ambiguous("campaign", cid, [_status_line(s, source if marked else "")
                                                                for s, source in known[:qmod.MATCHES_SHOWN]],
                                             len(known) > qmod.MATCHES_SHOWN)), 2)
    raise not_found


async def _campaign_list(settings) -> spb.ListCampaignsResponse:
    """Every campaign's status (every page: kfactory/services/paging.py): the planner's when it is configured,
    else the archive's."""
    if not planner_configured(settings):
        return _local_campaigns(settings)
    return await _every_page(
        lambda req: _call(settings.planner_addr, lambda ch: sgrpc.CampaignsStub(ch).List(req), settings),
        f"the planner at {settings.planner_addr}")


async def _every_page(fetch, source: str) -> spb.ListCampaignsResponse:
    """paging.every_page, a list that does not move on a ClientError naming its source."""
    try:
        return await paging.every_page(fetch)
    except paging.PageTokenError as e:
        raise ClientError(f"{source}: {e}", 1) from e


def _local_campaigns(settings) -> spb.ListCampaignsResponse:
    """Every campaign of the local archive, read a page at a time as the services answer."""
    try:
        return paging.every_page_now(lambda req: _local(settings, lambda q: q.campaigns(req)))
    except paging.PageTokenError as e:
        raise ClientError(f"the archive at {Workspace.of(settings).archive_path}: {e}", 1) from e


async def _warm_trust(settings, args, families: list[str]) -> dict:
    """What a new campaign of the problem would learn from (every source's measurements, as the planner asks for
    them), the weight each source starts with and why, and what finished campaigns measured of those sources
    (kfactory/evidence/warm_sources.py); that history is left out (None) where no campaign list can be read."""
    every = await _evidence(settings, "Priors", spb.PriorsRequest(
        problem=args.problem, families=families, limit=max(args.limit, settings.warm_evidence), every_source=True))
    sources = warm_sources.sources_of(every.priors)
    try:
        statuses = (await _campaign_list(settings)).campaigns
    except ClientError:
        statuses = None
    resolve: Callable[[str], str] | None = None
    if statuses is not None and not planner_configured(settings):
        # read locally, the archive also knows the names imported campaigns' problems had where they ran
        aliases = _local(settings, lambda q: dict(q.archive.aliases))
        resolve = functools.partial(resolved_name, resolve=qmod.problem_name, aliases=aliases)
    history = None if statuses is None else warm_sources.history_of(statuses, args.problem, sources, resolve)
    return warm_sources.priors_view(sources, history)


def _priors_families(args) -> list[str]:
    """The families a new campaign would learn of: --family's, and with --target only the problem's families
    for that target, as the planner asks memory for them (a campaign on another target has other families)."""
    if not args.target:
        return list(args.family)
    from kfactory.problems import ProblemError, load_problem
    from kfactory.targets import KNOWN
    if args.target.split(":")[0] not in KNOWN:
        raise ClientError(f"--target {args.target!r}: choose one of {', '.join(KNOWN)} (cuda:ARCH for one "
                          "architecture)", 2)
    try:
        problem = load_problem(args.problem)
    except ProblemError as e:
        raise ClientError(f"--target needs the problem here to know its families: {e}", 2) from e
    fams = [f.name for f in problem.families_for(args.target.split(":")[0])
            if not args.family or f.name in args.family]
    if not fams:
        raise ClientError(f"problem {problem.name} has no family for target {args.target}"
                          + (f" among {args.family}" if args.family else "")
                          + ": a campaign there learns from no evidence (agents or hand-written kernels only)", 1)
    return fams


async def _best(args, settings, as_json: bool) -> int:
    if args.candidate:
        r = await _evidence(settings, "Candidate", spb.CandidateRequest(id=args.candidate))
        kinds = ", ".join(ev.kind_of(e) for e in r.events)
        verdicts = [getattr(e, k) for e in r.events for k in ("verified", "rejected") if e.HasField(k)]
        table = "\n".join(verification_table(verdicts[-1].checks)) if verdicts else "no verdict yet"
        _print(r, as_json, f"{r.candidate.id} {r.candidate.origin} {format_params(r.candidate.params_json)}\n"
                           f"evidence: {kinds}\n"
                           f"verification:\n{table}")
        return 0
    if args.campaign:
        check_campaign_id(args.campaign, "--campaign")
        r = await _evidence(settings, "Leaderboard", spb.LeaderboardRequest(campaign_id=args.campaign))
        _print(r, as_json, "\n".join(f"{i:3d} {e.candidate_id[:12]} {e.score_s * 1e3:9.3f} ms {e.origin} "
                                     f"{format_params(e.params_json)}{entry_marks(e)}"
                                     for i, e in enumerate(r.entries, 1))
               or "no measurements")
        return 0
    if not args.problem:
        raise ClientError("kfactory best: name a problem, or give --campaign or --candidate", 2)
    r = await _evidence(settings, "Best", spb.BestRequest(problem=args.problem, shape=args.shape, device=args.device,
                                                          target=getattr(args, "target", ""),
                                                          require_known=not loads_here(args.problem)))
    # the winner's kernel itself, as the candidate holds it: what a user came for (kfactory export packages it)
    c = await _evidence(settings, "Candidate", spb.CandidateRequest(id=r.candidate_id))
    if as_json:
        out = MessageToDict(r, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
        out["kernel"] = {"language": c.candidate.language, "entry": c.candidate.entry,
                         "compile_flags": c.candidate.compile_flags, "source": c.source}
        print(json.dumps(out, indent=2))
        return 0
    # a weighted sum of medians, or one median: the shape it is of (a package's shapes may have changed)
    scored = f" ({r.objective})" if r.objective else (f" at {r.timings[0].shape}" if r.timings else "")
    print(f"{r.candidate_id} {r.score_s * 1e3:.3f} ms{scored} on {r.device} ({r.origin} "
          f"{format_params(r.params_json)}; campaign {r.campaign_id})\n{_takeaway(c, r.candidate_id)}\nverification:\n"
          + "\n".join(verification_table(r.checks)))
    return 0


def entry_marks(e: spb.LeaderboardEntry) -> str:
    """What a leaderboard line adds to a kernel's own figures: whether it is its campaign's result, or no result
    at all (found wrong, screened out), and whether it was measured after the campaign finished."""
    marks = [text for note, text in NOTES.items() if getattr(e, note)]
    marks += ["after the campaign finished"] if e.after_finish else []
    return f"  ({'; '.join(marks)})" if marks else ""


def _takeaway(c: spb.CandidateEvidence, candidate_id: str) -> str:
    """What the best candidate is and how to take it away: a kernel is exported by its id; an engine (a problem
    `engine:MODEL`, kfactory/engines/problem.py) by its model, from the best.json its campaign wrote."""
    from kfactory.engines.problem import PREFIX, parse_locator

    shows = f"kfactory best --candidate {candidate_id[:12]} shows it"
    if c.candidate.problem.startswith(PREFIX):
        model = parse_locator(c.candidate.problem)[0]
        return (f"engine: {len(c.source)} bytes of source bundle (the generated C and its searched kernels; "
                f"score: seconds per decoded token) ({shows}; kfactory export {model} --format c|python takes the "
                "model's best verified engine away)")
    return (f"kernel: {len(c.source)} bytes of {c.candidate.language or 'source'}, flags "
            f"{c.candidate.compile_flags or '-'} ({shows}; kfactory export {candidate_id[:12]} --format "
            "c|python|torch takes it away)")
