"""The `kfactory` command line."""
from __future__ import annotations

import argparse
import asyncio
import faulthandler
import sys
from pathlib import Path

from pydantic import ValidationError

from kfactory.cli import EXIT_UNAVAILABLE, query_filter
from kfactory.platform.config import Settings
from kfactory.platform.fsutil import out_dir
from kfactory.platform.heap import keep_freed_memory_if_set
from kfactory.observability.log import configure
from kfactory.platform.spec_ranges import cli_type

EXIT_USAGE = 2


#: the settings a flag overrides (field: the argparse dest that holds it), each named by its flag in an error
FLAG_SETTINGS = {"nats_url": "nats_url", "redis_url": "redis_url", "planner_addr": "planner", "memory_addr": "memory",
                 "threads": "threads", "report_dir": "report_dir", "precompiled": "precompiled",
                 # agent coders' endpoint (each overrides its KFACTORY_LLM_* variable)
                 "llm_provider": "llm_provider", "llm_base_url": "llm_base_url", "llm_model": "llm_model",
                 "llm_api_key": "llm_api_key", "llm_concurrency": "llm_concurrency",
                 "llm_token_budget": "token_budget"}


def _flag_overrides(args) -> dict:
    """The settings this command's flags give (a flag not given, or --token-budget 0, leaves its variable's)."""
    return {field: value for field, dest in FLAG_SETTINGS.items()
            if (value := getattr(args, dest, None)) is not None and not (dest == "token_budget" and not value)}


def _settings(args) -> Settings:
    return Settings(**_flag_overrides(args))


def _given_flags(args) -> dict[str, str]:
    """field: flag, for each setting a flag of this command gave."""
    return {field: "--" + FLAG_SETTINGS[field].replace("_", "-") for field in _flag_overrides(args)}


def _agent_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--coders", default="template", help="comma-separated coders: template, agent (LLM agents: "
                   "need --llm-base-url and --llm-model or KFACTORY_LLM_*)")
    p.add_argument("--personas", default="", help="comma-separated agent personas (default: all): memory_bound, "
                   "compute_bound, repairer")
    p.add_argument("--token-budget", type=cli_type("token_budget"), help="agent tokens the campaign may spend (env "
                   "KFACTORY_LLM_TOKEN_BUDGET; default 200000)")
    p.add_argument("--llm-provider", choices=("openai", "anthropic"), help="openai: the OpenAI-compatible chat API "
                   "(vLLM, SGLang, Ollama, hosted); anthropic: the messages API (env KFACTORY_LLM_PROVIDER)")
    p.add_argument("--llm-base-url", help="e.g. http://localhost:8000/v1 (env KFACTORY_LLM_BASE_URL)")
    p.add_argument("--llm-model", help="model name as the endpoint knows it (env KFACTORY_LLM_MODEL)")
    p.add_argument("--llm-api-key", help="prefer the env KFACTORY_LLM_API_KEY (a flag shows in ps)")
    p.add_argument("--llm-concurrency", type=int, help="requests in flight per persona (env KFACTORY_LLM_CONCURRENCY)")


def _spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("problem", help="a built-in problem name or a problem package directory")
    p.add_argument("--target", default="cpu", help="cpu, cuda[:sm_80|sm_90a|sm_100a] or replay:<cache file>")
    p.add_argument("--budget", type=cli_type("budget_candidates"), default=40, help="design points to evaluate")
    p.add_argument("--warm", type=cli_type("warm_start"), default=8,
                   help="priors from memory that seed the search (0: cold start)")
    p.add_argument("--seconds", type=cli_type("budget_seconds", float), default=0.0,
                   help="wall-clock budget (0: none)")
    p.add_argument("--device-seconds", type=cli_type("budget_device_seconds", float), default=0.0,
                   help="device time the campaign's verifications, screens, measurements and comparisons may "
                        "hold (0: the planner's KFACTORY_DEVICE_SECONDS, else none); the search stops when what "
                        "is left cannot pay for one more candidate and the showdown and final comparison after "
                        "it (what recent campaigns' held, else KFACTORY_COMPARE_RESERVE of the budget, at most "
                        "half); the summary reports device seconds per candidate and the comparisons' apart")
    p.add_argument("--goal", type=cli_type("goal_fraction", float), default=0.0, metavar="FRACTION",
                   help="stop the search once a candidate reaches this fraction of the device's measured ceiling "
                        "(the copy bandwidth for a kernel that moves bytes) at every shape it was timed at, e.g. "
                        "0.9 (0: no goal; the budgets still apply)")
    p.add_argument("--strategy", default="default", help="default (a portfolio of surrogate, tpe and evolutionary; "
                   "descent for an engine problem), surrogate, tpe, cma, evolutionary, portfolio, random, grid or "
                   "descent (kfactory strategies list)")
    p.add_argument("--strategy-option", action="append", default=[], metavar="NAME=VALUE",
                   help="an option of the strategy (repeatable; a portfolio member's as MEMBER.NAME=VALUE): "
                        "kfactory strategies describe STRATEGY lists them")
    p.add_argument("--threads", type=cli_type("threads"), help="threads kernels run with (default: all cores)")
    p.add_argument("--seed", type=cli_type("seed"), default=0, help="strategy seed (0: random)")
    p.add_argument("--parallel", type=cli_type("parallel"), default=0,
                   help="design points in flight at once (default 0: the planner's, three on cpu plus one per agent "
                        "persona, one per core plus two elsewhere)")
    p.add_argument("--family", action="append", default=[], help="restrict to these families")
    p.add_argument("--manual", action="append", default=[], metavar="NAME=FILE[:FLAGS]",
                   help="add a hand-written kernel as a candidate (repeatable)")
    from kfactory.engines.defaults import MARGIN, ROUNDS, TIMING_ROUNDS

    p.add_argument("--rounds", type=cli_type("timing_rounds"), default=None,
                   help=f"an engine problem only: timing rounds per verified design after the search (default "
                        f"{TIMING_ROUNDS}, as `kfactory engine run`; docs/engines.md)")
    p.add_argument("--showdown", type=cli_type("showdown_rounds"), default=None,
                   help=f"an engine problem only: showdown rounds among the designs within --showdown-margin of "
                        f"the fastest (default {ROUNDS}; 0: none)")
    p.add_argument("--showdown-margin", type=cli_type("showdown_margin", float), default=None,
                   help=f"an engine problem only: the showdown's margin (default {MARGIN})")
    _agent_args(p)


def _package_locator(problem: str) -> str:
    """A package directory given to `kfactory run` or `submit` as an absolute path: the campaign's records keep it, and
    export, best and report must find the package from any working directory (a built-in name, a replay or
    engine problem, or a path that is no package, stays as given)."""
    from kfactory.problems import list_problems

    path = Path(problem)
    try:
        package = problem not in list_problems() and (path / "problem.yaml").is_file()
    except (OSError, ValueError):
        package = False
    return str(path.resolve()) if package else problem


def _spec(args):
    from kfactory.v1 import events_pb2 as pb

    from kfactory.engines.order import STRATEGY as ENGINE_STRATEGY, STRATEGY_OPTIONS as ENGINE_OPTIONS
    from kfactory.engines.problem import PREFIX as ENGINE_PREFIX

    # a replay target carries its own problem (the recorded space): PROBLEM is then only a label
    problem = args.target if args.target.startswith("replay:") else args.problem
    if args.cmd in ("run", "submit"):   # submit: a factory on this machine reads the same path
        problem = _package_locator(problem)
    strategy = args.strategy
    if problem.startswith(ENGINE_PREFIX) and strategy == "default":
        strategy = ENGINE_STRATEGY   # descent from the default design (engines/order.py)
    spec = pb.CampaignSpec(problem=problem, target=args.target, budget_candidates=args.budget,
                           budget_seconds=args.seconds, budget_device_seconds=args.device_seconds,
                           goal_fraction=args.goal,
                           strategy=strategy, threads=args.threads or 0,
                           seed=args.seed, families=args.family, parallel=args.parallel, warm_start=args.warm,
                           coders=[c for c in args.coders.split(",") if c],
                           personas=[p for p in args.personas.split(",") if p], token_budget=args.token_budget or 0)
    if problem.startswith(ENGINE_PREFIX) and strategy == ENGINE_STRATEGY:
        spec.strategy_options.update(ENGINE_OPTIONS)   # as `kfactory engine run` searches (engines/order.py)
    spec.strategy_options.update(_strategy_options(args.strategy_option))
    _finale_args(spec, args, engine=problem.startswith(ENGINE_PREFIX))
    spec.manual_sources.extend(_manual_source(m, args.target) for m in args.manual)
    return spec


def _manual_source(text: str, target: str):
    """--manual NAME=FILE[:FLAGS] as the spec's hand-written kernel: its language from the file's suffix, as
    `kfactory check` reads it, and on cuda its launch rule from the source's `// kfactory: grid=... block=...` line
    (every source was sent as C, with the cpu's flags: a .cu kernel could not compile on the cuda target)."""
    import json

    from kfactory.cli.check import launch_rule
    from kfactory.cli.client import ClientError
    from kfactory.problems.loader import language_of
    from kfactory.v1 import events_pb2 as pb

    name, _, rest = text.partition("=")
    path, _, flags = rest.partition(":")
    if not name or not path:
        raise ClientError(f"--manual {text!r}: expected NAME=FILE[:FLAGS]", EXIT_USAGE)
    try:
        source = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ClientError(f"--manual {name}: cannot read {path!r}: {getattr(e, 'strerror', None) or e}",
                          EXIT_USAGE) from e
    cuda = target.startswith("cuda")
    launch = ""
    if cuda:
        try:
            rule = launch_rule(source)
        except ValueError as e:
            raise ClientError(f"--manual {name}: {e}", EXIT_USAGE) from e
        if rule is None:
            raise ClientError(f"--manual {name}: a cuda kernel needs a launch rule: a `// kfactory: grid=... "
                              f"block=...` line in {path} (expressions over the problem's shape symbols)", EXIT_USAGE)
        launch = json.dumps(rule, sort_keys=True)
    return pb.ManualSource(name=name, source=source, language=language_of(path, target), launch_json=launch,
                           compile_flags=flags or ("" if cuda else "-O2 -fopenmp"), threads=1)


def _finale_args(spec, args, engine: bool) -> None:
    """--rounds, --showdown and --showdown-margin into the spec: an engine problem's defaults are `kfactory
    engine run`'s where not given (a kernel problem's spec that asks for them is refused by the planner)."""
    from kfactory.engines.defaults import MARGIN, ROUNDS, TIMING_ROUNDS

    rounds, showdown, margin = (getattr(args, k, None) for k in ("rounds", "showdown", "showdown_margin"))
    spec.timing_rounds = rounds if rounds is not None else (TIMING_ROUNDS if engine else 0)
    spec.showdown_rounds = showdown if showdown is not None else (ROUNDS if engine else 0)
    spec.showdown_margin = margin if margin is not None else (MARGIN if engine else 0.0)


def _strategy_options(given: list[str]) -> dict[str, str]:
    """--strategy-option NAME=VALUE flags as a spec's strategy_options (text: the planner checks them against the
    strategy's table, for `run` and `submit` alike); a flag without NAME= is a usage error."""
    from kfactory.cli.client import ClientError

    out = {}
    for item in given:
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            raise ClientError(f"--strategy-option {item!r}: expected NAME=VALUE", EXIT_USAGE)
        out[name.strip()] = value.strip()
    return out


def _conn_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nats-url", help="NATS server (env KFACTORY_NATS_URL)")
    p.add_argument("--redis-url", help="Redis for claims (env KFACTORY_REDIS_URL); unset: in-process")


def _grpc_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--planner", help="Campaigns service address (env KFACTORY_PLANNER_ADDR)")
    p.add_argument("--memory", help="Evidence service address (env KFACTORY_MEMORY_ADDR)")
    p.add_argument("--json", dest="as_json", action="store_true", help="print JSON")


#: how the query commands choose where to answer from (their --help says it)
LOCAL_RULE = ("Answers from the running factory whose address is given (--memory or KFACTORY_MEMORY_ADDR; for "
              "status --planner or KFACTORY_PLANNER_ADDR, then the local archive's other campaigns, marked where "
              "each came from), else from the local workspace under KFACTORY_DATA_DIR, with no service running. An "
              "id may be a unique prefix of it.")


def _query_args(p: argparse.ArgumentParser) -> None:
    """The flags of a query command, which reads the local workspace unless a factory's address is given."""
    p.add_argument("--planner", help="Campaigns service address (env KFACTORY_PLANNER_ADDR); unset: read the "
                                     "local workspace")
    p.add_argument("--memory", help="Evidence service address (env KFACTORY_MEMORY_ADDR); unset: read the local "
                                    "workspace")
    p.add_argument("--json", dest="as_json", action="store_true", help="print JSON")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="kfactory", description="A kernel factory.")
    ap.add_argument("--log-level", default=None)
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("run", help="run a whole campaign on this machine (all services in this process)")
    _spec_args(p)
    _conn_args(p)
    p.add_argument("--json", dest="json_out", help="write the campaign summary to this file")
    p.add_argument("--report-dir", type=Path, help="where reports go (default ./reports)")
    p.add_argument("--quiet", action="store_true", help="no live progress")
    p.add_argument("--precompiled", help="cuda bundles from `kfactory precompile` (dirs, ':'-separated; env "
                                         "KFACTORY_PRECOMPILED): their cubins are served, not compiled")

    p = sub.add_parser("serve", help="run one service (for Kubernetes or a multi-process set-up)")
    p.add_argument("service", help="planner, coder, compiler, verifier, benchmarker or memory")
    _conn_args(p)
    p.add_argument("--grpc-addr", help="listen address of the planner's or memory's gRPC service")
    p.add_argument("--precompiled", help="compiler: cuda bundles to serve cubins from (env KFACTORY_PRECOMPILED)")
    p.add_argument("--threads", type=int)

    p = sub.add_parser("submit", help="submit a campaign to a running factory")
    _spec_args(p)
    _grpc_args(p)
    p.add_argument("--wait", action="store_true", help="watch it until it finishes")

    for name, helptext in (("status", "a campaign's status (all campaigns without ID)"),
                           ("watch", "follow a campaign's events live"),
                           ("cancel", "cancel a campaign"),
                           ("report", "write a campaign's report")):
        query = name in ("status", "report")
        p = sub.add_parser(name, help=helptext, description=f"{helptext[0].upper()}{helptext[1:]}. "
                           f"{LOCAL_RULE if query else ''}".strip())
        p.add_argument("id", nargs="?" if name == "status" else None)
        (_query_args if query else _grpc_args)(p)
        if name == "report":
            p.add_argument("--out", type=out_dir, default=None, help="directory (default ./reports/ID)")

    p = sub.add_parser("best", help="the best kernel for a problem, or a campaign's leaderboard",
                       description=f"The best kernel for a problem, a campaign's leaderboard, or one candidate's "
                                   f"evidence and source. {LOCAL_RULE}")
    p.add_argument("problem", nargs="?")
    p.add_argument("--shape", default="", type=query_filter("shape_error"),
                   help="the fastest at this shape (4096x4096)")
    p.add_argument("--device", default="")
    p.add_argument("--campaign", help="show this campaign's leaderboard instead (id or unique prefix)")
    p.add_argument("--candidate", help="show one candidate's full evidence and source (id or unique prefix)")
    p.add_argument("--target", default="", type=query_filter("filter_error"),
                   help="cpu, cuda (any architecture) or cuda:sm_90a (only that one)")
    _query_args(p)

    p = sub.add_parser("priors", help="what memory would seed a campaign of a problem with (its warm start)",
                       description=f"What memory would seed a campaign of a problem with. {LOCAL_RULE}")
    p.add_argument("problem")
    p.add_argument("--family", action="append", default=[], help="restrict to these families")
    p.add_argument("--target", default="", type=query_filter("filter_error"),
                   help="the new campaign's target (cpu, cuda, cuda:sm_90a): only its families' evidence (default: "
                        "every family's)")
    p.add_argument("--limit", type=cli_type("priors_limit"), default=8)
    _query_args(p)

    p = sub.add_parser("lessons", help="what memory learned about a problem on a target (what agents are told)",
                       description=f"What memory learned about a problem on a target. {LOCAL_RULE}")
    p.add_argument("problem")
    p.add_argument("--target", default="", type=query_filter("filter_error"),
                   help="cpu, cuda (any architecture) or cuda:sm_90a (only that one); default: every target")
    p.add_argument("--limit", type=int, default=6, help="lessons per kind")
    _query_args(p)

    p = sub.add_parser("check", help="judge one kernel as a campaign would: compile, verify, measure")
    p.add_argument("problem")
    p.add_argument("--target", default="cpu", help="cpu, cuda (the GPU present), cuda:sm_80, cuda:sm_90a, "
                                                   "cuda:sm_100a")
    p.add_argument("--source", required=True, type=Path,
                   help="the kernel's source file: .c/.cpp (cpu), .cu (CUDA C++) or .ptx")
    p.add_argument("--language", choices=("c", "cpp", "cuda", "ptx"), help="default: from the file's suffix")
    p.add_argument("--flags", help="compiler flags (part of the candidate); default -O3 -fopenmp on the cpu, "
                                   "none on cuda")
    p.add_argument("--grid", default="", help="cuda launch rule: grid expression over the shape symbols, e.g. "
                                              "'cdiv(rows, 4)' or '(cdiv(cols, 256), rows)'")
    p.add_argument("--block", default="", help="cuda launch rule: block expression, e.g. 128")
    p.add_argument("--smem", default="", help="cuda launch rule: dynamic shared memory bytes (default 0)")
    p.add_argument("--threads", type=int)
    p.add_argument("--compile-only", action="store_true")
    p.add_argument("--json", dest="json_out", help="write the verdict as JSON to this file ('-': stdout)")

    from kfactory.bus.causes import CAUSES

    p = sub.add_parser("dead-letters", help="list the work the services gave up on; --replay sends it back")
    p.add_argument("--stage", help="only this stage's (coder, compiler, verifier, benchmarker, ...)")
    p.add_argument("--campaign", help="only this campaign's")
    p.add_argument("--cause", choices=CAUSES,
                   help="only those with this cause (harness_failed: the harness's own failure, sent back once it "
                        "is fixed; input_missing, unknown_campaign, undecodable, publish_not_permitted, "
                        "result_too_large, deliveries_exhausted, campaign_cancelled; unspecified: written before "
                        "causes were recorded)")
    p.add_argument("--replay", action="store_true",
                   help="ask each campaign's planner to send its dead letters back to their stages (after fixing "
                        "what failed them); it does while the campaign runs, and takes them off the list")
    p.add_argument("--answer-timeout", type=float, default=30.0,
                   help="seconds to wait in all for the planners' answers (default 30)")
    p.add_argument("--nats-url", help="NATS server (env KFACTORY_NATS_URL); in the secure profile, as the admin "
                                      "user (KFACTORY_NATS_USER/PASSWORD)")

    p = sub.add_parser("export", help="a verified kernel as C, a Python module or a torch op, or a model's verified "
                                      "engine as C or Python, usable without kfactory (docs/exporting.md, "
                                      "docs/engines.md)")
    p.add_argument("kernel", metavar="ID|PROBLEM|MODEL", help="a candidate id (or unique prefix), or a problem: its "
                                                              "fastest measured kernel; or a model: its best verified "
                                                              "engine (kfactory engine run)")
    p.add_argument("--shape", default="", type=query_filter("shape_error"),
                   help="with a PROBLEM: the fastest at this shape (4096x4096)")
    p.add_argument("--target", default="", type=query_filter("filter_error"),
                   help="with a PROBLEM: on this target (default cpu)")
    p.add_argument("--format", dest="fmt", required=True, choices=("c", "python", "torch"))
    p.add_argument("--name", required=True, help="the exported function's name (a C identifier)")
    p.add_argument("--out", type=out_dir, required=True, help="the directory to write into (one per kernel)")
    p.add_argument("--memory", help="Evidence service address (env KFACTORY_MEMORY_ADDR); unset: read the local "
                                    "workspace")
    p.add_argument("--json", dest="as_json", action="store_true", help="print the files written as JSON")

    from kfactory.cli import engine as engine_cmd
    from kfactory.cli import evidence as evidence_cmd
    from kfactory.cli import problems as problems_cmd
    from kfactory.cli import strategies as strategies_cmd
    from kfactory.targets.cuda import precompile

    problems_cmd.add_parser(sub)
    evidence_cmd.add_parser(sub)
    strategies_cmd.add_parser(sub)
    precompile.add_parser(sub)
    engine_cmd.add_parser(sub)
    return ap


def log_options(cmd: str, flag: str | None, settings: Settings) -> tuple[str, bool]:
    """(level, JSON lines?) of a command's logs: --log-level, else KFACTORY_LOG_LEVEL, else the command's
    default; JSON for `serve` (a pod's log collector parses it) or when KFACTORY_LOG_JSON says so."""
    level = flag or settings.log_level or ("warning" if cmd in ("run", "problems") else "info")
    return level, cmd == "serve" or settings.log_json


def main(argv: list[str] | None = None) -> int:
    # a native crash (a fatal signal in a C extension: grpc, sqlite, a ctypes helper) prints every thread's Python
    # stack on stderr instead of a bare "Segmentation fault": what a bug report needs
    if not faulthandler.is_enabled():
        faulthandler.enable(all_threads=True)
    args = build_parser().parse_args(argv)
    try:
        # these commands take no settings: their flags (engine run --threads) are their own, checked by them
        settings = Settings() if args.cmd in OWN_FLAGS_COMMANDS else _settings(args)
        if judges_in_process(args):
            keep_freed_memory_if_set(settings)
        level, json_lines = log_options(args.cmd, args.log_level, settings)
        configure(level, json=json_lines)
        return _dispatch(args, settings)
    except ValidationError as e:  # a setting from the environment or a flag: say which, and what it needs
        flags = {} if args.cmd in OWN_FLAGS_COMMANDS else _given_flags(args)
        print(f"kfactory: bad configuration:\n{settings_errors(e, flags)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 (no command expected it: a bug of kfactory's, told apart from a mistake)
        from kfactory.cli.crash import report_unexpected
        from kfactory.problems.refcheck import CheckUnavailable   # imported here: 0.4 s of every command's start

        if isinstance(e, CheckUnavailable):   # the host too busy to check a reference now: neither mistake nor bug
            print(f"kfactory: {e}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        return report_unexpected(e, list(sys.argv[1:] if argv is None else argv), args.cmd)


def settings_errors(e: ValidationError, flags: dict[str, str] | None = None) -> str:
    """One line per invalid setting, named as the flag that gave it (`flags`, field: flag), else as the
    environment variable that sets it."""
    lines = []
    for err in e.errors():
        field = ".".join(str(x) for x in err["loc"])
        name = (flags or {}).get(field) or (f"KFACTORY_{field.upper()}" if field else "the settings")
        lines.append(f"  {name}: {err['msg']}")
    return "\n".join(lines)


#: the commands given no settings (kfactory.cli.main._dispatch): a flag of theirs is never a setting's override
OWN_FLAGS_COMMANDS = ("strategies", "engine", "generate", "problems")

#: the commands that only query (the workspace or a factory): they start no service
QUERY_COMMANDS = ("status", "best", "report", "priors", "lessons")


#: the services that judge no kernel in their own process (the verifier and the benchmarker do, and so do `run` and
#: `check`): they keep glibc malloc's defaults, since a heap kept at its peak (kfactory.platform.heap) would only
#: hold, for their whole life, what their largest message or bundle once needed
UNJUDGING_SERVICES = frozenset({"planner", "coder", "compiler", "memory"})


def judges_in_process(args) -> bool:
    """Whether the command may judge kernels in this process, and so keeps the memory it frees (KFACTORY_KEEP_HEAP):
    every command but the serving of a service that judges none."""
    return not (args.cmd == "serve" and args.service in UNJUDGING_SERVICES)


def _dispatch(args, settings: Settings) -> int:
    from kfactory.cli import client

    if args.cmd in QUERY_COMMANDS:  # before kfactory.platform.app, whose imports (the judge's) alone take a second
        try:
            return client.dispatch(args, settings, None)
        except client.ClientError as e:
            print(f"kfactory: {e}", file=sys.stderr)
            return e.code
    if args.cmd == "strategies":  # no service, no settings
        from kfactory.cli import strategies as strategies_cmd

        return strategies_cmd.run(args)
    if args.cmd in ("engine", "generate"):  # no service: the engine runs in its own child process
        from kfactory.cli import engine as engine_cmd

        return engine_cmd.run(args)
    if args.cmd in ("evidence", "precompile"):  # no service: before kfactory.platform.app's imports too
        from kfactory.cli import evidence as evidence_cmd
        from kfactory.targets.cuda import precompile

        return (evidence_cmd if args.cmd == "evidence" else precompile).run(args, settings)
    from kfactory.platform.app import WiringError

    if args.cmd == "problems":
        from kfactory.cli import problems as problems_cmd

        return problems_cmd.run(args)
    if args.cmd == "check":
        from kfactory.cli.check import command as check_command

        return check_command(args, settings)
    try:
        if args.cmd == "run":
            from kfactory.cli.run import run_campaign
            from kfactory.platform.fsutil import dir_misfit, output_misfit
            from kfactory.engines.problem import PREFIX as ENGINE_PREFIX

            if args.problem.startswith(ENGINE_PREFIX):   # the engine's record and best.json come from that command
                print(f"kfactory run: {args.problem} is an engine: run its campaign with `kfactory engine run "
                      f"{args.problem[len(ENGINE_PREFIX):]}` (the default design first, timing rounds, the engine "
                      "record and the best.json that `kfactory generate` and `kfactory export` read)",
                      file=sys.stderr)
                return 2

            if why := output_misfit(args.json_out) or dir_misfit(settings.report_dir, "the report directory "
                                                                         "(--report-dir, KFACTORY_REPORT_DIR)"):
                print(f"kfactory run: {why}", file=sys.stderr)
                return 2
            return asyncio.run(run_campaign(settings, _spec(args), args))
        if args.cmd == "dead-letters":
            return _dead_letters(args, settings)
        if args.cmd == "export":
            from kfactory.export.command import run as export_command

            return export_command(args, settings)
        if args.cmd == "serve":
            from kfactory.platform.app import serve
            from kfactory.platform.grpcserver import GrpcBindError

            if args.grpc_addr:
                key = "planner_addr" if args.service == "planner" else "memory_addr"
                settings = settings.model_copy(update={key: args.grpc_addr})
            try:
                asyncio.run(serve(args.service, settings))
            except GrpcBindError as e:   # the address the flag or the environment gave: fix it, or stop the other
                print(f"kfactory serve: {e} (--grpc-addr, KFACTORY_PLANNER_ADDR or KFACTORY_MEMORY_ADDR)",
                      file=sys.stderr)
                return EXIT_USAGE
            return 0
        return client.dispatch(args, settings, _spec if args.cmd == "submit" else None)
    except WiringError as e:
        print(f"kfactory: {e}", file=sys.stderr)
        return 1
    except client.ClientError as e:
        print(f"kfactory: {e}", file=sys.stderr)
        return e.code


def _dead_letters(args, settings: Settings) -> int:
    """`kfactory dead-letters`; a --campaign or --stage that is no subject token is a usage error (ClientError)."""
    from kfactory.bus.errors import BusUnavailable
    from kfactory.cli.client import ClientError, check_campaign_id, check_stage
    from kfactory.bus.causes import cause_of
    from kfactory.bus.deadletters import command

    if args.campaign is not None:
        check_campaign_id(args.campaign, "--campaign")
    if args.stage is not None:
        check_stage(args.stage)
    try:
        return asyncio.run(command(settings, args.stage, args.campaign, args.replay, sys.stdout,
                                   args.answer_timeout, cause_of(args.cause) if args.cause else None))
    except BusUnavailable as e:   # NATS cannot answer now, as a service that cannot: the same command may work later
        raise ClientError(str(e), EXIT_UNAVAILABLE) from e



if __name__ == "__main__":
    sys.exit(main())
