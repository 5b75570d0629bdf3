"""Regression inputs: a kernel that passed and is later found wrong leaves the input that exposed it in
memory, and every later verification of the problem runs that input too (real services over the in-memory bus)."""
from __future__ import annotations

import shutil

import yaml

from conftest import kernel_source
from kfactory.problems.loader import BUILTIN_DIR
from kfactory.v1 import events_pb2 as pb
from test_campaign import _campaign


def _package(root, name: str, verify: list[dict]) -> str:
    """A copy of softmax named softmax_wide (the same name for every copy: regression inputs are kept per problem
    name) whose shapes are all multiples of 8 wide, plus `verify`, and two of its distributions (so it may not
    take the built-in's name)."""
    dst = root / name
    shutil.copytree(BUILTIN_DIR / "softmax", dst)
    spec = yaml.safe_load((dst / "problem.yaml").read_text())
    spec["shapes"] = {"optimize": [{"rows": 32, "cols": 512}], "verify": [{"rows": 2, "cols": 24}, *verify]}
    spec["distributions"] = {k: v for k, v in spec["distributions"].items() if k in ("normal", "masked")}
    spec["name"] = "softmax_wide"
    (dst / "problem.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return str(dst)


def _manual(problem: str, source: str) -> pb.CampaignSpec:
    spec = pb.CampaignSpec(problem=problem, target="cpu", budget_candidates=1, strategy="random", seed=1)
    spec.manual_sources.append(pb.ManualSource(name="no_tail", source=source, compile_flags="-O2", threads=1))
    return spec


def _outcome(running, campaign: str) -> str:
    rows = running.services["memory"].archive.q(
        "SELECT o.reason FROM outcomes o JOIN candidates c ON c.campaign=o.campaign AND c.id=o.candidate "
        "WHERE o.campaign=? AND c.origin='manual:no_tail'", (campaign,))
    return rows[0][0]


async def test_an_input_that_exposed_a_passed_kernel_is_checked_ever_after(memory_bus_settings, tmp_path):
    lenient = _package(tmp_path, "lenient", [])
    strict = _package(tmp_path, "strict", [{"rows": 7, "cols": 33}])
    source = kernel_source("no_tail")

    # 1. every shape is a multiple of 8 wide: the flawed kernel passes and is measured
    st, running = await _campaign(memory_bus_settings, _manual(lenient, source))
    assert _outcome(running, st.id) == "measured"
    assert running.services["memory"].archive.regressions("softmax_wide") == []

    # 2. a stricter package (one ragged shape) exposes it; memory keeps that input for the problem
    st, running = await _campaign(memory_bus_settings, _manual(strict, source))
    assert _outcome(running, st.id) == "WRONG_RESULT"
    kept = running.services["memory"].archive.regressions("softmax_wide")
    print(kept)
    assert len(kept) == 1 and kept[0].shape == "7x33" and kept[0].seed and kept[0].reason == "WRONG_RESULT"

    # 3. back on the lenient package, a new kernel with the same flaw (different text, so a different
    # candidate) is caught by the kept input alone: the package itself has no ragged shape
    st, running = await _campaign(memory_bus_settings, _manual(lenient, "/* another author */\n" + source))
    assert _outcome(running, st.id) == "WRONG_RESULT"
    rejected = next(e.rejected for e in running.services["memory"].archive.events(campaign=st.id)
                    if e.HasField("rejected") and e.rejected.candidate.origin == "manual:no_tail")
    failing = rejected.checks[-1]
    assert not failing.passed and failing.shape == "7x33"
    assert failing.distribution == f"regression:{kept[0].distribution}" and failing.seed == kept[0].seed
