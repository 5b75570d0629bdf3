"""YAML as packages and models are written, parsed by libyaml where PyYAML was built with it."""
from __future__ import annotations

from typing import Any

import yaml

#: libyaml's scanner and parser under PyYAML's own safe resolver and constructor: the same values as
#: yaml.safe_load (tests/test_yaml_loader.py), about 9x faster on a problem.yaml (12 ms against 1.4 ms), which
#: every service, runner and command that loads a problem parses; PyYAML's wheels ship it, a source build may not
LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load(text: str) -> Any:
    """yaml.safe_load(text), parsed by libyaml where it is there. A text libyaml refuses is parsed again by
    PyYAML's own parser, which gives its value where it takes the text (libyaml refuses a byte-order mark inside
    the stream) and otherwise its own error: a YAMLError that quotes the offending line under a caret, as users
    were told before. The one difference left is a text only libyaml takes (a tab at the end of a line): it is
    read, with the value libyaml gives it."""
    try:
        return yaml.load(text, Loader=LOADER)  # noqa: S506 (a safe loader: CSafeLoader or SafeLoader)
    except (yaml.YAMLError, UnicodeEncodeError):   # libyaml encodes the text first: a lone surrogate fails there
        if LOADER is yaml.SafeLoader:
            raise
        return yaml.safe_load(text)
