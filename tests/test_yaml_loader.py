"""kfactory.platform.yamlfile parses with libyaml where PyYAML has it: the same values as yaml.safe_load on every
YAML file the project ships, and the same refusals (the fuzzing of problem specs, tests/test_fuzz.py, goes
through it as well)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kfactory.platform import yamlfile

ROOT = Path(__file__).parent.parent
SHIPPED = sorted(p for d in ("kfactory", "tests", "deploy") for p in (ROOT / d).rglob("*.yaml"))


@pytest.mark.skipif(not yaml.__with_libyaml__, reason="this PyYAML was built without libyaml")
def test_libyaml_is_the_parser_where_pyyaml_has_it():
    assert yamlfile.LOADER is yaml.CSafeLoader


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_yaml_reads_as_safe_load_reads_it(path):
    text = path.read_text()
    try:
        want = list(yaml.safe_load_all(text))
    except yaml.YAMLError:
        with pytest.raises(yaml.YAMLError):
            list(yaml.load_all(text, Loader=yamlfile.LOADER))
        return
    assert list(yaml.load_all(text, Loader=yamlfile.LOADER)) == want


#: YAML 1.1's number forms (1e3 is a string to both), a byte-order mark inside the stream (libyaml alone refuses
#: it), a tag that would run code, a bracket left open, a control character, a lone surrogate (libyaml fails to
#: encode it)
@pytest.mark.parametrize("text", ["a: 1e3\nb: 1.0e3\nc: .inf\nd: 0x1f\ne: 2026-12-07\nf: [1, 2]\n",
                                  "a: 1\n\ufeffb: 2\n", "x: !!python/object/apply:os.system [true]\n",
                                  "a: [1, 2\nb: 3\n", "a: \x07\n", "a: \ud800\n"])
def test_values_refusals_and_their_messages_match_safe_load(text):
    try:
        want = yaml.safe_load(text)
    except yaml.YAMLError as e:
        with pytest.raises(yaml.YAMLError) as got:
            yamlfile.safe_load(text)
        assert str(got.value) == str(e)   # PyYAML's message, with the line and its caret, as users were told
        return
    assert yamlfile.safe_load(text) == want


@pytest.mark.skipif(not yaml.__with_libyaml__, reason="this PyYAML was built without libyaml")
def test_a_tab_at_the_end_of_a_line_is_the_one_text_only_libyaml_takes():
    with pytest.raises(yaml.YAMLError):
        yaml.safe_load("- a\t\n")
    assert yamlfile.safe_load("- a\t\n") == ["a"]
