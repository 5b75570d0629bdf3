"""kfactory.platform.heap: a kfactory process keeps in its heap the large blocks it frees (no mmap, no trimming), so
the judge's next large input set reuses their pages; KFACTORY_KEEP_HEAP=false leaves glibc's malloc as it was.

Each case runs in a child interpreter: malloc's settings are the whole process's, and this one's are set by
conftest. glibc's mallinfo2 tells where a block came from: hblkhd counts bytes in mmapped blocks, arena the heap's.
"""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import pytest

MiB = 1 << 20

pytestmark = pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="needs glibc's mallinfo2")

# allocate 64 MiB with numpy (as the judge's draws are) in this thread, then in another (as a service's worker
# draws), freeing each: what malloc used and what it kept
PROBE = r"""
import ctypes, json, sys, threading
import numpy as np

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
SETUP
out = {"applied": applied}

def draw(where):
    a = np.ones(64 << 20, dtype=np.uint8)
    out[f"mmapped_while_held_{where}"] = libc.mallinfo2().hblkhd
    del a
    out[f"heap_after_free_{where}"] = libc.mallinfo2().arena

draw("main")
worker = threading.Thread(target=draw, args=("thread",))
worker.start()
worker.join()
print(json.dumps(out))
"""
#: the outer environment's own malloc settings would decide these cases instead of the code under test
OUTER = ("KFACTORY_KEEP_HEAP", "GLIBC_TUNABLES")


def _probe(setup: str, env: dict | None = None) -> dict:
    code = PROBE.replace("SETUP", setup)
    clean = {k: v for k, v in os.environ.items() if k not in OUTER and not k.startswith("MALLOC_")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**clean, **(env or {})})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _mapped_and_returned(out: dict) -> bool:
    """Both blocks came from mmap and went back at free (glibc's defaults)."""
    return all(out[f"mmapped_while_held_{w}"] >= 64 * MiB and out[f"heap_after_free_{w}"] < 64 * MiB
               for w in ("main", "thread"))


def _kept(out: dict) -> bool:
    """Both blocks came from the heap, which kept them after free (one arena: the thread's is the main one's)."""
    return all(out[f"mmapped_while_held_{w}"] < 64 * MiB and out[f"heap_after_free_{w}"] >= 64 * MiB
               for w in ("main", "thread"))


def test_malloc_mmaps_a_large_block_and_returns_it_by_default():
    assert _mapped_and_returned(_probe("applied = None"))


def test_kept_heap_serves_large_blocks_from_the_heap_in_every_thread_and_keeps_them():
    out = _probe("from kfactory.platform.heap import keep_freed_memory\napplied = keep_freed_memory()")
    assert out["applied"] is True and _kept(out)


CLI = ("from kfactory.cli.main import main\nimport contextlib, io\n"
       "with contextlib.redirect_stdout(io.StringIO()):\n    main(['strategies', 'list'])\napplied = None")


def test_a_kfactory_command_that_may_judge_keeps_its_heap():
    assert _kept(_probe(CLI))


#: `serve NAME` with no NATS to reach: the command starts, decides about its heap, and exits 1 naming the address
SERVE = ("from kfactory.cli.main import main\nassert main(['serve', NAME]) == 1\napplied = None")
NO_NATS = {"KFACTORY_NATS_URL": "nats://127.0.0.1:1"}


@pytest.mark.parametrize("service, kept", [("planner", False), ("verifier", True)])
def test_serve_keeps_the_heap_of_a_service_that_judges_alone(service, kept):
    out = _probe(SERVE.replace("NAME", repr(service)), NO_NATS)
    assert _kept(out) if kept else _mapped_and_returned(out)


def test_keep_heap_false_leaves_malloc_as_it_was():
    assert _mapped_and_returned(_probe(CLI, {"KFACTORY_KEEP_HEAP": "false"}))


@pytest.mark.parametrize("argv, judges", [
    (["serve", "planner"], False), (["serve", "coder"], False), (["serve", "compiler"], False),
    (["serve", "memory"], False), (["serve", "verifier"], True), (["serve", "benchmarker"], True),
    (["check", "softmax", "--source", "k.c"], True), (["run", "softmax"], True), (["best", "softmax"], True)])
def test_only_the_services_that_judge_no_kernel_leave_malloc_as_it_was(argv, judges):
    """A service that never judges in its own process would only hold its peak for its life (a bundle imported)."""
    from kfactory.cli.main import build_parser, judges_in_process

    assert judges_in_process(build_parser().parse_args(argv)) is judges
