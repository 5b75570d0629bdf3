"""The cpu target's compile cache (kfactory/targets/cpu/cache.py): a kernel compiled once is read after, from any
data directory sharing the cache; anything that decides the object (source, flags, language, compiler, host) is a
miss; the checks of what the object imports and defines run on every hit; failures are never kept; a damaged entry
or a directory others may write into is not trusted."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from kfactory.platform.config import Settings
from kfactory.targets.cpu import target as cpu_target
from kfactory.targets.cpu.target import CpuTarget
from kfactory.v1 import events_pb2 as pb

KERNEL = "#include <math.h>\nvoid kernel(float *x) { x[0] = expf(x[1]); }\n"


@pytest.fixture
def cc(tmp_path) -> tuple[Path, Path]:
    """A compiler that records every compile it runs (its --version is the real one's), and that record."""
    record = tmp_path / "compiles"
    wrapper = tmp_path / "recording-cc"
    wrapper.write_text(f'#!/bin/sh\ncase " $* " in *" -shared "*) echo "$*" >> {record};; esac\nexec cc "$@"\n')
    wrapper.chmod(0o755)
    return wrapper, record


def _target(tmp_path: Path, cc: Path, data: str, shared: Path | None) -> CpuTarget:
    return CpuTarget(Settings(cc=str(cc), data_dir=tmp_path / data, cpu_object_cache=shared))


def _compiles(record: Path) -> int:
    return len(record.read_text().splitlines()) if record.exists() else 0


def test_a_kernel_compiled_once_is_read_from_any_data_directory_sharing_the_cache(tmp_path, cc):
    wrapper, record = cc
    shared = tmp_path / "shared"
    first = _target(tmp_path, wrapper, "a", shared).compile(KERNEL, "c", "-O2", "kernel")
    again = _target(tmp_path, wrapper, "b", shared).compile(KERNEL, "c", "-O2", "kernel")
    assert first.ok and again.ok and _compiles(record) == 1
    assert not first.report.cached and again.report.cached and again.artifact == first.artifact
    assert list(again.report.imports) == list(first.report.imports) and again.report.compiler == first.report.compiler
    # unset, each data directory keeps its own
    own = _target(tmp_path, wrapper, "c", None)
    assert own.compile(KERNEL, "c", "-O2", "kernel").ok and _compiles(record) == 2
    assert own.compile(KERNEL, "c", "-O2", "kernel").report.cached and _compiles(record) == 2
    assert any((tmp_path / "c" / "cc_cache").rglob("*.so"))


def test_whatever_decides_the_object_is_a_miss(tmp_path, cc, monkeypatch):
    wrapper, record = cc
    t = _target(tmp_path, wrapper, "a", tmp_path / "shared")
    assert t.compile(KERNEL, "c", "-O2", "kernel").ok
    for source, language, flags in ((KERNEL + "\n", "c", "-O2"), (KERNEL, "c", "-O3"),
                                    (KERNEL.replace("void", 'extern "C" void'), "cpp", "-O2")):
        res = t.compile(source, language, flags, "kernel")
        assert res.ok and not res.report.cached, (language, flags)
    assert _compiles(record) == 4
    monkeypatch.setattr(cpu_target, "native_tag", lambda cc: "another processor")   # -march=native builds for it
    assert not t.compile(KERNEL, "c", "-O2", "kernel").report.cached
    wrapper.write_text(wrapper.read_text() + "# upgraded\n")   # another compiler (the driver changed)
    assert not t.compile(KERNEL, "c", "-O2", "kernel").report.cached and _compiles(record) == 6
    monkeypatch.setenv("CPATH", str(tmp_path))   # headers found elsewhere
    assert not t.compile(KERNEL, "c", "-O2", "kernel").report.cached and _compiles(record) == 7
    # one binary by two names (ccache, clang and clang++ pick their behaviour by the name they are run by)
    other = tmp_path / "other-name-cc"
    other.symlink_to(wrapper)
    again = _target(tmp_path, other, "a", tmp_path / "shared").compile(KERNEL, "c", "-O2", "kernel")
    assert not again.report.cached and _compiles(record) == 8


def test_the_checks_of_what_the_object_imports_and_defines_run_on_every_hit(tmp_path, cc, monkeypatch):
    wrapper, record = cc
    t = _target(tmp_path, wrapper, "a", tmp_path / "shared")
    assert t.compile(KERNEL, "c", "-O2", "kernel").ok
    misspelt = t.compile(KERNEL, "c", "-O2", "kernal")
    assert not misspelt.ok and misspelt.report.cached and "has no function 'kernal' (it has: 'kernel')" in \
        misspelt.message
    # a rule added since the entry was written applies to it
    monkeypatch.setattr(cpu_target, "check_imports", lambda names: [f"{n} is refused now" for n in names
                                                                    if n.startswith("expf")])
    refused = t.compile(KERNEL, "c", "-O2", "kernel")
    assert not refused.ok and refused.reason == pb.STATIC_CHECK and refused.report.cached
    assert _compiles(record) == 1


def test_a_failed_compile_is_never_kept(tmp_path, cc):
    wrapper, record = cc
    t = _target(tmp_path, wrapper, "a", tmp_path / "shared")
    for _ in range(2):
        res = t.compile("void kernel( {", "c", "-O2", "kernel")
        assert not res.ok and res.reason == pb.COMPILE_ERROR and not res.report.cached
    assert _compiles(record) == 2 and not list((tmp_path / "shared").rglob("*.so"))


def test_a_damaged_entry_is_compiled_again(tmp_path, cc):
    wrapper, record = cc
    t = _target(tmp_path, wrapper, "a", tmp_path / "shared")
    good = t.compile(KERNEL, "c", "-O2", "kernel")
    (so,) = (tmp_path / "shared").rglob("*.so")
    so.write_bytes(good.artifact[:-1] + bytes([good.artifact[-1] ^ 1]))   # one bit, the same size
    again = t.compile(KERNEL, "c", "-O2", "kernel")
    assert again.ok and not again.report.cached and again.artifact == good.artifact and _compiles(record) == 2
    so.with_suffix(".json").write_text("{")   # torn
    assert not t.compile(KERNEL, "c", "-O2", "kernel").report.cached and _compiles(record) == 3


def test_a_directory_or_entry_others_may_write_into_is_not_used(tmp_path, cc):
    """An object another user could plant (or rewrite, with its JSON's sha256) would be judged as the kernel's."""
    wrapper, record = cc
    shared = tmp_path / "shared"
    t = _target(tmp_path, wrapper, "a", shared)
    assert t.compile(KERNEL, "c", "-O2", "kernel").ok
    entries = sorted(shared.iterdir())
    assert [p.suffix for p in entries] == [".json", ".so"] and all(p.stat().st_mode & 0o777 == 0o644 for p in entries)
    os.chmod(entries[1], 0o664)   # the object group-writable
    assert not t.compile(KERNEL, "c", "-O2", "kernel").report.cached and _compiles(record) == 2
    os.chmod(shared, 0o777)   # checked at every use: a chmod after the first is seen
    for _ in range(2):
        assert not t.compile(KERNEL, "c", "-O2", "kernel").report.cached
    assert _compiles(record) == 4
