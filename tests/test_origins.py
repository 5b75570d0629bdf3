"""Point origins: one enum whose strings keep the wire format (archived, shown to users) exactly."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from kfactory.bus.origins import SEARCHED, STRATEGY, Origin, detail_of, is_kind, kind_of, parse, sql_match

ROOT = Path(__file__).resolve().parent.parent / "kfactory"


def test_the_wire_format_is_what_earlier_campaigns_archived():
    assert [Origin.TEMPLATE.of("cpu_c"), Origin.WARM.of("cpu_c"), Origin.AGENT.of("repairer"),
            Origin.MANUAL.of("segfault"), Origin.REFERENCE.of()] == \
        ["template:cpu_c", "warm:cpu_c", "agent:repairer", "manual:segfault", "reference"]
    assert Origin.AGENT == "agent" and f"{Origin.WARM}" == "warm"


@pytest.mark.parametrize("origin, kind, detail", [
    ("template:cpu_c", Origin.TEMPLATE, "cpu_c"), ("warm:f", Origin.WARM, "f"),
    ("agent:memory_bound", Origin.AGENT, "memory_bound"), ("manual:a:b", Origin.MANUAL, "a:b"),
    ("reference", Origin.REFERENCE, ""), ("", None, ""), ("template", None, ""), ("reference:x", None, ""),
    ("robot:x", None, ""), ("Template:x", None, "")])
def test_parse_reads_what_of_builds_and_nothing_else(origin, kind, detail):
    assert parse(origin) == (kind, detail) and kind_of(origin) is kind and detail_of(origin) == detail
    if kind is not None:
        assert kind.of(detail) == origin


def test_the_groups_match_the_prefixes_they_replace():
    for origin in ("template:x", "warm:x", "agent:x", "manual:x", "reference", "templatex", "agent"):
        assert is_kind(origin, *STRATEGY) == origin.startswith(("template:", "warm:"))
        assert is_kind(origin, *SEARCHED) == origin.startswith(("template:", "warm:", "agent:"))
    assert sql_match("c.origin", STRATEGY) == "(c.origin LIKE 'template:%' OR c.origin LIKE 'warm:%')"


def test_the_reference_has_no_detail():
    with pytest.raises(ValueError):
        Origin.REFERENCE.of("x")


def test_no_module_spells_an_origin_prefix_itself():
    literal = re.compile(r"""["'](template|warm|agent|manual):""")
    found = [f"{p.relative_to(ROOT)}:{n}" for p in ROOT.rglob("*.py") if p.name != "origins.py"
             for n, line in enumerate(p.read_text().splitlines(), 1) if literal.search(line)]
    assert not found, f"origin prefixes spelled out instead of kfactory.bus.origins: {found}"
