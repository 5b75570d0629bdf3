"""The evidence archive: an embedded SQLite database materialised from the events stream.

Inserts are keyed by event id, so replaying the stream (or a redelivery) changes nothing twice; deleting
the file and replaying the stream rebuilds it.
"""
from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from kfactory import events as ev
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
CREATE TABLE IF NOT EXISTS outcomes (
  campaign TEXT, candidate TEXT, point_id TEXT, stage TEXT, reason TEXT, message TEXT, time_ns INTEGER);
"""


class Archive:
    """Thread-safe access to the SQLite archive (one connection, serialised)."""

    def __init__(self, path: Path | str, problem_name=lambda locator: locator):
        """`problem_name` maps a candidate's problem locator (a name or a package path) to its name."""
        self.problem_name = problem_name
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(SCHEMA)
        self.lock = threading.Lock()

    def close(self) -> None:
        self.db.close()

    def record(self, event: pb.Event) -> bool:
        """Archive one event; False when it was already there."""
        kind = ev.kind_of(event)
        cand = ev.candidate_of(event)
        with self.lock:
            self.db.execute("BEGIN")
            try:
                cur = self.db.execute(
                    "INSERT OR IGNORE INTO events (id, campaign, kind, producer, candidate, time_ns, payload) "
                    "VALUES (?,?,?,?,?,?,?)", (event.id, event.campaign_id, kind, event.producer,
                                               cand.id if cand and cand.id else None, event.time_unix_ns,
                                               event.SerializeToString()))
                if cur.rowcount:
                    self._materialise(event, kind, cand)
                self.db.execute("COMMIT")
            except sqlite3.Error:
                self.db.execute("ROLLBACK")
                raise
        return bool(cur.rowcount)

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
        elif kind == "candidate_created":
            self.db.execute("INSERT OR IGNORE INTO candidates VALUES (?,?,?,?,?,?,?,?,?,?)",
                            (c, cand.id, cand.problem, cand.target, cand.family, cand.origin, cand.params_json,
                             cand.point_id, cand.source_digest, cand.compile_flags))
            self.db.executemany("INSERT OR IGNORE INTO parents VALUES (?,?)", [(cand.id, p) for p in cand.parents])
        elif kind == "measured":
            m = event.measured
            self.db.execute("INSERT OR REPLACE INTO measurements VALUES (?,?,?,?,?,?,?)",
                            (c, cand.id, self.problem_name(cand.problem), m.device.model, m.score_s, t,
                             m.SerializeToString()))
            self.db.execute("INSERT INTO outcomes VALUES (?,?,?,?,?,?,?)",
                            (c, cand.id, cand.point_id, "benchmarker", "measured", "", t))
        elif kind in ("rejected", "compile_failed"):
            body = getattr(event, kind)
            reason = pb.RejectReason.Name(body.reason)
            stage = body.stage if kind == "rejected" else "compiler"
            pid = body.point_id if kind == "rejected" and body.point_id else cand.point_id
            self.db.execute("INSERT INTO outcomes VALUES (?,?,?,?,?,?,?)",
                            (c, cand.id, pid, stage, reason, body.message[:2000], t))

    # -- queries -------------------------------------------------------------------------------
    def q(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self.lock:
            return self.db.execute(sql, args).fetchall()

    def events(self, campaign: str | None = None, candidate: str | None = None) -> list[pb.Event]:
        if candidate:
            rows = self.q("SELECT payload FROM events WHERE candidate=? ORDER BY seq", (candidate,))
        else:
            rows = self.q("SELECT payload FROM events WHERE campaign=? ORDER BY seq", (campaign,))
        return [pb.Event.FromString(r[0]) for r in rows]

    def leaderboard(self, campaign: str, limit: int = 20) -> list[tuple[pb.Measured, tuple]]:
        rows = self.q("SELECT m.payload, c.family, c.params_json, c.origin FROM measurements m JOIN candidates c "
                      "ON c.campaign=m.campaign AND c.id=m.candidate WHERE m.campaign=? ORDER BY m.score_s LIMIT ?",
                      (campaign, limit))
        return [(pb.Measured.FromString(r[0]), r[1:]) for r in rows]

    def best(self, problem: str, shape: str = "", device: str = "") -> tuple[pb.Measured, str] | None:
        """The fastest measurement of a problem (at a shape, on a device whose model contains `device`)."""
        rows = self.q("SELECT payload, campaign FROM measurements WHERE problem=? AND device LIKE ?",
                      (problem, f"%{device}%"))
        best = None
        for payload, campaign in rows:
            m = pb.Measured.FromString(payload)
            if m.candidate.origin == "reference":
                continue
            t = next((x for x in m.timings if x.shape == shape), None) if shape else None
            score = t.median_s if t else (m.score_s if not shape else None)
            if score is not None and (best is None or score < best[0]):
                best = (score, m, campaign)
        return (best[1], best[2]) if best else None

    def lineage(self, candidate: str) -> list[str]:
        out, frontier = [], [candidate]
        while frontier and len(out) < 100:
            rows = self.q("SELECT parent FROM parents WHERE candidate=?", (frontier.pop(0),))
            for (p,) in rows:
                if p not in out:
                    out.append(p)
                    frontier.append(p)
        return out

    def counts_by_producer(self, campaign: str) -> dict[str, int]:
        return dict(self.q("SELECT producer, COUNT(*) FROM events WHERE campaign=? GROUP BY producer", (campaign,)))
