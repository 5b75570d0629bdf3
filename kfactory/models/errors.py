"""The model packages' one failure type, apart from the modules that raise it (the GGUF file, the tokenizer, the
loader), so that each can import it without importing another."""
from __future__ import annotations


class ModelError(ValueError):
    """A model package or file is missing, malformed or not what it claims; the message says what to do."""


class NoSuchModel(ModelError):
    """The name is no built-in model and the path no directory with a model.yaml: a mistyped name (a usage
    error), not a package that fails to load."""
