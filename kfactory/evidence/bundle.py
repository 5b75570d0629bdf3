"""Evidence that travels: an archive's campaigns as a portable bundle, and the merge of one into another archive.

A lent GPU is bare every time and a cluster's benchmarkers come and go, so what one machine measured must reach
the next as data. A bundle is gzip-compressed JSON (deterministic bytes: sorted keys, no timestamp in the gzip
header), versioned by FORMAT and VERSION:

    {"format": "kfactory-evidence", "version": 1, "filter": {"problem": ..., "target": ...},
     "campaigns": [{"id", "problem", "target", "device", "state", "events"}],   an index, for people
     "events": [Event as protobuf JSON, ...],       every archived event of those campaigns, in archive order
     "objects": {sha256: {"text": ...} | {"base64": ...}},   the sources the candidates name
     "problem_names": {locator: name},               how the source machine named each problem locator
     "regressions": [RegressionInput as JSON, ...]}  the inputs that once exposed a wrong kernel

Events carry everything else: measurements with their device facts (DeviceInfo, telemetry), verification records
with every check's figures, compile reports, lineage. Importing records each event as memory records one from
the stream (Archive.merge), so warm starts, lessons and regression inputs use imported evidence as their own.
Importing twice changes nothing (events are keyed by id, objects by content); a bundle holding an id the archive
has with other content is refused whole, with the reasons. Compiled artifacts are left out: they are rebuilt
from the source in seconds, and a bundle must stay small enough to commit (evidence/).
"""
from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
from pathlib import Path

from google.protobuf import json_format

from kfactory.platform.fsutil import atomic_write
from kfactory.services.memory.archive import Archive, target_matches
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb
from kfactory.evidence.workspace import Workspace, is_digest

FORMAT = "kfactory-evidence"
#: the bundle layout's version: a reader refuses a newer one (it cannot know what it would drop). 2: measurements
#: may carry the weights they were scored with (Measured.objective), which a reader of 1 cannot parse; a bundle
#: with none is written as 1 (UNWEIGHTED), so that it still reads everywhere
VERSION = 2
UNWEIGHTED = 1
#: the largest bundle a reader unpacks (a gzip bomb must not take the machine's memory)
MAX_BUNDLE_BYTES = 1 << 30
#: bytes per message of a bundle streamed over gRPC (which refuses messages over 4 MiB by default)
CHUNK_BYTES = 1 << 20


class BundleError(ValueError):
    """A file that is no evidence bundle this kfactory can read; the message says why, in one line."""


def _as_json(msg) -> dict:
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


def _campaign_ids(archive: Archive, problem: str, target: str) -> list[tuple]:
    """(id, locator, target, device, state) of the archived campaigns of `problem` (a name or locator; empty:
    every problem) on `target` (a bare target name takes each of its variants; empty: every target)."""
    want = archive.problem_name(problem) if problem else ""
    rows = archive.q("SELECT id, problem, target, device, state FROM campaigns ORDER BY started_ns, id")
    return [r for r in rows if (not want or archive.problem_name(r[1] or "") == want)
            and target_matches(r[2] or "", target)]


def export_bundle(archive: Archive, get_object, problem: str = "", target: str = "") -> dict:
    """The bundle of every archived campaign of `problem` on `target` (see the module's docstring); `get_object`
    maps a digest to its bytes or None (Workspace.get). A source no store holds is left out, not an error."""
    campaigns = _campaign_ids(archive, problem, target)
    ids = [c[0] for c in campaigns]
    rows = []
    for start in range(0, len(ids), 500):  # SQLite caps the parameters of one statement
        part = ids[start:start + 500]
        rows += archive.q(f"SELECT seq, payload FROM events WHERE campaign IN ({','.join('?' * len(part))})",
                          tuple(part))
    # archive order across campaigns: a kernel verified in one campaign and found wrong in a later one is a
    # regression input only when the importer meets the two in that order too
    events = [pb.Event.FromString(payload) for _, payload in sorted(rows)]
    counts: dict[str, int] = {}
    objects, locators = {}, set()
    for e in events:
        counts[e.campaign_id] = counts.get(e.campaign_id, 0) + 1
        if e.HasField("campaign_started"):
            locators.add(e.campaign_started.spec.problem)
        if e.HasField("candidate_created"):
            cand = e.candidate_created.candidate
            locators.add(cand.problem)
            if is_digest(cand.source_digest) and cand.source_digest not in objects:
                data = get_object(cand.source_digest)
                if data is not None:
                    objects[cand.source_digest] = _object_json(data)
    names = {loc: archive.problem_name(loc) for loc in sorted(locators) if loc}
    kept = set(ids)
    regressions = [_as_json(r) for name in sorted(set(names.values())) for r in archive.regressions(name)
                   if r.campaign_id in kept]
    weighted = any(e.HasField("measured") and e.measured.objective for e in events)
    return {"format": FORMAT, "version": VERSION if weighted else UNWEIGHTED,
            "filter": {"problem": problem, "target": target},
            "campaigns": [{"id": c, "problem": names.get(loc or "", loc), "target": t, "device": d, "state": s,
                           "events": counts.get(c, 0)} for c, loc, t, d, s in campaigns],
            "events": [_as_json(e) for e in events], "objects": objects, "problem_names": names,
            "regressions": regressions}


def _object_json(data: bytes) -> dict:
    try:
        return {"text": data.decode()}
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode()}


def dumps(bundle: dict) -> bytes:
    """The bundle as gzip-compressed JSON, the same bytes for the same bundle (no time in the gzip header)."""
    raw = json.dumps(bundle, sort_keys=True, separators=(",", ":")).encode()
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=9) as gz:
        gz.write(raw)
    return buf.getvalue()


def loads(data: bytes) -> dict:
    """A bundle from its bytes (gzip-compressed or plain JSON); BundleError when it is not one, or is of a newer
    version than this kfactory reads."""
    try:
        if data[:2] == b"\x1f\x8b":
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as gz:
                data = gz.read(MAX_BUNDLE_BYTES + 1)
            if len(data) > MAX_BUNDLE_BYTES:
                raise BundleError(f"it unpacks to over {MAX_BUNDLE_BYTES} bytes")
        bundle = json.loads(data)
    except (OSError, EOFError, ValueError) as e:  # gzip.BadGzipFile is an OSError; JSONDecodeError a ValueError
        if isinstance(e, BundleError):
            raise
        raise BundleError(f"not gzip-compressed JSON: {type(e).__name__}: {e}") from None
    if not isinstance(bundle, dict) or bundle.get("format") != FORMAT:
        raise BundleError(f"not a kfactory evidence bundle (its format is not {FORMAT!r})")
    version = bundle.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:   # (true is an int to Python)
        raise BundleError(f"version {version!r} is no bundle version")
    if version > VERSION:
        raise BundleError(f"version {version} was written by a newer kfactory (this one reads up to {VERSION})")
    for key, kind in (("events", list), ("objects", dict), ("problem_names", dict), ("regressions", list)):
        if not isinstance(bundle.get(key, kind()), kind):
            raise BundleError(f"its {key!r} is not a JSON {kind.__name__}")
    return bundle


def read(path: Path | str) -> dict:
    """The bundle in a file (BundleError when it cannot be read or is not one)."""
    try:
        return loads(Path(path).read_bytes())
    except OSError as e:
        raise BundleError(f"cannot read it: {e.strerror or e}") from None


def write(path: Path | str, bundle: dict) -> Path:
    """Write a bundle (see dumps) atomically enough for a script cut mid-write: a temporary file, then a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, dumps(bundle))
    return path


def _decoded(bundle: dict) -> tuple[list[pb.Event], dict[str, bytes], dict[str, str], list[pb.RegressionInput]]:
    """The bundle's events, objects (each checked against its digest), names and regression inputs; BundleError
    for anything malformed."""
    for what in ("events", "regressions"):
        items = bundle.get(what, [])
        if not isinstance(items, list):
            raise BundleError(f"its {what} are not a list: the bundle is damaged or no bundle")
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise BundleError(f"{what}[{i}] is {type(item).__name__}, not an object: the bundle is damaged or "
                                  "no bundle")
    try:
        events = [json_format.ParseDict(e, pb.Event()) for e in bundle.get("events", [])]
        regressions = [json_format.ParseDict(r, pb.RegressionInput()) for r in bundle.get("regressions", [])]
    except (json_format.ParseError, TypeError, AttributeError) as e:
        raise BundleError(f"an event or regression input does not parse: {e}") from None
    objects = {}
    for digest, obj in bundle.get("objects", {}).items():
        try:
            data = obj["text"].encode() if "text" in obj else base64.b64decode(obj["base64"], validate=True)
        except (KeyError, TypeError, ValueError, AttributeError):
            raise BundleError(f"object {str(digest)[:70]!r} is neither text nor base64") from None
        if not is_digest(digest) or hashlib.sha256(data).hexdigest() != digest:
            raise BundleError(f"object {str(digest)[:70]!r}: its bytes do not hash to its name")
        objects[digest] = data
    names = bundle.get("problem_names", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in names.items()):
        raise BundleError("its problem_names are not strings")
    return events, objects, names, regressions


def import_bundle(archive: Archive, workspace: Workspace, bundle: dict) -> spb.ImportResult:
    """Merge a bundle into an archive and its workspace's object store. Idempotent; refused whole (the result's
    `refused` says why, nothing is kept) when it conflicts with what the archive holds. Raises BundleError for a
    malformed bundle."""
    events, objects, names, regressions = _decoded(bundle)
    campaigns = len({e.campaign_id for e in events if e.HasField("campaign_started")})
    added, present, held, reg_added, refused = archive.merge(events, names, regressions)
    if refused:
        return spb.ImportResult(campaigns=campaigns, refused=refused)
    # after the archive took the events: a refused bundle leaves nothing behind (an object the archive names but
    # the store lacks is what memory tolerates for an artifact the bus lost: `best --candidate` shows no source)
    new_objects = 0
    for digest, data in objects.items():
        if not workspace.has(digest):
            workspace.put(data)
            new_objects += 1
    return spb.ImportResult(events_added=added, events_present=present, events_held=held, objects_added=new_objects,
                            regressions_added=reg_added, campaigns=campaigns)


def summary(result: spb.ImportResult) -> str:
    """One line on what an import did (or the reasons it was refused, one per line)."""
    if result.refused:
        shown = result.refused[:20]
        more = f"\n  ... and {len(result.refused) - len(shown)} more" if len(result.refused) > len(shown) else ""
        return "refused, nothing imported:\n" + "\n".join(f"  {r}" for r in shown) + more
    held = f", {result.events_held} held until their evidence chain arrives" if result.events_held else ""
    return (f"{result.campaigns} campaigns: {result.events_added} events added, {result.events_present} already "
            f"here{held}; {result.objects_added} sources added; {result.regressions_added} regression inputs added")
