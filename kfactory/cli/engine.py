"""`kfactory engine run MODEL` (an engine campaign: through the services by default, kfactory/cli/engine_services.py;
in this process with --local, kfactory/engines/campaign.py) and `kfactory generate MODEL "prompt"` (greedy
generation with the best verified engine, streamed).

The engine always runs in its child process (kfactory.engines.runner.EngineRunner): this process only tokenises,
picks the argmax of the logits the child sends back and prints text.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from kfactory.engines.showdown import Rule
    from kfactory.models import GGUFModel

EXIT_FAILED, EXIT_USAGE = 1, 2
#: Ctrl-C (128 + SIGINT), as `kfactory run` and shells give it
EXIT_INTERRUPTED = 130


class EngineCommandError(Exception):
    """A refusal the user can act on (no verified engine yet, a prompt too long); `code` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_FAILED):
        super().__init__(message)
        self.code = code


def add_parser(sub) -> None:
    """The `engine` command group and `generate`."""
    from kfactory.engines.defaults import MARGIN, MAX_THREADS, ROUNDS, TIMING_ROUNDS

    p = sub.add_parser("engine", help="inference engines: run an engine campaign (docs/engines.md)",
                       description="An engine campaign: design points generated, built, verified against the "
                                   "float64 reference and timed, through the services (as `kfactory run`) "
                                   "unless --local; the best verified one is what `kfactory generate` runs.")
    esub = p.add_subparsers(dest="engine_cmd", required=True)
    r = esub.add_parser("run", help="evaluate up to --budget engine designs of a model")
    r.add_argument("model", help="smollm2-135m, tiny-llama or a model package directory")
    r.add_argument("--target", default="cpu", choices=("cpu",), help="engines run on the cpu target")
    r.add_argument("--budget", type=int, default=8, help="design points to evaluate (default 8)")
    r.add_argument("--threads", type=int, default=None,
                   help=f"the most threads a design may use (1..{MAX_THREADS}; default: this host's cores)")
    r.add_argument("--rounds", type=int, default=TIMING_ROUNDS,
                   help=f"timing rounds per verified design (default {TIMING_ROUNDS}): the first after its "
                        "verification, the others over all verified designs in turn; figures are medians, effects "
                        "compare designs round by round")
    r.add_argument("--showdown", type=int, default=ROUNDS,
                   help=f"showdown rounds (default {ROUNDS}; 0: none): after the timing rounds, the designs within "
                        "--showdown-margin of the fastest are timed alternately and the winner decided by their "
                        "per-round ratios (kfactory/engines/showdown.py)")
    r.add_argument("--showdown-margin", type=float, default=MARGIN,
                   help=f"a design contends in the showdown when the fastest decodes at most this many times as "
                        f"fast (default {MARGIN}; the campaign's noise figure widens it)")
    r.add_argument("--kernels", choices=("memory", "builtin"), default="memory",
                   help="memory (default): also try designs that link in the fastest verified kernels memory "
                        "holds for the engine's ops (matvec_q4_1, matvec_q8_0: search them with `kfactory run "
                        "matvec_q4_1 --target cpu`); builtin: the engine's own kernels only")
    r.add_argument("--json", dest="json_out", type=Path, help="also write the campaign's record to this file")
    how = r.add_mutually_exclusive_group()
    how.add_argument("--services", dest="local", action="store_false",
                     help="(the default) run the campaign through the services (planner, coder, compiler, verifier, "
                          "benchmarker, memory) in this process, as `kfactory run` does: every design a candidate "
                          "with its events, archived by memory, every timing round a measurement of its own")
    how.add_argument("--local", dest="local", action="store_true",
                     help="run the campaign in this process without the services (kfactory/engines/campaign.py): "
                          "the same designs, verification and timings, no events and no archive")
    r.set_defaults(local=False)   # two flags share the destination: the default stated once, here
    r.add_argument("--nats-url", help="through the services: the NATS server (default: one started for the "
                                      "campaign, or none with KFACTORY_BUS=memory)")
    r.add_argument("--parallel", type=int, default=0,
                   help="through the services: designs in flight at once (default: the planner's, three on cpu; 1 "
                        "keeps compiles off the cores while an engine is timed)")

    g = sub.add_parser("generate", help="generate text with the best verified engine of a model (greedy, "
                                        "streamed)")
    g.add_argument("model")
    g.add_argument("prompt", help="the user's message (the model's chat template is applied)")
    g.add_argument("--max-tokens", type=int, default=64)


def run(args: argparse.Namespace) -> int:
    """Dispatch `engine run` or `generate`; a refusal prints its message and exits with its code."""
    from kfactory.engines.campaign import CampaignError
    from kfactory.engines.design import DesignError
    from kfactory.models import ModelError
    from kfactory.models.errors import NoSuchModel

    try:
        if args.cmd == "generate":
            return generate_command(args.model, args.prompt, args.max_tokens)
        return run_command(args)
    except (CampaignError, DesignError) as e:
        print(f"kfactory: {e}", file=sys.stderr)
        return EXIT_USAGE
    except NoSuchModel as e:   # a mistyped name: the command was wrong, not the package
        print(f"kfactory: {e}", file=sys.stderr)
        return EXIT_USAGE
    except ModelError as e:
        print(f"kfactory: {e}", file=sys.stderr)
        return EXIT_FAILED
    except EngineCommandError as e:
        print(f"kfactory: {e}", file=sys.stderr)
        return e.code


def run_command(args: argparse.Namespace) -> int:
    """`kfactory engine run`: through the services unless --local; progress per design, then the report; 0 when a
    design verified, else 1."""
    from kfactory.platform.fsutil import output_misfit
    from kfactory.engines.campaign import Campaign, DesignResult, report_text
    from kfactory.engines.defaults import MAX_THREADS
    from kfactory.engines.order import STRATEGY
    from kfactory.models.loader import model_directory

    threads = args.threads if args.threads is not None else min(os.cpu_count() or 1, MAX_THREADS)
    if not 1 <= threads <= MAX_THREADS:   # (before the searched kernels' note, which names the threads)
        raise EngineCommandError(f"--threads must lie in 1..{MAX_THREADS}, not {threads}", EXIT_USAGE)
    if why := output_misfit(args.json_out):
        raise EngineCommandError(why, EXIT_USAGE)
    model_directory(args.model)   # a mistyped name is told before anything starts (NoSuchModel: exit 2)
    if not args.local:
        return services_command(args, threads)
    showdown = showdown_rule(args)
    kernels = searched_kernels(threads) if args.kernels == "memory" else {}
    campaign = Campaign(args.model, args.budget, max_threads=threads, target=args.target, rounds=args.rounds,
                        showdown=showdown, kernels=kernels)
    pool = len(campaign.designs())
    print(f"engine campaign {args.model}: {min(args.budget, pool)} of {pool} designs, by {STRATEGY} (budget "
          f"{args.budget}, threads "
          f"1..{threads}, {args.rounds} timing round{'s' if args.rounds != 1 else ''}, "
          f"{_showdown_words(showdown)})", flush=True)

    def progress(i: int, n: int, res: DesignResult) -> None:
        print(f"[{i}/{n}] {res.line()}", flush=True)

    record = campaign.run(progress)
    print(report_text(record))
    print(f"record: {record['path']}")
    if args.json_out:
        args.json_out.write_text(json.dumps(record, indent=1))
    return 0 if record["best"] is not None else EXIT_FAILED


def services_command(args: argparse.Namespace, threads: int) -> int:
    """`kfactory engine run` (the default; --services says so): the campaign through the services; progress per
    design as its outcome is archived, then the report; 0 when a design verified, 1 when none did, 2 for a spec
    the planner refuses."""
    from kfactory.bus.natsd import NatsServerError
    from kfactory.cli import engine_services
    from kfactory.engines.campaign import DesignResult, report_text
    from kfactory.engines.ops import describe
    from kfactory.services.planner.specs import SpecError

    if args.budget < 1:
        raise EngineCommandError(f"--budget must be at least 1 design, not {args.budget}", EXIT_USAGE)
    if args.parallel < 0:
        raise EngineCommandError(f"--parallel must be 0 (the planner's default) or more, not {args.parallel}",
                                 EXIT_USAGE)
    if args.rounds < 1:
        raise EngineCommandError(f"--rounds must be at least 1, not {args.rounds}", EXIT_USAGE)
    showdown = showdown_rule(args)
    kernels = searched_kernels(threads) if args.kernels == "memory" else {}
    print(f"engine campaign {args.model} through the services: budget {args.budget}, threads 1..{threads}, "
          f"{args.rounds} timing round{'s' if args.rounds != 1 else ''}, {_showdown_words(showdown)}; "
          f"{describe(kernels)}", flush=True)
    n = 0

    def progress(res: DesignResult) -> None:
        nonlocal n
        n += 1
        print(f"[{n}/{args.budget}] {res.line()}", flush=True)

    try:
        record = engine_services.run(args.model, args.budget, threads, args.parallel, progress, args.nats_url,
                                     args.rounds, {p: k.candidate_id for p, k in kernels.items()},
                                     showdown=showdown)
    except SpecError as e:
        raise EngineCommandError(f"the planner refuses the campaign: {e}", EXIT_USAGE) from e
    except engine_services.ServicesFailed as e:
        raise EngineCommandError(str(e)) from e
    except NatsServerError as e:   # the default path needs a bus: say how to run without this one
        raise EngineCommandError(f"{e} (KFACTORY_BUS=memory runs the services without NATS; --local runs the "
                                 "campaign without the services)") from e
    print(report_text(record))
    print(f"campaign {record['campaign_id']}: {record['campaign_state']}"
          + (f" ({record['campaign_reason']})" if record["campaign_reason"] else ""))
    print(f"record: {record['path']}; report: {record['report']}")
    if args.json_out:
        args.json_out.write_text(json.dumps(record, indent=1))
    if record.get("interrupted"):
        from kfactory.cli.run import CANCELLING

        sig = record.get("interrupted_by") or signal.SIGINT
        print(f"interrupted: campaign {record['campaign_id']} was cancelled; the record and report hold what "
              f"finished before {CANCELLING[sig]}", file=sys.stderr)
        return 128 + sig   # (EXIT_INTERRUPTED for Ctrl-C; 143 for SIGTERM)
    return 0 if record["best"] is not None else EXIT_FAILED


def showdown_rule(args: argparse.Namespace) -> Rule:
    """The showdown's rule from --showdown and --showdown-margin; a usage error naming the flag when invalid."""
    from kfactory.engines.showdown import Rule

    try:
        return Rule(rounds=args.showdown, margin=args.showdown_margin)
    except ValueError as e:
        raise EngineCommandError(f"--showdown/--showdown-margin: {e}", EXIT_USAGE) from e


def _showdown_words(rule: Rule) -> str:
    return (f"a showdown of {rule.rounds} round{'s' if rule.rounds != 1 else ''} within x{rule.margin:g}"
            if rule.rounds else "no showdown")


def searched_kernels(max_threads: int) -> dict:
    """The fastest verified kernel memory holds for each of the engine's ops that runs at most `max_threads`
    threads, by problem; an op without one is named on stderr with how to search one, and the campaign goes on
    without it."""
    from kfactory.engines.ops import SYMBOLS, OpKernelError, from_memory
    from kfactory.platform.config import Settings

    settings, found = Settings(), {}
    for problem in SYMBOLS:
        try:
            found[problem] = from_memory(settings, problem, max_threads)
        except OpKernelError as e:
            print(f"kfactory: note: {e}", file=sys.stderr)
            continue
        print(f"searched kernel for {problem}: {found[problem].candidate_id[:12]}", flush=True)
    return found


def greedy_tokens(model: str, prompt_ids: list[int], max_tokens: int, data_dir: Path | None = None,
                  stats: dict | None = None, opened: GGUFModel | None = None) -> Iterator[int]:
    """Greedy tokens of the best verified engine (best.json) after `prompt_ids`, one at a time, ending at the
    model's eos (yielded, as Reference.generate keeps it) or after `max_tokens`. `stats` receives timings:
    start_s (the child opening the engine), prefill_s, decode_s, tokens. `opened`: the model already opened
    (opening checks the file's sha256: seconds on the real model)."""
    from kfactory.engines.campaign import BestFileError, load_best
    from kfactory.engines.design import EngineDesign
    from kfactory.engines.ops import OpKernelError, build_engine, kernels_of
    from kfactory.engines.runner import EngineRunner
    from kfactory.models import load_model
    from kfactory.platform.config import Settings

    data_dir = Path(data_dir) if data_dir is not None else Path(Settings().data_dir)
    package = load_model(model)
    try:
        best = load_best(package.name, data_dir)
    except BestFileError as e:
        raise EngineCommandError(str(e)) from e
    if best is None:
        raise EngineCommandError(f"no verified engine for {package.name} yet: run `kfactory engine run {model}` "
                                 "first (it writes best.json under the data dir)")
    design = EngineDesign.from_dict(best["design"])
    opened = opened if opened is not None else package.open(data_dir / "models")
    if not prompt_ids or len(prompt_ids) + max_tokens > opened.config.context_length:
        raise EngineCommandError(f"the prompt ({len(prompt_ids)} tokens) and {max_tokens} new tokens do not fit "
                                 f"the model's context of {opened.config.context_length}", EXIT_USAGE)
    # the same source gives the same object: a lookup in the build cache after the campaign
    try:
        lib = build_engine(design, opened.config, kernels_of(best), data_dir / "engines")
    except OpKernelError as e:
        raise EngineCommandError(f"the best design {best['design_id']} cannot be rebuilt: {e}") from e
    if not lib.ok or lib.path is None:
        raise EngineCommandError(f"the best design {best['design_id']} no longer builds:\n{lib.log}")
    eos = opened.tokenizer.eos_id
    stats = stats if stats is not None else {}
    t0 = time.perf_counter()
    with EngineRunner(str(package.directory), design, lib.path, len(prompt_ids) + max_tokens,
                      cache_dir=data_dir / "models") as runner:
        t1 = time.perf_counter()
        logits = runner.prefill(prompt_ids)
        t2 = time.perf_counter()
        stats.update(design_id=best["design_id"], start_s=t1 - t0, prefill_s=t2 - t1, tokens=0)
        for n in range(1, max_tokens + 1):
            token = int(logits.argmax())   # numpy's argmax: the lowest id on ties, as the reference
            stats["tokens"], stats["decode_s"] = n, time.perf_counter() - t2
            yield token
            if token == eos or n == max_tokens:
                break
            logits = runner.decode(token)


def _emit(text: str) -> None:
    """Tokens to standard output at once; a full disk or a closed pipe is said as such (not the engine's fault,
    nor kfactory's)."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as e:
        raise EngineCommandError(f"cannot write the tokens to standard output: {e.strerror or e}") from e


def generate_command(model: str, prompt: str, max_tokens: int) -> int:
    """`kfactory generate`: the chat template applied, tokens streamed to stdout, tokens/s on stderr."""
    from kfactory.models import load_model
    from kfactory.platform.config import Settings

    if max_tokens < 1:
        raise EngineCommandError("--max-tokens must be at least 1", EXIT_USAGE)
    if sys.stdout is None:   # closed before Python started (`>&-`)
        raise EngineCommandError("standard output is closed: the tokens have nowhere to go")
    data_dir = Path(Settings().data_dir)
    opened = load_model(model).open(data_dir / "models")
    tok = opened.tokenizer
    ids = tok.encode(tok.chat([{"role": "user", "content": prompt}]))
    stats: dict = {}
    out: list[int] = []
    shown = ""
    for token in greedy_tokens(model, ids, max_tokens, data_dir, stats, opened):
        out.append(token)
        text = tok.decode(out, skip_special=True)
        # a character split across tokens decodes to U+FFFD until its last byte arrives: hold it back
        if text.endswith("\ufffd"):
            continue
        _emit(text[len(shown):])
        shown = text
    text = tok.decode(out, skip_special=True)
    _emit(text[len(shown):] + "\n")
    n, dec = stats.get("tokens", 0), stats.get("decode_s", 0.0)
    # the first token comes from the prefill; the decode rate counts the steps after it
    rate = (n - 1) / dec if n > 1 and dec > 0 else float("nan")
    print(f"{n} tokens, {n / (stats.get('prefill_s', 0.0) + dec):.1f} tokens/s overall; decode {rate:.1f} "
          f"tokens/s; prefill of {len(ids)} prompt tokens {stats.get('prefill_s', 0.0) * 1e3:.1f} ms; engine "
          f"{stats.get('design_id')} (started in {stats.get('start_s', 0.0):.1f} s)", file=sys.stderr)
    return 0
