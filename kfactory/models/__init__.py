"""Model packages: a spec (model.yaml) naming a GGUF weights file, opened as an architecture, weights (blocks
kept or dequantised), a tokenizer, and a float64 reference forward that is the judge's truth for engines.

    pkg = load_model("smollm2-135m")          # or "tiny-llama", or a directory with model.yaml
    model = pkg.open()                        # GGUFModel: .config, .tensor(name), .weights(), .tokenizer
    ref = Reference.from_model(model)         # .prefill, .decode, .generate (float64)

See docs/models.md.
"""
from typing import TYPE_CHECKING

from kfactory.models.gguf_model import GGUFModel, LlamaConfig, ModelError
from kfactory.models.loader import BUILTIN_DIR, ModelPackage, list_models, load_model, pip_file
from kfactory.models.quant import BLOCK_DTYPES, QuantTensor
from kfactory.models.reference import Generation, KVCache, Reference

if TYPE_CHECKING:
    from kfactory.models.tokenizer import Tokenizer

__all__ = ["BLOCK_DTYPES", "BUILTIN_DIR", "GGUFModel", "Generation", "KVCache", "LlamaConfig", "ModelError",
           "ModelPackage", "QuantTensor", "Reference", "Tokenizer", "list_models", "load_model", "pip_file"]


def __getattr__(name: str):
    """Tokenizer on first use: it imports jinja2 and tokenizers (0.2 s), which an engine child, started for every
    engine timed and never tokenizing, need not pay."""
    if name == "Tokenizer":
        from kfactory.models.tokenizer import Tokenizer

        return Tokenizer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
