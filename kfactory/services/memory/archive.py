"""The evidence archive: an embedded SQLite database materialised from the events stream.

Inserts are keyed by event id, so replaying the stream (or a redelivery) changes nothing twice; deleting
the file and replaying the stream rebuilds it.
"""
from __future__ import annotations

import re
import sqlite3
import threading
import time
from collections.abc import Iterable
from pathlib import Path, PurePath

from kfactory.bus import events as ev
from kfactory.bus.origins import STRATEGY, Origin, sql_match
from kfactory.evidence import trust
from kfactory.evidence.verdicts import WRONGNESS, Verdicts, found_wrong
from kfactory.judge import counter_rng, objective
from kfactory.problems.spec import PROBLEM_NAME
from kfactory.v1 import events_pb2 as pb


SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, campaign TEXT NOT NULL, kind TEXT NOT NULL,
  producer TEXT, candidate TEXT, time_ns INTEGER, payload BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS events_campaign ON events(campaign, seq);
CREATE INDEX IF NOT EXISTS events_candidate ON events(candidate, seq);
CREATE TABLE IF NOT EXISTS campaigns (
  id TEXT PRIMARY KEY, problem TEXT, target TEXT, strategy TEXT, device TEXT, state TEXT,
  started_ns INTEGER, finished_ns INTEGER, summary_json TEXT);
CREATE TABLE IF NOT EXISTS candidates (
  campaign TEXT, id TEXT, problem TEXT, target TEXT, family TEXT, origin TEXT, params_json TEXT,
  point_id TEXT, source_digest TEXT, compile_flags TEXT, PRIMARY KEY (campaign, id));
CREATE TABLE IF NOT EXISTS parents (candidate TEXT, parent TEXT, PRIMARY KEY (candidate, parent));
CREATE TABLE IF NOT EXISTS measurements (
  campaign TEXT, candidate TEXT, problem TEXT, device TEXT, score_s REAL, time_ns INTEGER, payload BLOB,
  PRIMARY KEY (campaign, candidate));
CREATE TABLE IF NOT EXISTS passed (candidate TEXT PRIMARY KEY, campaign TEXT, time_ns INTEGER);
CREATE TABLE IF NOT EXISTS regressions (
  problem TEXT, shape TEXT, distribution TEXT, seed TEXT, candidate TEXT, campaign TEXT, reason TEXT,
  note TEXT, time_ns INTEGER, PRIMARY KEY (problem, shape, distribution, seed));
CREATE TABLE IF NOT EXISTS outcomes (
  campaign TEXT, candidate TEXT, point_id TEXT, stage TEXT, reason TEXT, message TEXT, time_ns INTEGER);
CREATE TABLE IF NOT EXISTS refused (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, subject TEXT, stream_seq INTEGER, event_id TEXT, campaign TEXT,
  kind TEXT, producer TEXT, reason TEXT NOT NULL, head BLOB, time_ns INTEGER);
CREATE TABLE IF NOT EXISTS held (
  id TEXT PRIMARY KEY, campaign TEXT NOT NULL, candidate TEXT NOT NULL, reason TEXT, payload BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS held_candidate ON held(campaign, candidate);
CREATE TABLE IF NOT EXISTS problem_names (locator TEXT PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS owed (candidate TEXT NOT NULL, event_id TEXT NOT NULL, PRIMARY KEY (candidate, event_id));
CREATE INDEX IF NOT EXISTS events_verdicts ON events(campaign) WHERE kind IN ('comparison', 'campaign_finished');
CREATE INDEX IF NOT EXISTS measurements_problem ON measurements(problem, campaign);
"""
#: a campaign's comparisons and end (Archive.verdicts): the partial index events_verdicts answers it, since its
#: WHERE is this query's kind term word for word (so no other query's plan can change); a reader of an archive
#: written before the index scans the campaign's events
DECISIONS = ("SELECT payload FROM events WHERE campaign=? AND kind IN ('comparison', 'campaign_finished') "
             "ORDER BY seq")
#: every comparison of a problem's campaigns in the archive's order, and every campaign's end (Archive.
#: problem_verdicts): the same partial index per campaign (its WHERE word for word, narrowed to one kind), the
#: campaigns from measurements_problem; the ends unsorted, as sorting their summaries costs more than the rest
_OF_PROBLEM = ("SELECT payload FROM events WHERE kind IN ('comparison', 'campaign_finished') AND kind=? AND campaign "
               "IN (SELECT campaign FROM measurements WHERE problem=?)")
PROBLEM_COMPARISONS = _OF_PROBLEM + " ORDER BY seq"
#: how much of a refused message the archive keeps (enough to tell what it was, never megabytes)
REFUSED_HEAD_BYTES = 4096
#: recent campaigns whose comparisons' device time a new campaign's reserve is learned from (comparison_cost)
COMPARISON_COST_CAMPAIGNS = 5
_SUMMARY = "CASE WHEN json_valid(summary_json) THEN json_extract(summary_json, '$.{}') END"
#: each campaign's (id, a showdown's device seconds, a result's final comparison's): numbers only
COMPARISON_COSTS = (
    "SELECT id, sd, final FROM (SELECT finished_ns, id, " + _SUMMARY.format("device_seconds_showdown") + " AS sd, "
    + _SUMMARY.format("device_seconds_final_comparison") + " AS final FROM campaigns WHERE problem=? AND target=? "
    "AND device=? AND state='completed') WHERE typeof(final) IN ('integer', 'real') AND final > 0 "
    "AND typeof(sd) IN ('integer', 'real') AND sd >= 0 ORDER BY finished_ns DESC, id DESC LIMIT ?")
#: results believed only at the end of their evidence chain, and the chain link each waits for
AWAITS = {"measured": "verified", "comparison": "measured"}


#: a character above any an id holds: [prefix, prefix + _TOP) is the range of strings that start with prefix (a
#: range scan uses the index; LIKE would not, and is case-insensitive besides)
_TOP = "\U0010ffff"


_IS_NAME = re.compile(PROBLEM_NAME)


def renames_a_name(locator: str, name: str) -> bool:
    """Whether an alias gives a locator that is a problem's name already (a built-in's) another name: every
    campaign of it would vanish from best, priors and lessons; no archive takes one."""
    return locator != name and _IS_NAME.match(locator) is not None


#: how long a write waits for another process's transaction on the archive to end
BUSY_WAIT_S = 120.0


def target_matches(have: str, want: str) -> bool:
    """Whether a candidate's target is the one asked for: any when `want` is empty; a bare name (`cuda`) matches
    each of its variants (`cuda:sm_90a`), a full one only itself."""
    return not want or have == want or (":" not in want and have.split(":")[0] == want)


def resolved_name(locator: str, resolve, aliases: dict[str, str]) -> str:
    """A problem's name from its locator: `resolve(locator)` (as this machine loads it), else the name imported
    evidence brought for it (`aliases`, locator -> name), else the locator as it is."""
    name = resolve(locator)
    return name if name != locator else aliases.get(locator, locator)


class Archive:
    """Thread-safe access to the SQLite archive (one connection, serialised)."""

    def __init__(self, path: Path | str, problem_name=lambda locator: locator):
        """`problem_name` maps a candidate's problem locator (a name or a package path) to its name."""
        self._resolve = problem_name
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # IMMEDIATE transactions and a long busy wait: another process writing this archive (an import beside
        # a campaign, two imports) is waited for; a deferred one that read first failed at once ("database is
        # locked") when the other had written meanwhile
        self.db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None,
                                  timeout=BUSY_WAIT_S)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(SCHEMA)
        self.lock = threading.Lock()
        self.aliases = self._aliases()

    @classmethod
    def reader(cls, path: Path | str, problem_name=lambda locator: locator) -> "Archive":
        """An existing archive opened for queries only (read-only, no schema written), safe beside a memory that
        is writing it (WAL: readers see the last committed state). FileNotFoundError when there is none."""
        self = cls.__new__(cls)
        self._resolve = problem_name
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(str(self.path))
        self.db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False,
                                  isolation_level=None)
        self.lock = threading.Lock()
        self.aliases = self._aliases()
        return self

    def _aliases(self) -> dict[str, str]:
        """The problem names imported evidence brought for locators (kfactory/evidence/bundle.py); one that
        renames a locator which is a name already (which an import once let in) is not one."""
        try:
            rows = self.db.execute("SELECT locator, name FROM problem_names").fetchall()
        except sqlite3.OperationalError:  # an archive written before the table existed, opened read-only
            return {}
        return {loc: name for loc, name in rows if not renames_a_name(loc, name)}

    def problem_name(self, locator: str) -> str:
        """A problem's name from its locator: resolved here (a built-in name, a package path that exists), else
        the name the machine that ran the campaign resolved it to, when imported evidence said (a package path
        of another machine, or a temporary copy gone since), else the locator as it is."""
        return resolved_name(locator, self._resolve, self.aliases)

    def close(self) -> None:
        self.db.close()

    def record(self, event: pb.Event) -> bool:
        """Archive one event; False when it was already there, or is not believed (kfactory/evidence/trust.py): one that
        cannot be true is kept in `refused` with the reason, a result whose evidence chain is not archived yet
        is `held` until it is (memory's order can differ from the stream's after a restart), and only then
        becomes evidence."""
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                added = self._record(event)
                self.db.execute("COMMIT")
            except sqlite3.Error:
                self.db.execute("ROLLBACK")
                raise
        return added

    def _record(self, event: pb.Event) -> bool:
        kind = ev.kind_of(event)
        cand = ev.candidate_of(event)
        if why := trust.body_flaw(event):
            self._refuse(why, event=event)
            return False
        if (waits := self._waits_for(event, kind)) is not None:
            self.db.execute("INSERT OR REPLACE INTO held VALUES (?,?,?,?,?)",
                            (event.id, event.campaign_id, waits[0], waits[1], event.SerializeToString()))
            return False
        cur = self.db.execute(
            "INSERT OR IGNORE INTO events (id, campaign, kind, producer, candidate, time_ns, payload) "
            "VALUES (?,?,?,?,?,?,?)", (event.id, event.campaign_id, kind, event.producer,
                                       cand.id if cand and cand.id else None, event.time_unix_ns,
                                       event.SerializeToString()))
        self.db.execute("DELETE FROM held WHERE id=?", (event.id,))
        if cur.rowcount:
            self._materialise(event, kind, cand)
            if cand is not None and cand.id:
                self._release(event.campaign_id, cand.id)
        return bool(cur.rowcount)

    def _waits_for(self, event: pb.Event, kind: str) -> tuple[str, str] | None:
        """(candidate, why) when `event` is a result whose chain is not archived yet; None when it may go in."""
        if kind not in AWAITS:
            return None
        cand_id = event.comparison.candidate_id if kind == "comparison" else event.measured.candidate.id
        have = {k for (k,) in self.db.execute("SELECT DISTINCT kind FROM events WHERE campaign=? AND candidate=?",
                                              (event.campaign_id, cand_id))}
        missing = trust.missing_links(have, event.measured.screened_out) if kind == "measured" else \
            [k for k in ("measured",) if k not in have]
        if not missing:
            return None
        return cand_id, f"waits for {', '.join(missing)} of candidate {cand_id[:16]}"

    def _release(self, campaign: str, candidate: str) -> None:
        """Archive the results held for this candidate whose chain is now whole."""
        for (payload,) in self.db.execute("SELECT payload FROM held WHERE campaign=? AND candidate=?",
                                          (campaign, candidate)).fetchall():
            self._record(pb.Event.FromString(payload))

    def merge(self, events: list[pb.Event], aliases: dict[str, str],
              regressions: list[pb.RegressionInput]) -> tuple[int, int, int, int, list[str]]:
        """Merge another archive's evidence (kfactory/evidence/bundle.py) in one transaction, all or none: each
        event recorded as one from the stream (what derives from it is this archive's own), `aliases` (locator ->
        problem name on the machine that ran it) kept, `regressions` added. Nothing is merged, and the reasons are
        returned, when an id is held here with other content, an event is not believed (kfactory/evidence/trust.py),
        or a locator is named otherwise here. Returns (added, already here, held back for their chain, regression
        inputs added, reasons)."""
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            kept_aliases = self.aliases
            try:
                if why := self._merge_conflicts(events, aliases):
                    self.db.execute("ROLLBACK")
                    return 0, 0, 0, 0, why
                fresh = {k: v for k, v in aliases.items() if k != v and k not in self.aliases}
                self.db.executemany("INSERT INTO problem_names VALUES (?,?)", sorted(fresh.items()))
                self.aliases = {**self.aliases, **fresh}
                before = self.db.execute("SELECT COUNT(*) FROM regressions").fetchone()[0]
                present = {i for e in events for (i,) in self.db.execute("SELECT id FROM events WHERE id=?", (e.id,))}
                added = sum(self._record(e) for e in events if e.id not in present)
                held = sum(1 for e in events for _ in self.db.execute("SELECT 1 FROM held WHERE id=?", (e.id,)))
                self.db.executemany("INSERT OR IGNORE INTO regressions VALUES (?,?,?,?,?,?,?,?,?)",
                                    [(r.problem, r.shape, r.distribution, str(r.seed), r.candidate_id, r.campaign_id,
                                      r.reason, r.note, 0) for r in regressions])
                after = self.db.execute("SELECT COUNT(*) FROM regressions").fetchone()[0]
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                self.aliases = kept_aliases
                raise
        return added, len(present), held, after - before, []

    def _merge_conflicts(self, events: list[pb.Event], aliases: dict[str, str]) -> list[str]:
        """Why a merge must be refused (empty when it may go in); the lock is held."""
        why = [f"problem locator {loc[:200]!r} is {self.aliases[loc]!r} here, {name!r} in the bundle"
               for loc, name in aliases.items() if self.aliases.get(loc, name) != name]
        why += [f"problem locator {loc[:200]!r} is a problem's name; the bundle names it {name[:200]!r}"
                for loc, name in aliases.items() if renames_a_name(loc, name)]
        started = {e.campaign_id for e in events if e.HasField("campaign_started")}
        for e in events:
            if e.campaign_id and not ev.CAMPAIGN_ID.fullmatch(e.campaign_id):
                # a campaign no command could name (`report`, `best --campaign` refuse such an id)
                why.append(f"event {e.id[:120]}: its campaign id {e.campaign_id[:64]!r} is not one")
            elif flaw := trust.body_flaw(e):
                why.append(f"event {e.id[:120]}: not believed: {flaw}")
            elif e.campaign_id not in started and not e.HasField("dead_letter") and not self.db.execute(
                    "SELECT 1 FROM campaigns WHERE id=?", (e.campaign_id,)).fetchone():
                why.append(f"event {e.id[:120]}: its campaign {e.campaign_id[:64]!r} has no start here or in the "
                           "bundle")
            elif (row := self.db.execute("SELECT payload FROM events WHERE id=?", (e.id,)).fetchone()) and \
                    row[0] != e.SerializeToString() and pb.Event.FromString(row[0]) != e:
                why.append(f"event {e.id[:120]}: this archive holds another event under that id")
        return why

    def refuse(self, reason: str, subject: str = "", stream_seq: int = 0, data: bytes = b"") -> None:
        """Keep a message of the events stream that was refused before it decoded (events.decode_event)."""
        with self.lock:
            self._refuse(reason, subject=subject, stream_seq=stream_seq, data=data)

    def _refuse(self, reason: str, subject: str = "", stream_seq: int = 0, data: bytes = b"",
                event: pb.Event | None = None) -> None:
        if event is not None:
            data = event.SerializeToString()
        self.db.execute("INSERT INTO refused (subject, stream_seq, event_id, campaign, kind, producer, reason, head, "
                        "time_ns) VALUES (?,?,?,?,?,?,?,?,?)",
                        (subject[:300], stream_seq, event.id[:300] if event else "",
                         event.campaign_id[:100] if event else "", ev.kind_of(event) if event else "",
                         event.producer[:100] if event else "", reason[:2000], data[:REFUSED_HEAD_BYTES],
                         time.time_ns()))

    def refused(self) -> list[tuple[str, str, str, str]]:
        """Every refused message: (subject, event id, kind, reason), oldest first."""
        return self.q("SELECT subject, event_id, kind, reason FROM refused ORDER BY seq")

    def held(self, campaign: str) -> list[tuple[str, str]]:
        """The results of a campaign held back for want of their chain: (event id, what each waits for)."""
        return self.q("SELECT id, reason FROM held WHERE campaign=? ORDER BY id", (campaign,))

    def _materialise(self, event: pb.Event, kind: str, cand: pb.Candidate | None) -> None:
        c, t = event.campaign_id, event.time_unix_ns
        if kind == "campaign_started":
            s = event.campaign_started
            self.db.execute("INSERT OR REPLACE INTO campaigns (id, problem, target, strategy, device, state, "
                            "started_ns) VALUES (?,?,?,?,?,?,?)", (c, s.spec.problem, s.spec.target, s.spec.strategy,
                                                                    s.device.model, "running", t))
        elif kind == "campaign_finished":
            f = event.campaign_finished
            self.db.execute("UPDATE campaigns SET state=?, finished_ns=?, summary_json=? WHERE id=?",
                            (f.state, t, f.summary_json, c))
        elif kind == "comparison":
            self._comparison_regression(event)
        elif cand is None:  # every kind below carries a candidate (ev.candidate_of); any other kind derives nothing
            return
        elif kind == "candidate_created":
            self.db.execute("INSERT OR IGNORE INTO candidates VALUES (?,?,?,?,?,?,?,?,?,?)",
                            (c, cand.id, cand.problem, cand.target, cand.family, cand.origin, cand.params_json,
                             cand.point_id, cand.source_digest, cand.compile_flags))
            self.db.executemany("INSERT OR IGNORE INTO parents VALUES (?,?)", [(cand.id, p) for p in cand.parents])
            self._owed_regressions(cand.id)
        elif kind == "measured":
            m = event.measured
            if m.round >= 2:   # a later timing round (kfactory/engines/finale.py) is archived as its event only:
                return         # every candidate is ranked by its first measurement, which every candidate has
            self.db.execute("INSERT OR REPLACE INTO measurements VALUES (?,?,?,?,?,?,?)",
                            (c, cand.id, self.problem_name(cand.problem), m.device.model, m.score_s, t,
                             m.SerializeToString()))
            self.db.execute("INSERT INTO outcomes VALUES (?,?,?,?,?,?,?)",
                            (c, cand.id, cand.point_id, "benchmarker", "measured", "", t))
        elif kind == "verified":
            self.db.execute("INSERT OR IGNORE INTO passed VALUES (?,?,?)", (cand.id, c, t))
            self._owed_regressions(cand.id)
        elif kind in ("rejected", "compile_failed"):
            body = getattr(event, kind)
            if kind == "rejected":
                self._regression(event, body, cand)
            reason = pb.RejectReason.Name(body.reason)
            stage = body.stage if kind == "rejected" else "compiler"
            pid = ev.outcome_point(body)
            self.db.execute("INSERT INTO outcomes VALUES (?,?,?,?,?,?,?)",
                            (c, cand.id, pid, stage, reason, body.message[:2000], t))

    def _regression(self, event: pb.Event, rej: pb.Rejected, cand: pb.Candidate) -> None:
        """A kernel that passed before (any campaign) found wrong now: keep the input that exposed it."""
        self._keep_regression(event, rej.reason, rej.message, rej.checks, cand.id, cand.problem)

    def _comparison_regression(self, event: pb.Event) -> None:
        """A comparison (a showdown, or the final one) that found a kernel wrong (Comparison.failed_candidate): keep
        the input that exposed it, as a rejected measurement's. The kernel's problem is its archived candidate's
        in the campaign (a baseline, which no campaign measured, has none: nothing is kept). Where the kernel's
        candidate or its pass is not archived yet (memory's order can differ from the stream's after a restart,
        and a comparison waits only for its own candidate's measurement), the input is owed until they are
        (_owed_regressions; the row of a kernel that never passes, or of a baseline, stays, and keeps nothing)."""
        comp = event.comparison
        if not (comp.failed_candidate and comp.checks and comp.failed_reason in WRONGNESS):
            return
        row = self.db.execute("SELECT problem FROM candidates WHERE id=? AND campaign=?",
                              (comp.failed_candidate, event.campaign_id)).fetchone()
        if row is None or not self._passed(comp.failed_candidate):
            self.db.execute("INSERT OR IGNORE INTO owed VALUES (?,?)", (comp.failed_candidate, event.id))
            return
        self.db.execute("DELETE FROM owed WHERE candidate=? AND event_id=?", (comp.failed_candidate, event.id))
        self._keep_regression(event, comp.failed_reason, comp.checks[-1].note, comp.checks,
                              comp.failed_candidate, row[0])

    def _owed_regressions(self, cand_id: str) -> None:
        """The comparisons (of any campaign) that owe a regression input for this kernel: settled now that its
        candidate or a pass of it is here (kept once: the regressions' key is the input)."""
        for (payload,) in self.db.execute("SELECT e.payload FROM owed o JOIN events e ON e.id = o.event_id "
                                          "WHERE o.candidate=?", (cand_id,)).fetchall():
            self._comparison_regression(pb.Event.FromString(payload))

    def _passed(self, cand_id: str) -> bool:
        """Whether the kernel passed a verification (any campaign)."""
        return self.db.execute("SELECT 1 FROM passed WHERE candidate=?", (cand_id,)).fetchone() is not None

    def _keep_regression(self, event: pb.Event, reason: int, message: str, checks, cand_id: str,
                         problem: str) -> None:
        """Keep the last failing check's input of a kernel that passed before (any campaign), where `reason` says
        it was wrong. Only inputs that can be re-drawn from a declared distribution and a seed are kept (not the
        memoisation probe's call sequences)."""
        # record() holds the lock: query the connection directly
        if reason not in WRONGNESS or not self._passed(cand_id):
            return
        failing = next((ch for ch in reversed(checks) if not ch.passed and ch.seed), None)
        if failing is None:
            return
        dist = failing.distribution.removeprefix("regression:")
        # a declared distribution, or one a GPU drew by the judge's counter-based generator ("device:normal"),
        # which kfactory.judge.inputs.draw draws again on any host
        if ":" in dist.removeprefix(counter_rng.PREFIX) or dist == "timed":
            return
        self.db.execute("INSERT OR IGNORE INTO regressions VALUES (?,?,?,?,?,?,?,?,?)",
                        (self.problem_name(problem), failing.shape, dist, str(failing.seed), cand_id,
                         event.campaign_id, pb.RejectReason.Name(reason), message[:500], event.time_unix_ns))

    def regressions(self, problem: str) -> list[pb.RegressionInput]:
        """The regression inputs memory holds for a problem, oldest first."""
        rows = self.q("SELECT problem, shape, distribution, seed, candidate, campaign, reason, note FROM "
                      "regressions WHERE problem=? ORDER BY time_ns", (problem,))
        return [pb.RegressionInput(problem=p, shape=sh, distribution=d, seed=int(seed), candidate_id=c,
                                   campaign_id=cp, reason=r, note=n) for p, sh, d, seed, c, cp, r, n in rows]

    # -- queries -------------------------------------------------------------------------------
    def q(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self.lock:
            return self.db.execute(sql, args).fetchall()

    def knows_problem(self, name: str) -> bool:
        """Whether an archived campaign measured or ran a problem of this name (each locator named as problem_name
        names it): what best, priors and lessons can answer for. The measurements are asked first, in SQL; the
        campaigns' locators (each resolved loads its package) only for a name none measured."""
        if self.q("SELECT 1 FROM measurements WHERE problem=? LIMIT 1", (name,)):
            return True
        return any(self.problem_name(loc) == name for (loc,) in self.q("SELECT DISTINCT problem FROM campaigns")
                   if loc)

    def packages_called(self, dirname: str) -> dict[str, str]:
        """The problem package directories archived campaigns ran (absolute paths: kfactory run and submit keep a
        package's so) whose directory is called `dirname`, each with the name its problem is filed under: the
        name its campaigns' measurements were filed under when they were recorded (a package gone since resolves
        to its own path now), else its name as problem_name resolves it; a package gone that left no measurement
        names nothing to answer for, and is left out."""
        out = {}
        for (loc,) in self.q("SELECT DISTINCT problem FROM campaigns"):
            if not (loc and PurePath(loc).is_absolute() and PurePath(loc).name == dirname):
                continue
            filed = {name for (name,) in self.q("SELECT DISTINCT m.problem FROM measurements m JOIN campaigns c "
                                                "ON m.campaign = c.id WHERE c.problem = ? AND m.problem IS NOT NULL",
                                                (loc,))}
            name = filed.pop() if len(filed) == 1 else self.problem_name(loc)
            if name != loc:
                out[loc] = name
        return out

    def events(self, campaign: str | None = None, candidate: str | None = None) -> list[pb.Event]:
        if candidate:
            rows = self.q("SELECT payload FROM events WHERE candidate=? ORDER BY seq", (candidate,))
        else:
            rows = self.q("SELECT payload FROM events WHERE campaign=? ORDER BY seq", (campaign,))
        return [pb.Event.FromString(r[0]) for r in rows]

    def leaderboard(self, campaign: str, limit: int = 20) -> list[tuple[pb.Measured, tuple]]:
        """The campaign's measured candidates, fastest first: (measurement, (family, params_json, origin))."""
        rows = self.q("SELECT m.payload, c.family, c.params_json, c.origin FROM measurements m JOIN candidates c "
                      "ON c.campaign=m.campaign AND c.id=m.candidate WHERE m.campaign=? ORDER BY m.score_s LIMIT ?",
                      (campaign, limit))
        return [(pb.Measured.FromString(r[0]), r[1:]) for r in rows]

    def last_measured(self, campaign: str, n: int, besides: str = "") -> set[str]:
        """The n candidates of the campaign measured last (by their first measurement's place in the archive),
        `besides` excepted."""
        if n <= 0:
            return set()
        return {c for (c,) in self.q("SELECT candidate FROM events WHERE campaign=? AND kind='measured' AND "
                                     "candidate!=? GROUP BY candidate ORDER BY MIN(seq) DESC LIMIT ?",
                                     (campaign, besides, n))}

    def best(self, problem: str, shape: str = "", device: str = "", target: str = "") -> tuple[pb.Measured, str] | None:
        """The fastest result of a problem (at a shape, on a device whose model contains `device`, of a candidate
        for `target`: `cuda` matches every cuda target, `cuda:sm_90a` only itself). A kernel a comparison found
        wrong never counts (Verdicts). Without a shape, of a finished campaign only the kernel it finished with
        counts: its showdown may have decided for another than the fastest by its own score (one faster in the
        interleaved timing, or tied there and faster at the other shapes), and its final comparison is that
        kernel's; a running campaign's measurements count as they stand. Each is scored from its own timings by the
        objective of the newest campaign's (the one started last: its weights, or its first shape alone;
        kfactory/judge/objective.py), the one returned with that score, and one that did not time a shape that
        objective scores does not count: the campaigns of a package whose weights or shapes changed compare like
        with like (two packages of one name, timed at 1x1536 and at 64x1536, compared their first shapes' medians).
        At a shape, the fastest there as measured, returned with its median there as its score."""
        rows = self.q("SELECT m.payload, m.campaign, c.started_ns, m.time_ns FROM measurements m LEFT JOIN "
                      "campaigns c ON c.id=m.campaign WHERE m.problem=? AND m.device LIKE ?",
                      (problem, f"%{device}%"))
        verdicts = self.problem_verdicts(problem)
        counted = []
        for payload, campaign, started, at in rows:
            m = pb.Measured.FromString(payload)
            # a screened-out timing is no result (it may never have been verified: kfactory/judge/order.py)
            if not (m.candidate.origin == Origin.REFERENCE.of() or m.screened_out
                    or not target_matches(m.candidate.target, target) or m.candidate.id in verdicts.wrong
                    or not shape and not verdicts.counts(campaign, m.candidate.id)):
                counted.append((m, campaign, (started or 0, at or 0)))
        newest = max(counted, key=lambda r: r[2])[0] if counted else None
        scored = objective.scored_by(newest) if newest is not None and not shape else None
        best = None
        for m, campaign, _ in counted:
            if shape:
                t = next((x for x in m.timings if x.shape == shape), None)
                score = t.median_s if t else None
            else:
                try:
                    score = objective.score(m.timings, scored) if scored else m.score_s
                except KeyError:
                    continue
            if score is not None and (best is None or score < best[0]):
                best = (score, m, campaign)
        if best is None:
            return None
        ranked_by = {shape: 1.0} if shape else scored
        if ranked_by:   # with the score it was ranked by (as `kfactory best` prints it), and what that score sums
            objective.restate(best[1], best[0], ranked_by)
        return best[1], best[2]

    def verdicts(self, campaigns: Iterable[str]) -> Verdicts:
        """What these campaigns decided beyond each kernel's own measurement, read from their archived events (so
        archives written before this question was asked answer it too)."""
        out = Verdicts()
        for campaign in campaigns:
            for event in self._decisions(campaign):
                out.fold(event)
        return out

    def problem_verdicts(self, problem: str, results: bool = True) -> Verdicts:
        """The verdicts of every campaign of a problem (its name, as measurements file it), folded in the archive's
        order (a kernel's KnownWrong names the first comparison that found it wrong): a kernel found wrong in one
        campaign, on one device, is wrong in every campaign and on any device (the same content id is the same
        kernel). Without `results`, only the kernels found wrong (`wrong`). Indexed queries: 300 campaigns answer
        in about 10 ms here, 2 ms without results."""
        rows = self.q(PROBLEM_COMPARISONS, ("comparison", problem))
        if results:
            rows += self.q(_OF_PROBLEM, ("campaign_finished", problem))
        return Verdicts.of(pb.Event.FromString(payload) for (payload,) in rows)

    def verdicts_around(self, campaign: str) -> Verdicts:
        """A campaign's own verdicts (its result), with every kernel a campaign of its problem found wrong: its
        leaderboard, status and report mark a kernel another campaign found wrong too."""
        out = self.verdicts([campaign])
        found = self.q("SELECT problem FROM measurements WHERE campaign=? LIMIT 1", (campaign,))
        if found:
            out.add_wrong(self.problem_verdicts(found[0][0], results=False).wrong)
        return out

    def known_wrong(self, problem: str) -> list[pb.KnownWrong]:
        """The kernels a comparison of any campaign of the problem found wrong, with the campaign that did and why
        (a new campaign's CampaignStarted.known_wrong), in the order they were found."""
        return list(self.problem_verdicts(problem, results=False).wrong.values())

    def comparison_cost(self, locator: str, target: str, device: str) -> list[tuple[str, float, float]]:
        """(campaign, a showdown's device seconds, a final comparison's): what a showdown and a compared result's
        final comparison held the device for in the latest completed campaigns of the problem `locator` (as their
        specs name it: a package of the same name with other shapes is another problem here) on `target` and the
        device model `device` (their summaries' device_seconds_showdown and device_seconds_final_comparison), the
        most recent first, at most COMPARISON_COST_CAMPAIGNS. Campaigns whose final comparison held it for none,
        or whose summary says no number (from before those figures), are left out."""
        rows = self.q(COMPARISON_COSTS, (locator, target, device, COMPARISON_COST_CAMPAIGNS))
        return [(c, float(sd), float(final)) for c, sd, final in rows]

    def comparisons_of(self, candidate: str) -> list[pb.Event]:
        """The comparisons about this candidate: its final comparisons and the showdowns it was timed for, and
        any that found it wrong (evidence.verdicts.found_wrong), from the campaigns its own events are in (a
        comparison is archived under no candidate)."""
        campaigns = [c for (c,) in self.q("SELECT campaign FROM events WHERE candidate=? GROUP BY campaign "
                                          "ORDER BY MIN(seq)", (candidate,))]
        if campaigns and self.q("SELECT 1 FROM candidates WHERE campaign=? AND id=? AND origin=?",
                                (campaigns[0], candidate, Origin.REFERENCE.of())):
            return []   # never compared nor a contender; its id is the same in every campaign of its problem
        return [e for c in campaigns for e in self._decisions(c) if e.HasField("comparison")
                and candidate in (e.comparison.candidate_id, found_wrong(e.comparison))]

    def _decisions(self, campaign: str) -> list[pb.Event]:
        """A campaign's comparisons and end, in the archive's order."""
        return [pb.Event.FromString(payload) for (payload,) in self.q(DECISIONS, (campaign,))]

    def checks(self, candidate: str, campaign: str) -> list[pb.Check]:
        """The figures of the candidate's verification in a campaign (empty when it has none)."""
        rows = self.q("SELECT payload FROM events WHERE candidate=? AND campaign=? AND kind='verified'",
                      (candidate, campaign))
        return list(pb.Event.FromString(rows[0][0]).verified.checks) if rows else []

    def priors(self, problem: str, families: list[str] | None = None, exclude_campaign: str = "",
               limit: int = 8, every_source: bool = False) -> list[pb.Prior]:
        """The best design points of a problem's families in other campaigns, ranked by how close each came
        to the best of its own campaign (so campaigns on devices of different speed compare); one entry per
        distinct point (per campaign and point with every_source), searched and warm-started points only (not
        the reference or hand-written kernels). With every_source the limit is shared among the campaigns: each
        one's best point, then each one's second best, and so on (each round in order of closeness), so a
        campaign with many points near its best (a flat space) cannot crowd the others' out of a warm start. A
        kernel a comparison found wrong is no evidence of a good point (Verdicts)."""
        rows = self.q("SELECT m.campaign, m.candidate, m.device, m.score_s, m.payload, c.family, c.params_json "
                      "FROM measurements m JOIN candidates c ON c.campaign=m.campaign AND c.id=m.candidate "
                      f"WHERE m.problem=? AND m.campaign!=? AND {sql_match('c.origin', STRATEGY)}",
                      (problem, exclude_campaign))
        wrong = self.problem_verdicts(problem, results=False).wrong
        best: dict[str, float] = {}
        kept = []
        for campaign, cand, device, score, payload, family, params in rows:
            if (families and family not in families or cand in wrong
                    or pb.Measured.FromString(payload).screened_out):
                continue
            best[campaign] = min(best.get(campaign, score), score)
            kept.append((campaign, cand, device, score, family, params))
        ranked = sorted((score / best[cp], family, params, score, device, cp, cand)
                        for cp, cand, device, score, family, params in kept)
        out: list[tuple[int, pb.Prior]] = []
        seen, place = set(), dict[str, int]()
        for relative, family, params, score, device, campaign, cand in ranked:
            key = (campaign if every_source else "", family, params)
            if key in seen:
                continue
            seen.add(key)
            place[campaign] = place.get(campaign, -1) + 1   # this campaign's how-manieth point
            out.append((place[campaign] if every_source else 0,
                        pb.Prior(family=family, params_json=params, score_s=score, relative=relative, device=device,
                                 campaign_id=campaign, candidate_id=cand)))
            if not every_source and len(out) >= limit:
                break
        out.sort(key=lambda r: r[0])   # stable: each round in order of closeness
        return [p for _, p in out[:limit]]

    def lineage(self, candidate: str) -> list[str]:
        out, frontier = list[str](), [candidate]
        while frontier and len(out) < 100:
            rows = self.q("SELECT parent FROM parents WHERE candidate=?", (frontier.pop(0),))
            for (p,) in rows:
                if p not in out:
                    out.append(p)
                    frontier.append(p)
        return out

    def candidates_with_prefix(self, prefix: str, limit: int) -> list[str]:
        """Up to `limit` distinct candidate ids that start with `prefix` (case-sensitive), in order."""
        return [c for (c,) in self.q("SELECT DISTINCT candidate FROM events WHERE candidate >= ? AND candidate < ? "
                                     "ORDER BY candidate LIMIT ?", (prefix, prefix + _TOP, limit))]

    def campaigns_with_prefix(self, prefix: str, limit: int) -> list[str]:
        """Up to `limit` distinct ids of archived campaigns that start with `prefix` (case-sensitive), in order."""
        return [c for (c,) in self.q("SELECT DISTINCT campaign FROM events WHERE campaign >= ? AND campaign < ? "
                                     "ORDER BY campaign LIMIT ?", (prefix, prefix + _TOP, limit))]

    def counts_by_producer(self, campaign: str) -> dict[str, int]:
        return dict(self.q("SELECT producer, COUNT(*) FROM events WHERE campaign=? GROUP BY producer", (campaign,)))
