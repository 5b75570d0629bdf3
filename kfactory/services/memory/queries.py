"""The Evidence queries, in one place: memory's gRPC servicer and the CLI's local workspace reader both answer
through `Queries`, so a command gives the same answer with or without a memory service running.

Each method takes the request message and returns the response message, or raises NotFound or InvalidRequest
(Ambiguous, when an id prefix names several things); the servicer maps those to NOT_FOUND and INVALID_ARGUMENT,
the CLI to exit 1 and 2. Every id a request carries may be a unique prefix of the id, as git takes commits.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from functools import lru_cache

from kfactory.bus import events as ev
from kfactory.bus.origins import Origin
from kfactory.evidence import report
from kfactory.judge import objective
from kfactory.problems import ProblemError, list_problems, load_problem
from kfactory.platform.spec_ranges import PRIORS_LIMIT, range_error
from kfactory.services.memory import lessons as lessons_mod
from kfactory.services import paging
from kfactory.services.memory.archive import Archive
from kfactory import targets
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb

#: how many matches an ambiguous prefix lists
MATCHES_SHOWN = 10


class QueryError(Exception):
    """A query that has no answer; the message says why, in one line (an Ambiguous one lists the matches)."""


class NotFound(QueryError, LookupError):
    """Nothing in the archive matches the request."""


class InvalidRequest(QueryError, ValueError):
    """The request itself is wrong (a field missing or out of range, an ambiguous id prefix)."""


class UnknownProblem(InvalidRequest):
    """A problem name that is no problem here (no built-in, no package that loads) and that no archived campaign
    ran: a mistyped name, refused where the request says so (require_known) instead of answered as empty."""

    def __init__(self, asked: str):
        super().__init__(f"no problem {quoted(asked)}: it is no built-in problem (kfactory problems list), no "
                         "problem package directory that loads, and no campaign in the archive ran a problem of "
                         "that name (kfactory status lists the campaigns)")


class PackageNameAmbiguous(InvalidRequest):
    """A directory name that archived campaigns' problem packages of several problems have (`packages`: locator ->
    problem name): the user must say which, by path or by problem name."""

    def __init__(self, asked: str, packages: dict[str, str]):
        self.packages = packages
        listed = "\n".join(f"  {loc}  (problem {name})" for loc, name in sorted(packages.items())[:MATCHES_SHOWN])
        more = "\n  ..." if len(packages) > MATCHES_SHOWN else ""
        super().__init__(f"{quoted(asked)} is the directory of packages of {len(set(packages.values()))} problems "
                         f"campaigns ran; name one by its problem's name or its package's path:\n{listed}{more}")


class Ambiguous(InvalidRequest):
    """An id prefix that names several things; `matches` describes them (up to MATCHES_SHOWN)."""

    def __init__(self, what: str, prefix: str, matches: list[str], more: bool):
        self.matches = matches
        listed = "\n".join(f"  {m}" for m in matches) + ("\n  ..." if more else "")
        super().__init__(f"{what} prefix {quoted(prefix)} is ambiguous; it matches "
                         f"{'more than ' if more else ''}{len(matches)}:\n{listed}")


def quoted(value: str) -> str:
    """A requested value as an error quotes it: its start only, when it is long."""
    return repr(value) if len(value) <= 80 else f"{value[:80]!r}... ({len(value)} characters)"


@lru_cache(maxsize=64)
def problem_name(locator: str) -> str:
    """A problem's name from its locator (built-in name or package path); unknown ones stay as given. (Memory
    maps through its context's cache of loaded problems instead: the same names.)"""
    try:
        return load_problem(locator).name
    except ProblemError:
        return locator


def _no_source(digest: str) -> bytes | None:
    return None


class Queries:
    """The Evidence service's answers over an archive and a source lookup (digest -> bytes, or None)."""

    def __init__(self, archive: Archive, source: Callable[[str], bytes | None] = _no_source):
        self.archive = archive
        self.source = source
        #: a campaign's folded counts by its id, with the last archive seq they were folded up to
        self._folds: dict[str, tuple[int, pb.Counts]] = {}

    # -- id prefixes -----------------------------------------------------------------------------------------
    def resolve_candidate(self, prefix: str) -> str:
        """The full id of the one candidate whose id starts with `prefix` (an exact id always wins)."""
        if not prefix:
            raise InvalidRequest("name a candidate (its id, or a unique prefix of it)")
        return self._resolve("candidate", prefix, self.archive.candidates_with_prefix, self._describe_candidate)

    def resolve_campaign(self, prefix: str) -> str:
        """The full id of the one archived campaign whose id starts with `prefix` (an exact id always wins)."""
        if not prefix:
            raise InvalidRequest("name a campaign (its id, or a unique prefix of it)")
        return self._resolve("campaign", prefix, self.archive.campaigns_with_prefix, self._describe_campaign)

    def _resolve(self, what: str, prefix: str, find, describe) -> str:
        # ids are ASCII (hex digests; campaign ids are events.CAMPAIGN_ID): anything else names none, and a lone
        # surrogate from a mis-encoded argument could not even be handed to SQLite
        found = find(prefix, MATCHES_SHOWN + 1) if prefix.isascii() else []
        if prefix in found or len(found) == 1:
            return prefix if prefix in found else found[0]
        if not found:
            raise NotFound(f"no {what} {quoted(prefix)} in the archive"
                           + (" (kfactory status lists the campaigns)" if what == "campaign" else ""))
        raise Ambiguous(what, prefix, [describe(i) for i in found[:MATCHES_SHOWN]], len(found) > MATCHES_SHOWN)

    def _describe_candidate(self, cid: str) -> str:
        rows = self.archive.q("SELECT origin, params_json, campaign FROM candidates WHERE id=? LIMIT 1", (cid,))
        if not rows:
            return f"{cid[:16]}  (no candidate_created archived)"
        origin, params, campaign = rows[0]
        return f"{cid[:16]}  {origin} {params}  (campaign {campaign})"

    def _describe_campaign(self, cid: str) -> str:
        rows = self.archive.q("SELECT problem, target, state FROM campaigns WHERE id=?", (cid,))
        if not rows:
            return f"{cid}  (its start is not archived)"
        problem, target, state = rows[0]
        return f"{cid}  {self.archive.problem_name(problem)}/{target} {state}"

    def problem(self, asked: str, require_known: bool = False) -> str:
        """The name a request's problem is filed under: a built-in's name is the built-in; a locator (a package
        directory, a replay cache) is named as it loads here, or as imported evidence named it; a name some
        archived campaign's problem has is that problem; else the directory name of the package campaigns ran
        (`famok` for /home/u/famok), when those packages are of one problem (PackageNameAmbiguous when of
        several). Anything else is answered as it is (nothing archived yet: a service asking for its own first
        campaign's problem), or with `require_known` refused as UnknownProblem (a user's mistyped name)."""
        if not asked:
            raise InvalidRequest("name the problem")
        name = self.archive.problem_name(asked)
        if name != asked or asked in list_problems() or self.archive.knows_problem(asked):
            return name
        packages = self.archive.packages_called(asked)
        if len(set(packages.values())) == 1:
            return next(iter(packages.values()))
        if packages:
            raise PackageNameAmbiguous(asked, packages)
        if require_known:
            raise UnknownProblem(asked)
        return asked

    # -- the Evidence service ----------------------------------------------------------------------------------
    def best(self, request: spb.BestRequest, target: str = "") -> spb.LeaderboardEntry:
        """The fastest kernel of a problem (at a shape, on a device, for the request's target, else `target`),
        with its verdict's figures."""
        check_filters(request.target, request.shape)
        name = self.problem(request.problem, request.require_known)
        target = request.target or target
        found = self.archive.best(name, request.shape, request.device, target)
        if found is None:
            asked = " ".join(part for part in (quoted(request.problem), request.shape, request.device, target) if part)
            raise NotFound(f"no measurement of {asked}"
                           + ", or none that counts (a kernel found wrong by a comparison, or not the one its "
                           "campaign finished with: kfactory status lists the campaigns)")
        measured, campaign = found
        entry = _entry(measured, campaign, self.archive.checks(measured.candidate.id, campaign))
        entry.result = self.archive.verdicts([campaign]).results.get(campaign) == entry.candidate_id
        return entry

    def leaderboard(self, request: spb.LeaderboardRequest) -> spb.LeaderboardResponse:
        """A campaign's measured candidates, fastest first, each marked when it is the kernel the campaign
        finished with, was found wrong by a comparison, or was screened out. Of a finished campaign, as many as
        its status counts measured after the finish are marked after_finish: those measured last in the
        archive's order, never the best it finished with (the finish says how many it counted, not which, so the
        marks are the likeliest ones; the count itself is exact)."""
        cid = self.resolve_campaign(request.campaign_id)
        rows = self.archive.leaderboard(cid, request.limit or 20)
        verdicts = self.archive.verdicts_around(cid)
        entries = [_entry(m, cid) for m, _ in rows]
        for entry, (m, _) in zip(entries, rows):
            for note in verdicts.notes(cid, m):
                setattr(entry, note, True)
        if (finished := self._lifecycle(cid, "campaign_finished")) is not None:
            fin = finished.campaign_finished
            late = self._after_finish(cid, fin).measured
            marked = self.archive.last_measured(cid, late, besides=fin.best_candidate_id)
            for entry in entries:
                entry.after_finish = entry.candidate_id in marked
        return spb.LeaderboardResponse(entries=entries)

    def candidate(self, request: spb.CandidateRequest) -> spb.CandidateEvidence:
        """One candidate's every archived event, then the comparisons about it (Archive.comparisons_of: its own,
        and any that found it wrong), lineage and source ("" when no store holds it)."""
        cid = self.resolve_candidate(request.id)
        events = self.archive.events(candidate=cid) + self.archive.comparisons_of(cid)
        first = next((e for e in events if e.HasField("candidate_created")), events[0])
        cand = ev.candidate_of(first)
        assert cand is not None  # every event archived under a candidate carries it
        data = self.source(cand.source_digest) if cand.source_digest else None
        return spb.CandidateEvidence(candidate=cand, events=events, lineage=self.archive.lineage(cand.id),
                                     source=data.decode() if data is not None else "")

    def report(self, request: spb.ReportRequest) -> spb.ReportResponse:
        """A campaign's report (markdown and the best-so-far plot), built from its archived events."""
        cid = self.resolve_campaign(request.campaign_id)
        md, png = self.report_of(cid)
        return spb.ReportResponse(markdown=md, plot_png=png, campaign_id=cid)

    def report_of(self, cid: str) -> tuple[str, bytes]:
        """(markdown, plot PNG) of the campaign with this exact id, from its archived events; its leaderboard marks
        a kernel another campaign found wrong too, before or after this one ran."""
        return report.build(self.archive.events(campaign=cid), known=self.archive.verdicts_around(cid).wrong)

    def regression_inputs(self, request: spb.RegressionRequest) -> spb.RegressionResponse:
        """The inputs that once exposed a wrong kernel of the problem."""
        if not request.problem:
            raise InvalidRequest("name the problem")
        return spb.RegressionResponse(inputs=self.archive.regressions(self.archive.problem_name(request.problem)))

    def priors(self, request: spb.PriorsRequest) -> spb.PriorsResponse:
        """The best design points of the problem's families in other campaigns (a warm start's seeds)."""
        name = self.problem(request.problem, request.require_known)
        if err := range_error("limit", request.limit, PRIORS_LIMIT):
            raise InvalidRequest(err)
        return spb.PriorsResponse(priors=self.archive.priors(name, list(request.families), request.exclude_campaign,
                                                             request.limit or 8, request.every_source))

    def known_wrong(self, request: spb.KnownWrongRequest) -> spb.KnownWrongResponse:
        """The kernels a comparison of any campaign of the problem found wrong (a new campaign's start)."""
        return spb.KnownWrongResponse(kernels=self.archive.known_wrong(self.problem(request.problem)))

    def comparison_cost(self, request: spb.ComparisonCostRequest) -> spb.ComparisonCostResponse:
        """What the showdowns and final comparisons of recent campaigns of the problem on the device held it for
        (a new campaign's reserve under a device budget)."""
        if not request.problem or not request.target or not request.device:
            raise InvalidRequest("name the problem (as the campaign's spec does), the target and the device model "
                                 "(CampaignStarted.device.model)")
        return spb.ComparisonCostResponse(campaigns=[
            spb.ComparisonCost(campaign_id=c, showdown_s=sd, final_s=final)
            for c, sd, final in self.archive.comparison_cost(request.problem, request.target, request.device)])

    def lessons(self, request: spb.LessonsRequest) -> spb.LessonsResponse:
        """What helped and what failed for the problem on a target, and as the text agents are told."""
        check_filters(request.target)
        items = lessons_mod.lessons(self.archive, self.problem(request.problem, request.require_known),
                                    request.target, request.limit or 6)
        return spb.LessonsResponse(lessons=items, text=lessons_mod.as_text(items))

    # -- the Campaigns service's status, as the archive knows it ----------------------------------------------
    def status(self, request: spb.GetCampaignRequest) -> spb.CampaignStatus:
        """A campaign's status from its archived events: what it finished with (its CampaignFinished's counts and
        best), or, while it runs (or if its run ended before it could finish it), the archived results counted."""
        return self._status(self.resolve_campaign(request.id))

    def campaigns(self, request: spb.ListCampaignsRequest | None = None) -> spb.ListCampaignsResponse:
        """The archived campaigns' statuses, oldest first, a page at a time (kfactory/services/paging.py: each
        status costs a few queries of the archive, so a long-lived archive is not read whole for one answer; a
        running one's also reads which kernels its problem's campaigns found wrong, through the indexes)."""
        request = request if request is not None else spb.ListCampaignsRequest()
        try:
            n, after = paging.page_size(request.page_size), paging.decode(request.page_token)
        except paging.PageTokenError as e:
            raise InvalidRequest(str(e)) from e
        # a campaign archived before its start event has no start time: it sorts first, as 0
        where, args = ("", ()) if after is None else \
            ("WHERE COALESCE(started_ns, 0) > ? OR (COALESCE(started_ns, 0) = ? AND id > ?)",
             (after[0], after[0], after[1]))
        rows = self.archive.q(f"SELECT COALESCE(started_ns, 0), id FROM campaigns {where} "
                              "ORDER BY COALESCE(started_ns, 0), id LIMIT ?", (*args, n + 1))
        page = rows[:n]
        return spb.ListCampaignsResponse(campaigns=[self._status(c) for _, c in page],
                                         next_page_token=paging.encode(*page[-1]) if len(rows) > n else "")

    def _status(self, cid: str) -> spb.CampaignStatus:
        started = self._lifecycle(cid, "campaign_started")
        finished = self._lifecycle(cid, "campaign_finished")
        spec = started.campaign_started.spec if started else pb.CampaignSpec()
        end = finished.time_unix_ns / 1e9 if finished else time.time()  # in seconds first, as the planner does
        out = spb.CampaignStatus(id=cid, spec=spec, state=finished.campaign_finished.state if finished else "running",
                                 elapsed_s=end - started.time_unix_ns / 1e9 if started else 0.0,
                                 device=started.campaign_started.device if started else pb.DeviceInfo())
        out.after_finish.SetInParent()   # present, as the planner's status has it, even when nothing came late
        if finished:
            fin = finished.campaign_finished
            out.counts.CopyFrom(fin.counts)
            out.summary_json, out.reason = fin.summary_json, fin.reason
            # as the planner reports it: the best it finished with, when its measurement is known
            score = self.archive.q("SELECT score_s FROM measurements WHERE campaign=? AND candidate=?",
                                   (cid, fin.best_candidate_id))
            if score:
                out.best_candidate_id, out.best_score_s = fin.best_candidate_id, score[0][0]
            out.after_finish.CopyFrom(self._after_finish(cid, fin))
            return out
        for kind, n in self.archive.q("SELECT kind, COUNT(*) FROM events WHERE campaign=? GROUP BY kind", (cid,)):
            ev.count_in(out.counts, kind, n)
        # its best so far: no screened-out timing (never verified), no kernel a comparison (of any campaign of its
        # problem) found wrong
        wrong = self.archive.verdicts_around(cid).wrong
        for cand, score, payload in self.archive.q(
                "SELECT m.candidate, m.score_s, m.payload FROM measurements m JOIN candidates c ON "
                "c.campaign=m.campaign AND c.id=m.candidate WHERE m.campaign=? AND c.origin!=? ORDER BY m.score_s",
                (cid, Origin.REFERENCE.of())):
            if cand not in wrong and not pb.Measured.FromString(payload).screened_out:
                out.best_candidate_id, out.best_score_s = cand, score
                break
        return out

    def _after_finish(self, cid: str, fin: pb.CampaignFinished) -> pb.Counts:
        """What a finished campaign's archived events count beyond what it finished with. Where its events, kind
        by kind, number what it finished with and none is a dead letter (which the fold may count as rejected),
        nothing came late and nothing is folded; otherwise the fold says."""
        raw, letters = pb.Counts(), 0
        for kind, n in self.archive.q("SELECT kind, COUNT(*) FROM events WHERE campaign=? GROUP BY kind", (cid,)):
            ev.count_in(raw, kind, n)
            letters += n if kind == "dead_letter" else 0
        if not letters and raw == fin.counts:
            return pb.Counts()
        return ev.late_counts(self._folded_counts(cid), fin.counts)

    def _folded_counts(self, cid: str) -> pb.Counts:
        """What a campaign's archived events count, folded as its planner folds them (its CampaignState, the
        one definition of the counts), in the archive's order: a finished campaign's counts beyond what it
        finished with are its results after the finish, whatever order they reached the archive in."""
        from kfactory.services.planner.campaign import CampaignState   # the planner's fold; it needs no memory

        last = self.archive.q("SELECT MAX(seq) FROM events WHERE campaign=?", (cid,))[0][0] or 0
        if (cached := self._folds.get(cid)) is not None and cached[0] == last:
            return cached[1]
        started = self._lifecycle(cid, "campaign_started")
        st = CampaignState(cid, started.campaign_started.spec if started else pb.CampaignSpec(), pb.DeviceInfo(),
                           None)
        for event in self.archive.events(campaign=cid):
            st.apply(event)
        self._folds[cid] = (last, st.counts)
        return st.counts

    def _lifecycle(self, cid: str, kind: str) -> pb.Event | None:
        rows = self.archive.q("SELECT payload FROM events WHERE campaign=? AND kind=? ORDER BY seq LIMIT 1",
                              (cid, kind))
        return pb.Event.FromString(rows[0][0]) if rows else None


def check_filters(target: str, shape: str = "") -> None:
    """A request's target and shape filters, refused when mistyped (InvalidRequest) rather than matching
    nothing."""
    if err := target and targets.filter_error(target) or shape and targets.shape_error(shape):
        raise InvalidRequest(err)


def _entry(m: pb.Measured, campaign: str, checks=()) -> spb.LeaderboardEntry:
    c = m.candidate
    return spb.LeaderboardEntry(candidate_id=c.id, campaign_id=campaign, problem=c.problem, family=c.family,
                                params_json=c.params_json, origin=c.origin, score_s=m.score_s, timings=m.timings,
                                device=m.device.model, checks=checks,
                                objective=objective.named_label(m.objective) if m.objective else "")

