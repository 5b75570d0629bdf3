"""A bug of kfactory's own, told apart from a user's mistake: one line on stderr that says it is kfactory's bug,
names the exception, and gives the path of a log file holding the full traceback; and its own exit status.

A user's mistake is answered where it is found (one line, exit 2); what reaches here is an exception no part of
kfactory expected, which is a defect to report, not something the user can fix by changing their input."""
from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

#: the exit status of a kfactory bug: EX_SOFTWARE of sysexits.h ("internal software error"), distinct from 1 (a
#: failed campaign or a rejected kernel), 2 (a usage error) and 130 (Ctrl-C)
EXIT_BUG = 70

#: the exit status when stdout's reader went away: 128 + SIGPIPE, as a shell reports a process SIGPIPE ended
EXIT_PIPE = 141

#: flags whose value is a secret: never written into the log (a log file gets attached to bug reports)
SECRET_FLAGS = ("--llm-api-key",)


def logs_dir() -> Path:
    """Where bug logs go: KFACTORY_DATA_DIR/logs (the workspace), as the settings give it; the default workspace
    when the settings themselves do not load."""
    from pydantic import ValidationError

    from kfactory.platform.config import Settings, _default_data_dir

    try:
        return Settings().data_dir / "logs"
    except ValidationError:
        return _default_data_dir() / "logs"


def redacted(argv: list[str]) -> list[str]:
    """The command line with the values of secret flags replaced (as `--flag VALUE` or `--flag=VALUE`)."""
    out, hide = [], False
    for arg in argv:
        if hide:
            out.append("***")
            hide = False
            continue
        name, eq, _ = arg.partition("=")
        if name in SECRET_FLAGS:
            out.append(f"{name}=***" if eq else arg)
            hide = not eq
            continue
        out.append(arg)
    return out


def write_log(exc: BaseException, argv: list[str], directory: Path | None = None, kind: str = "bug") -> Path:
    """Write the exception's full traceback (its causes too) with what is needed to reproduce it (the command
    line, versions) to a new file under `directory` (default logs_dir()); falls back to the temporary directory
    when that cannot be written. `kind` starts the file's name (bug, error). Returns the file's path."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    text = "".join([f"kfactory {_version()} {kind} report, {time.strftime('%Y-%m-%d %H:%M:%S %z')}\n",
                    f"command: kfactory {' '.join(redacted(argv))}\n",
                    f"python {sys.version.split()[0]} on {platform.platform()}\n\n",
                    *traceback.format_exception(exc)])
    for where in (directory or logs_dir(), Path(tempfile.gettempdir()) / "kfactory-logs"):
        try:
            where.mkdir(parents=True, exist_ok=True)
            for n in range(100):  # a new file each time: a second bug in the same second keeps the first's log
                path = where / f"{kind}-{stamp}-{os.getpid()}" f"{f'-{n}' if n else ''}.log"
                try:
                    with path.open("x") as f:
                        f.write(text)
                    return path
                except FileExistsError:
                    continue
        except OSError:
            continue
    raise OSError("no directory for the bug log could be written")


def _version() -> str:
    try:
        return importlib.metadata.version("kfactory")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def report_unexpected(exc: BaseException, argv: list[str], command: str = "") -> int:
    """Answer an exception that no command caught: an OSError about a named file (a path that cannot be
    written, a full disk) is the environment's, told as such with exit 1; anything else is kfactory's bug
    (report_bug). Either way the traceback goes to a log file whose path is printed."""
    if isinstance(exc, BrokenPipeError):  # the reader went away (`| head`): nothing to say, and no one to say it to
        with contextlib.suppress(OSError, ValueError):
            # what is still buffered for stdout would raise again when Python flushes it at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE
    if isinstance(exc, OSError) and exc.filename:
        where = f"kfactory {command}".rstrip()
        try:
            details = f"; details in {write_log(exc, argv, kind='error')}"
        except OSError:
            details = ""
        print(f"{where}: cannot use {exc.filename}: {exc.strerror or exc}{details}", file=sys.stderr)
        return 1
    return report_bug(exc, argv, command)


def report_bug(exc: BaseException, argv: list[str], command: str = "") -> int:
    """Tell the user, in one line on stderr, that kfactory itself failed (type and message of the exception)
    and where the full traceback was written; return EXIT_BUG. The traceback is printed instead when no log
    file can be written, so it is never lost."""
    where = f"kfactory {command}".rstrip()
    message = " ".join(str(exc).split())[:300]
    what = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    try:
        path = write_log(exc, argv)
    except OSError:
        traceback.print_exception(exc, file=sys.stderr)
        print(f"{where}: internal error (a bug in kfactory, not in your input): {what}; no log file could be "
              "written, so the traceback is above; please report it", file=sys.stderr)
        return EXIT_BUG
    if command == "serve":  # a pod's own log is where its operator looks (and its files go with the pod)
        from kfactory.observability.log import get_logger

        get_logger("cli").error("kfactory bug", exc_info=exc, log_file=str(path))
    print(f"{where}: internal error (a bug in kfactory, not in your input): {what}; the full traceback is in "
          f"{path}; please report it with that file", file=sys.stderr)
    return EXIT_BUG
