"""The cuda compile path's reading of NVRTC, ptxas and nvJitLink logs: the resource report of an entry, and a
failure's typed reason (no compile runs here: the logs are literal)."""
from __future__ import annotations

import pytest

pytest.importorskip("cuda.bindings")

from kfactory.targets.cuda import report  # noqa: E402
from kfactory.targets.cuda.report import parse_resource_report  # noqa: E402
from kfactory.targets.entry import names_entry  # noqa: E402
from kfactory.v1 import events_pb2 as pb  # noqa: E402


# ----------------------------------------------------------------------------------------------- the log parser

NVJITLINK_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Function properties for _Z6helperPf
ptxas         .     24 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Compiling entry function 'other' for 'sm_90a'
ptxas info    : Function properties for other
ptxas         .     8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 4096 bytes smem
ptxas info    : Compile time = 1.000 ms
ptxas info    : Compiling entry function 'softmax' for 'sm_90a'
ptxas info    : Function properties for softmax
ptxas         .     16 bytes stack frame, 12 bytes spill stores, 20 bytes spill loads
ptxas info    : Used 32 registers, used 1 barriers, 128 bytes smem
ptxas info    : Compile time = 2.000 ms
info    : 0 bytes gmem
info    : Function properties for 'other':
info    : used 40 registers, used 1 barriers, 8 stack, 5120 bytes smem, 544 bytes cmem[0], 0 bytes lmem
info    : Function properties for 'softmax':
info    : used 32 registers, used 1 barriers, 16 stack, 1152 bytes smem, 548 bytes cmem[0], 12 bytes lmem
"""

PTXAS_ONLY_LOG = """\
ptxas info    : 0 bytes gmem, 24 bytes cmem[3]
ptxas info    : Compiling entry function '_Z7softmaxPKfPfi' for 'sm_80'
ptxas info    : Function properties for _Z7softmaxPKfPfi
ptxas         .     8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 1 barriers, 16 bytes smem, 380 bytes cmem[0], 8 bytes cmem[2]
ptxas info    : Compiling entry function '_Z4tinyv' for 'sm_80'
ptxas info    : Function properties for _Z4tinyv
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 4 registers, 352 bytes cmem[0]
"""


def test_parser_picks_the_entry_among_several():
    rep = parse_resource_report(NVJITLINK_LOG, "softmax")
    assert rep == {"registers": 32, "shared_bytes": 128, "stack_bytes": 16, "spill_store_bytes": 12,
                   "spill_load_bytes": 20, "const_bytes": 548, "local_bytes": 12}
    other = parse_resource_report(NVJITLINK_LOG, "other")
    assert other["registers"] == 40 and other["shared_bytes"] == 4096 and other["stack_bytes"] == 8
    assert other["const_bytes"] == 544 and other["spill_store_bytes"] == 0


def test_parser_reads_mangled_names_and_ptxas_only_logs():
    rep = parse_resource_report(PTXAS_ONLY_LOG, "softmax")
    assert rep == {"registers": 32, "shared_bytes": 16, "const_bytes": 388, "stack_bytes": 8,
                   "spill_store_bytes": 0, "spill_load_bytes": 0}
    assert parse_resource_report(PTXAS_ONLY_LOG, "_Z4tinyv") == {
        "registers": 4, "const_bytes": 352, "stack_bytes": 0, "spill_store_bytes": 0, "spill_load_bytes": 0}
    assert parse_resource_report(PTXAS_ONLY_LOG, "soft") == {}
    assert names_entry("_ZN2ns6kernelEPf", "kernel") and not names_entry("_Z11kernel_abcdPf", "k")
    assert parse_resource_report("", "softmax") == {}


def test_parser_reads_nvjitlink_summary_alone():
    log = "info    : Function properties for 'k':\ninfo    : used 10 registers, used 1 barriers, 64 stack, " \
          "2048 bytes smem, 548 bytes cmem[0], 0 bytes lmem\n"
    assert parse_resource_report(log, "k") == {"registers": 10, "shared_bytes": 2048, "const_bytes": 548,
                                               "local_bytes": 0, "stack_bytes": 64}


def test_failure_table():
    assert report.classify_log("error   : Entry function 'k' uses too much shared data (0x61a80 bytes, 0x38c00 max)") \
        == pb.RESOURCE_LIMIT
    assert report.classify_log("ptxas error   : Entry function 'k' uses too much local data (0x1 bytes, 0x0 max)") \
        == pb.RESOURCE_LIMIT
    assert report.classify_log("ptxas error   : File uses too much global constant data (0x27100 bytes, 0x10000 max)") \
        == pb.RESOURCE_LIMIT
    assert report.classify_log("k.cu(1): Error: Formal parameter space overflowed (40012 bytes required, max 32764 "
                           "bytes allowed) in function k") == pb.RESOURCE_LIMIT
    assert report.classify_log("ptxas application ptx input, line 4; error   : Unknown modifier '.bar'") \
        == pb.COMPILE_ERROR
    assert report.classify_log("ptxas fatal   : Program with .target 'sm_90a' cannot be compiled to future "
                           "architecture") == pb.UNSUPPORTED_ARCH
    # only error lines count: an info line quoting a limit is not a failure reason
    assert report.classify_log("ptxas info : uses too much shared data\nk.cu(3): error: identifier x is undefined") \
        == pb.COMPILE_ERROR
