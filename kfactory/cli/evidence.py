"""`kfactory evidence export|import`: evidence bundles (kfactory/evidence/bundle.py) written from and merged into
the local workspace, or a memory service when its address is given (--memory or KFACTORY_MEMORY_ADDR)."""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from kfactory.cli import query_filter

WHERE = ("Works on the local workspace under KFACTORY_DATA_DIR, or on the running memory service whose address is "
         "given (--memory or KFACTORY_MEMORY_ADDR).")


def add_parser(sub) -> None:
    """Register `evidence export` and `evidence import` on the CLI's subparsers."""
    p = sub.add_parser("evidence", help="carry evidence between machines: export a bundle, import one",
                       description=f"Carry evidence between machines. {WHERE}")
    esub = p.add_subparsers(dest="evidence_cmd", required=True)
    e = esub.add_parser("export", help="write the archive's campaigns, sources, measurements, verification records "
                                       "and regression inputs as one compressed, versioned bundle")
    e.add_argument("--problem", default="", help="only this problem's campaigns (default: every problem)")
    e.add_argument("--target", default="", type=query_filter("filter_error"),
                   help="only this target's: cpu, cuda (any architecture), cuda:sm_90a")
    e.add_argument("--out", type=Path, required=True, help="the bundle file to write (e.g. evidence/softmax.json.gz)")
    i = esub.add_parser("import", help="merge a bundle into the workspace or memory service (idempotent; a bundle "
                                       "that conflicts with what is there is refused whole, with the reasons)")
    i.add_argument("file", type=Path, nargs="+", help="bundle files, merged one after another")
    for q in (e, i):
        q.add_argument("--memory", help="Evidence service address (env KFACTORY_MEMORY_ADDR); unset: the local "
                                        "workspace")
        q.add_argument("--json", dest="as_json", action="store_true", help="print what was done as JSON")


def run(args: argparse.Namespace, settings) -> int:
    """Exit 0 when done, 1 when a bundle was refused or the service failed, 2 for a file that is no bundle."""
    import grpc  # here, not at the top: building the CLI's parser must stay cheap for every other command

    from kfactory.evidence import bundle as eb
    from kfactory.cli.client import memory_configured

    remote = memory_configured(settings)
    try:
        if args.evidence_cmd == "export":
            return _export(args, settings, remote)
        return _import(args, settings, remote)
    except eb.BundleError as e:
        print(f"kfactory evidence: {e}", file=sys.stderr)
        return 2
    except grpc.aio.AioRpcError as e:
        code = 2 if e.code() == grpc.StatusCode.INVALID_ARGUMENT else 1
        print(f"kfactory evidence: {settings.memory_addr}: {e.code().name}: {(e.details() or '')[:2000]}",
              file=sys.stderr)
        return code


def _export(args, settings, remote: bool) -> int:
    from kfactory.evidence import bundle as eb
    from kfactory.platform.fsutil import atomic_write

    if args.out.is_dir():   # `--out ""` is the working directory too
        print(f"kfactory evidence: --out {str(args.out) if str(args.out) != '.' else repr('')}: a directory; name "
              "the bundle file to write (e.g. evidence/softmax.json.gz)", file=sys.stderr)
        return 2
    from kfactory.cli.client import loads_here

    # a problem that is none here must be one some archived campaign ran: a mistyped name is refused, not an
    # empty bundle
    known = bool(args.problem) and not loads_here(args.problem)
    if remote:
        data = asyncio.run(_remote_export(settings, args.problem, args.target, known))
        bundle = eb.loads(data)
    else:
        from kfactory.services.memory.queries import InvalidRequest

        try:
            bundle = local_export(settings, args.problem, args.target, known)
        except InvalidRequest as e:   # --problem names nothing: a mistyped name, not an empty bundle
            print(f"kfactory evidence: --problem: {e}", file=sys.stderr)
            return 2
        data = eb.dumps(bundle)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out, data)   # a temporary file beside it, removed if the write fails
    n, events = len(bundle["campaigns"]), len(bundle["events"])
    if args.as_json:
        print(json.dumps({"file": str(args.out), "bytes": len(data), "campaigns": n, "events": events,
                          "objects": len(bundle["objects"]), "regressions": len(bundle["regressions"])}))
    else:
        print(f"{args.out}: {n} campaigns, {events} events, {len(bundle['objects'])} sources, "
              f"{len(bundle['regressions'])} regression inputs, {len(data)} bytes")
    if not n:
        print("kfactory evidence: no campaign matched: the bundle is empty", file=sys.stderr)
    return 0


def local_export(settings, problem: str = "", target: str = "", known: bool = False) -> dict:
    """The bundle of the local workspace's campaigns (an empty one when no campaign ran here). With `known`, a
    `problem` no archived campaign ran is refused (UnknownProblem, an InvalidRequest)."""
    from kfactory.evidence import bundle as eb
    from kfactory.services.memory.archive import Archive
    from kfactory.services.memory.queries import Queries, UnknownProblem, problem_name
    from kfactory.evidence.workspace import Workspace

    must_know = known and bool(problem)
    ws = Workspace.of(settings)
    try:
        archive = Archive.reader(ws.archive_path, problem_name)
    except FileNotFoundError:
        if must_know:
            raise UnknownProblem(problem) from None
        return {"format": eb.FORMAT, "version": eb.UNWEIGHTED, "filter": {"problem": problem, "target": target},
                "campaigns": [], "events": [], "objects": {}, "problem_names": {}, "regressions": []}
    try:
        if must_know:
            Queries(archive).problem(problem, require_known=True)
        return eb.export_bundle(archive, ws.get, problem, target)
    finally:
        archive.close()


def local_import(settings, bundle: dict):
    """Merge a bundle into the local workspace (its archive is created when there is none); the ImportResult."""
    from kfactory.evidence import bundle as eb
    from kfactory.services.memory.archive import Archive
    from kfactory.services.memory.queries import problem_name
    from kfactory.evidence.workspace import Workspace

    ws = Workspace.of(settings)
    archive = Archive(ws.archive_path, problem_name)
    try:
        return eb.import_bundle(archive, ws, bundle)
    finally:
        archive.close()


def _import(args, settings, remote: bool) -> int:
    from google.protobuf.json_format import MessageToDict

    from kfactory.evidence import bundle as eb

    rc = 0
    for path in args.file:   # each file on its own: one that is no bundle is named, and the rest still go in
        try:
            result = _import_one(path, settings, remote)
        except eb.BundleError as e:
            print(f"kfactory evidence: {path}: {e}", file=sys.stderr)
            rc = max(rc, 2)
            continue
        if args.as_json:
            print(json.dumps({"file": str(path), **MessageToDict(result, preserving_proto_field_name=True,
                                                                  always_print_fields_with_no_presence=True)}))
        else:
            print(f"{path}: {eb.summary(result)}", file=sys.stderr if result.refused else sys.stdout)
        rc = max(rc, 1 if result.refused else 0)
    return rc


def _import_one(path, settings, remote: bool):
    """One bundle file merged (into the memory service when `remote`); BundleError when it is no bundle."""
    from kfactory.evidence import bundle as eb

    if not remote:
        return local_import(settings, eb.read(path))
    try:
        data = path.read_bytes()
    except OSError as e:
        raise eb.BundleError(f"cannot read it: {e.strerror or e}") from None
    eb.loads(data)  # a file that is no bundle is told here, before it travels
    return asyncio.run(_remote_import(settings, data))


async def _remote_export(settings, problem: str, target: str, known: bool) -> bytes:
    from kfactory.platform.evidence_client import EvidenceClient
    from kfactory.v1 import services_pb2 as spb

    async with EvidenceClient(settings.memory_addr, settings) as memory:
        return await memory.export_bundle(spb.ExportRequest(problem=problem, target=target, require_known=known))


async def _remote_import(settings, data: bytes):
    from kfactory.evidence import bundle as eb
    from kfactory.platform.evidence_client import EvidenceClient
    from kfactory.v1 import services_pb2 as spb

    async def chunks():
        for start in range(0, len(data), eb.CHUNK_BYTES):
            yield spb.BundleChunk(data=data[start:start + eb.CHUNK_BYTES])

    async with EvidenceClient(settings.memory_addr, settings) as memory:
        return await memory.import_bundle(chunks())
