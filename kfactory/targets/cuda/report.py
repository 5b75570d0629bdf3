"""What a compile's logs and cubin say: the rejection reason a failed compile's error lines name, the resource
report (registers, shared and constant memory, stack, spills) of the entry from ptxas/nvJitLink verbose lines, and
the cubin's function symbols (an entry that is missing, or only there C++-mangled)."""
from __future__ import annotations

import re
import struct

from kfactory.targets.entry import missing_entry, names_entry
from kfactory.v1 import events_pb2 as pb


#: The codes cannot separate "too big" from "wrong": nvJitLink 13.5 answers a shared-memory overflow with
#: ERROR_INTERNAL and a constant-memory overflow with ERROR_PTX_COMPILE, the same code as a PTX syntax error; NVRTC
#: answers a parameter-space overflow with NVRTC_ERROR_COMPILATION like any C++ error. Only the error lines tell,
#: so these are matched against the `error`/`fatal` lines of the log, first match wins; anything else is
#: COMPILE_ERROR.
_LOG_TABLE: tuple[tuple[re.Pattern, int], ...] = (
    # "Entry function 'k' uses too much shared data (0x61a80 bytes, 0xc000 max)", "... too much local data",
    # "File uses too much global constant data (0x27100 bytes, 0x10000 max)"
    (re.compile(r"uses too much \w+( \w+)? data"), pb.RESOURCE_LIMIT),
    (re.compile(r"too many (registers|resources|barriers)", re.I), pb.RESOURCE_LIMIT),
    # NVRTC: "Formal parameter space overflowed (40012 bytes required, max 32764 bytes allowed)"
    (re.compile(r"parameter space overflowed", re.I), pb.RESOURCE_LIMIT),
    (re.compile(r"exceeds? (the )?(maximum|limit)|out of (registers|shared memory)", re.I), pb.RESOURCE_LIMIT),
    # PTX written for another architecture: "Program with .target 'sm_90a' cannot be compiled to future
    # architecture", "PTX .version 8.0 does not support .target sm_100a"
    (re.compile(r"cannot be compiled to future architecture|does not support \.target|"
                r"Unknown arch|unsupported (gpu )?architecture", re.I), pb.UNSUPPORTED_ARCH),
)
_ERROR_LINE = re.compile(r"(^|\s)(error|fatal)\s*:|Error:", re.M)


def classify_log(log: str) -> int:
    """The reject reason the error lines of a failed compile or link name (see _LOG_TABLE)."""
    lines = [ln for ln in log.splitlines() if _ERROR_LINE.search(ln)]
    for pattern, reason in _LOG_TABLE:
        if any(pattern.search(ln) for ln in lines):
            return reason
    return pb.COMPILE_ERROR


def first_error(log: str) -> str:
    """The first error line of a log (the compiler's own words), or its first non-empty line."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    errors = [ln for ln in lines if _ERROR_LINE.search(ln)]
    return (errors or lines or ["(no log)"])[0][:500]


_PTXAS_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PTXAS_PROPS = re.compile(r"ptxas\s+info\s*:\s*Function properties for (\S+)")
_LINK_PROPS = re.compile(r"^info\s*:\s*Function properties for '([^']+)':")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"\b[Uu]sed (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM = re.compile(r"(\d+) bytes cmem\[(\d+)\]")
_LMEM = re.compile(r"(\d+) bytes lmem")
_LINK_STACK = re.compile(r"(\d+) stack\b")


def parse_resource_report(log: str, entry: str) -> dict:
    """Registers, memory and spills of kernel `entry`, from a ptxas/nvJitLink verbose log.

    Two formats appear in one nvJitLink -verbose log: ptxas's lines (`Compiling entry function 'k'`,
    `Function properties for k` + the stack/spill line, `Used 32 registers, ... 16 bytes smem, 380 bytes cmem[0]`),
    then nvJitLink's own summary (`Function properties for 'k':` + `used 32 registers, ..., 0 stack, 2048 bytes
    smem, 548 bytes cmem[0], 0 bytes lmem`). ptxas's numbers win: nvJitLink's smem on sm_90a includes the 1 KiB
    the driver reserves per block (1152 for a 128-byte array, where CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES says 128).
    nvJitLink's line fills what ptxas left out (cmem for sm_90a/sm_100a, lmem). Keys: registers, shared_bytes,
    stack_bytes, spill_store_bytes, spill_load_bytes, local_bytes, const_bytes (all cmem banks added up); a key
    is absent when the log does not say."""
    ptxas = _ptxas_fields(log.splitlines(), entry)
    link = _link_fields(log.splitlines(), entry)
    return {**link, **ptxas}


def _ptxas_fields(lines: list[str], entry: str) -> dict:
    out: dict = {}
    current_entry = props_for = None
    for line in lines:
        if m := _PTXAS_ENTRY.search(line):
            current_entry, props_for = m.group(1), None
            continue
        if m := _PTXAS_PROPS.search(line):
            props_for = m.group(1)
            continue
        if (m := _STACK.search(line)) and props_for and names_entry(props_for, entry):
            out.update(stack_bytes=int(m.group(1)), spill_store_bytes=int(m.group(2)), spill_load_bytes=int(m.group(3)))
        is_usage = _USED.search(line) and line.lstrip().startswith("ptxas")
        if is_usage and current_entry and names_entry(current_entry, entry):
            out.update(_usage(line))
    return out


def _link_fields(lines: list[str], entry: str) -> dict:
    out: dict = {}
    props_for = None
    for line in lines:
        if m := _LINK_PROPS.search(line):
            props_for = m.group(1)
            continue
        if line.startswith("info") and _USED.search(line) and props_for and names_entry(props_for, entry):
            out.update(_usage(line))
            if m := _LINK_STACK.search(line):
                out["stack_bytes"] = int(m.group(1))
            props_for = None
    return out


def _usage(line: str) -> dict:
    """registers, smem, cmem and lmem of one `Used N registers, ...` line."""
    used = _USED.search(line)   # the callers pass only lines it matches
    out = {"registers": int(used.group(1)) if used else 0}
    if m := _SMEM.search(line):
        out["shared_bytes"] = int(m.group(1))
    if banks := _CMEM.findall(line):
        out["const_bytes"] = sum(int(size) for size, _ in banks)
    if m := _LMEM.search(line):
        out["local_bytes"] = int(m.group(1))
    return out


def cubin_functions(cubin: bytes) -> set[str]:
    """Names of the FUNC symbols in a cubin's ELF .symtab (64-bit little-endian ELF, as every cubin is)."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2 or cubin[5] != 1:
        return set()
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", cubin, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names = set()
    for _name, sh_type, _f, _a, offset, size, link, _i, _al, entsize in sections:
        if sh_type != 2 or not entsize:   # SHT_SYMTAB
            continue
        str_off = sections[link][4]
        for pos in range(offset, offset + size, entsize):
            st_name, st_info = struct.unpack_from("<IB", cubin, pos)
            if st_info & 0xF == 2:        # STT_FUNC
                end = cubin.index(b"\0", str_off + st_name)
                names.add(cubin[str_off + st_name:end].decode(errors="replace"))
    return names


def _missing_entry(cubin: bytes, entry: str) -> str:
    """Why the cubin lacks `entry`, or "" when it has it."""
    return missing_entry(cubin_functions(cubin), entry, "the cubin")
