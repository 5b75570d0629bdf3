"""Model packages: a spec (model.yaml) naming a GGUF weights file, opened as an architecture, weights (blocks
kept or dequantised), a tokenizer, and a float64 reference forward that is the judge's truth for engines.

    pkg = load_model("smollm2-135m")          # or "tiny-llama", or a directory with model.yaml
    model = pkg.open()                        # GGUFModel: .config, .tensor(name), .weights(), .tokenizer
    ref = Reference.from_model(model)         # .prefill, .decode, .generate (float64)

See docs/models.md.
"""
from kfactory.models.gguf_model import GGUFModel, LlamaConfig, ModelError
from kfactory.models.loader import BUILTIN_DIR, ModelPackage, list_models, load_model, pip_file
from kfactory.models.quant import BLOCK_DTYPES, QuantTensor
from kfactory.models.reference import Generation, KVCache, Reference
from kfactory.models.tokenizer import Tokenizer

__all__ = ["BLOCK_DTYPES", "BUILTIN_DIR", "GGUFModel", "Generation", "KVCache", "LlamaConfig", "ModelError",
           "ModelPackage", "QuantTensor", "Reference", "Tokenizer", "list_models", "load_model", "pip_file"]
