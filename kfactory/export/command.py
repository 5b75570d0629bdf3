"""`kfactory export ID|PROBLEM|MODEL --format c|python|torch --name NAME --out DIR`: the CLI side.

A MODEL (smollm2-135m, tiny-llama, a model package directory) exports its best verified inference engine
instead: kfactory/engines/export.py.

The kernel is a candidate id (or a unique prefix), or a problem, whose fastest measured kernel (at --shape, on
--target, default cpu) is taken. Its evidence comes from kfactory.cli.client (the running factory named by --memory
or KFACTORY_MEMORY_ADDR, else the local workspace). Exit 0 with the paths written; 1 when the kernel cannot be
exported (not verified, no such kernel), one line saying why; 2 for a bad --name.
"""
from __future__ import annotations

import asyncio
import json
import sys

from kfactory.export import ExportError, check_name, export
from kfactory.problems import ProblemError, load_problem
from kfactory.platform.spec_ranges import PRIORS_LIMIT
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb

EXIT_REFUSED = 1
EXIT_USAGE = 2


def _say(text: str) -> None:
    print(f"kfactory export: {text}", file=sys.stderr)


def _problem_or_none(text: str):
    """The problem `text` names, or None when it names none (then it is a candidate id)."""
    try:
        return load_problem(text)
    except ProblemError:
        return None


def evidence_for(settings, kernel: str, shape: str, target: str) -> spb.CandidateEvidence:
    """The evidence of the kernel the user named: a problem's fastest kernel (a problem here, a built-in's name
    being the built-in; else a problem campaigns ran, by its name or its package's directory name, as `kfactory
    best` takes it), else a candidate id or prefix. Raises kfactory.cli.client.ClientError (the CLI prints it)
    when there is none."""
    import grpc

    from kfactory.cli import client

    if _problem_or_none(kernel) is not None:
        entry = client.best_entry(settings, kernel, shape, target or "cpu")
        return client.candidate_evidence(settings, entry.candidate_id)
    try:   # a problem campaigns ran whose package is not here by that name (`famok` for a run of ./famok)
        entry = client.best_entry(settings, kernel, shape, target or "cpu")
    except client.ClientError as e:
        if e.status != grpc.StatusCode.NOT_FOUND:   # a directory name of several problems' packages: which one
            raise
    else:
        return client.candidate_evidence(settings, entry.candidate_id)
    if shape:  # a candidate is one kernel: no shape chooses among kernels, and one ignored would mislead
        raise client.ClientError(f"--shape chooses a problem's fastest kernel at a shape; {kernel!r} names no "
                                 "problem measured there (a candidate id names one kernel already): drop --shape "
                                 "or name the problem", 2)
    try:
        return client.candidate_evidence(settings, kernel)
    except client.ClientError as e:
        if e.status != grpc.StatusCode.NOT_FOUND or isinstance(e, client.NoWorkspace):   # that says where it looked
            raise
        raise client.ClientError(f"{kernel!r} names no candidate and no problem with a kernel measured on "
                                 f"{target or 'cpu'}: give a candidate id (or a unique prefix), a problem's name, or "
                                 "its package directory (kfactory status lists the campaigns)", 1) from e


def family_priors(settings, problem: str, family: str) -> list[pb.Prior]:
    """Memory's measurements of a family's points in every campaign (where `kfactory priors` reads them), for
    NAME_params.h; [] when there are none to read (the header then holds the kernel's own point)."""
    from kfactory.cli import client

    # the Evidence query `kfactory priors` makes: the configured memory, else the local workspace
    query = getattr(client, "_evidence", None)
    if query is None:
        _say(f"note: this kfactory cannot query measurements of family {family}; NAME_params.h holds the kernel's "
             "own point")
        return []
    request = spb.PriorsRequest(problem=problem, families=[family], limit=int(PRIORS_LIMIT.high), every_source=True)
    try:
        return list(asyncio.run(query(settings, "Priors", request)).priors)
    except client.ClientError as exc:
        _say(f"note: no measurements of family {family} to choose parameters per device from ({exc})")
        return []


def run(args, settings) -> int:
    """The command; kfactory.cli.client.ClientError is left to the CLI's handler (one line, its exit code)."""
    try:
        check_name(args.name)
    except ExportError as exc:
        _say(str(exc))
        return EXIT_USAGE
    from kfactory.engines import export as engine_export

    if engine_export.is_model(args.kernel):   # a model names its best verified engine, not a kernel
        return engine_export.command(args, settings.data_dir)
    evidence = evidence_for(settings, args.kernel, args.shape, args.target)
    cand = evidence.candidate
    if args.target and cand.target.split(":", 1)[0] != args.target.split(":", 1)[0]:
        _say(f"candidate {cand.id[:12]} is a {cand.target} kernel, not {args.target}")
        return EXIT_REFUSED
    try:
        problem = load_problem(cand.problem)
    except ProblemError as exc:
        _say(f"candidate {cand.id[:12]}: its problem cannot be loaded here: {exc}")
        return EXIT_REFUSED
    priors = family_priors(settings, problem.name, cand.family) if cand.family and cand.params_json else []
    try:
        paths = export(evidence, problem, args.fmt, args.name, args.out, priors)
    except ExportError as exc:
        _say(str(exc))
        return EXIT_REFUSED
    if getattr(args, "as_json", False):
        print(json.dumps({"candidate_id": cand.id, "format": args.fmt, "files": [str(p) for p in paths]}, indent=2))
    else:
        print("\n".join(str(p) for p in paths))
    return 0
