"""Fuzzing the boundaries: whatever bytes arrive as an event and whatever a problem.yaml says, the decoder and the
loader either accept it or refuse it with their one typed error (BadEvent, ProblemError) that says what to fix;
nothing else escapes, nothing hangs."""
from __future__ import annotations

import copy
import shutil
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kfactory.bus import events as ev
from kfactory.problems import BUILTIN_DIR, ProblemError, load_problem
from kfactory.v1 import events_pb2 as pb

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _valid_event() -> bytes:
    cand = pb.Candidate(id="a" * 64, campaign_id="c123", problem="softmax", target="cpu", family="naive",
                        point_id="p1", params_json='{"x": 1}', launch_json='{"grid": "1"}', source_digest="d" * 64)
    return ev.make_event("c123", "coder", cand.id, candidate_created=pb.CandidateCreated(candidate=cand)) \
        .SerializeToString()


VALID = _valid_event()


def _decodes_or_refuses(data: bytes, subject: str = "kf.v1.work.compiler.c123") -> None:
    try:
        event = ev.decode_event(data, subject, max_bytes=4096)
    except ev.BadEvent as e:
        assert str(e)  # a reason, always
        return
    assert ev.kind_of(event) and event.campaign_id == "c123"


@FUZZ
@given(st.binary(max_size=600))
def test_arbitrary_bytes_decode_or_are_refused(data):
    _decodes_or_refuses(data)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), max_size=8),
       st.integers(0, len(VALID)))
def test_corrupted_events_decode_or_are_refused(flips, cut):
    data = bytearray(VALID[:cut] if cut else VALID)
    for pos, value in flips:
        if pos < len(data):
            data[pos] = value
    _decodes_or_refuses(bytes(data))


def test_the_valid_event_decodes_and_limits_hold():
    assert ev.decode_event(VALID, "kf.v1.work.compiler.c123").candidate_created.candidate.id == "a" * 64
    for data, subject, why in ((VALID, "kf.v1.work.compiler.other", "another campaign"),
                               (VALID + b"\x00" * 5000, "", "over the 4096-byte limit"),
                               (pb.Event(id="x", campaign_id="c123").SerializeToString(), "", "no body")):
        try:
            ev.decode_event(data, subject, max_bytes=4096)
        except ev.BadEvent as e:
            assert why in str(e), e
        else:
            raise AssertionError(f"accepted: {why}")


# -- problem specs -------------------------------------------------------------------------------------------
BASE = yaml.safe_load((BUILTIN_DIR / "softmax" / "problem.yaml").read_text())
ANY = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True)
                   | st.text(max_size=12), lambda inner: st.lists(inner, max_size=3)
                   | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)


def _paths(obj, prefix=()):
    """Every (path) into a nested dict/list spec."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


PATHS = [p for p in _paths(BASE) if p]


def _set(spec, path, value):
    node = spec
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def _load(text: str):
    with tempfile.TemporaryDirectory() as tmp:
        pkg = Path(tmp) / "pkg"
        shutil.copytree(BUILTIN_DIR / "softmax", pkg)
        (pkg / "problem.yaml").write_text(text)
        try:
            problem = load_problem(pkg)
        except ProblemError as e:
            assert str(e)
            return None
        for shape in problem.shapes():  # a loaded problem is usable: its shapes and tensors resolve
            for t in problem.spec.inputs:
                problem.tensor_shape(t, shape)
        return problem


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(PATHS), ANY), min_size=1, max_size=4))
def test_mutated_problem_specs_load_or_are_refused(mutations):
    spec = copy.deepcopy(BASE)
    for path, value in mutations:
        try:
            _set(spec, path, value)
        except (KeyError, IndexError, TypeError):  # an earlier mutation removed the path's parent
            continue
    _load(yaml.safe_dump(spec))


@FUZZ
@given(st.text(max_size=300))
def test_arbitrary_text_as_problem_yaml_loads_or_is_refused(text):
    _load(text)


def test_huge_shapes_are_refused_with_what_to_fix():
    spec = copy.deepcopy(BASE)
    spec["shapes"]["optimize"] = [{"rows": 1 << 20, "cols": 1 << 20}]
    with tempfile.TemporaryDirectory() as tmp:
        pkg = Path(tmp) / "pkg"
        shutil.copytree(BUILTIN_DIR / "softmax", pkg)
        (pkg / "problem.yaml").write_text(yaml.safe_dump(spec))
        try:
            load_problem(pkg)
        except ProblemError as e:
            assert "elements, over the limit" in str(e) and "choose smaller shapes" in str(e)
        else:
            raise AssertionError("a 2^40-element tensor was accepted")
