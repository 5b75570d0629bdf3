"""The problem package format, validated with pydantic: a bad spec names the field and what is wrong."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64")
#: the most elements one tensor may have at any declared shape (2^28: 1 GiB of float32). The verifier holds
#: several input draws and poisoned outputs at once; a larger shape would exhaust a runner's memory, so it is
#: refused at the boundary instead
MAX_TENSOR_ELEMENTS = 1 << 28


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TensorSpec(_Strict):
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    dtype: Literal["float32", "float64", "float16", "bfloat16", "int32", "int64"]
    shape: list[str | int] = Field(min_length=1)


class Distribution(_Strict):
    """How one input is drawn: normal(mean, std), uniform(low, high) or constant(value), optionally with -inf
    entries, then optionally mapped elementwise: `factor * transform(x)` with transform sigmoid or logsigmoid
    (how models make gates: a sigmoid for a write strength in (0, 1), a log-sigmoid for a log-space decay)."""
    kind: Literal["normal", "uniform", "constant"]
    mean: float = 0.0
    std: float = Field(1.0, gt=0)
    low: float = -1.0
    high: float = 1.0
    value: float = 0.0
    neg_inf_fraction: float = Field(0.0, ge=0, lt=1)
    transform: Literal["none", "sigmoid", "logsigmoid"] = "none"
    factor: float = 1.0


class Tolerance(_Strict):
    atol: float = Field(ge=0)
    rtol: float = Field(ge=0)
    norm_rel: float = Field(gt=0)


class Shapes(_Strict):
    optimize: list[dict[str, int]] = Field(min_length=1)
    verify: list[dict[str, int]] = []


class Cost(_Strict):
    bytes: str
    flops: str


class Abi(_Strict):
    signature: str
    args: list[str] = Field(min_length=1)
    notes: str = ""


class RefKernel(_Strict):
    source: str
    flags: str = "-O2"
    #: cuda: grid, block and smem expressions over the shape symbols (see kfactory.targets.launch)
    launch: dict[str, str] = {}


class ProblemSpec(_Strict):
    """problem.yaml."""
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    description: str
    symbols: list[str] = Field(min_length=1)
    inputs: list[TensorSpec] = Field(min_length=1)
    outputs: list[TensorSpec] = Field(min_length=1)
    shapes: Shapes
    distributions: dict[str, dict[str, Distribution]] = Field(min_length=1)
    tolerance: dict[str, Tolerance]
    cost: Cost
    baselines: list[str] = []
    abi: dict[str, Abi]
    reference_kernel: dict[str, RefKernel] = {}
    families: list[str] = []

    @model_validator(mode="after")
    def _consistent(self) -> "ProblemSpec":
        syms = set(self.symbols)
        for t in self.inputs + self.outputs:
            bad = [d for d in t.shape if isinstance(d, str) and d not in syms]
            if bad:
                raise ValueError(f"tensor {t.name!r}: shape uses {bad} which are not in symbols {self.symbols}")
            if t.dtype not in self.tolerance and t in self.outputs:
                raise ValueError(f"output {t.name!r} has dtype {t.dtype} but tolerance has no entry for it")
        for shape in self.shapes.optimize + self.shapes.verify:
            if set(shape) != syms:
                raise ValueError(f"shape {shape} must give exactly the symbols {self.symbols}")
            if any(v < 1 for v in shape.values()):
                raise ValueError(f"shape {shape}: every size must be >= 1")
            self._fits(shape)
        names = {t.name for t in self.inputs}
        for dname, d in self.distributions.items():
            if set(d) != names:
                raise ValueError(f"distribution {dname!r} must describe exactly the inputs {sorted(names)}")
        for target, abi in self.abi.items():
            known = names | {t.name for t in self.outputs} | syms
            if unknown := [a for a in abi.args if a not in known]:
                raise ValueError(f"abi.{target}.args: {unknown} are neither tensors nor symbols")
        return self

    def _fits(self, shape: dict[str, int]) -> None:
        for t in self.inputs + self.outputs:
            n = 1
            for d in t.shape:
                n *= shape[d] if isinstance(d, str) else d
            if n > MAX_TENSOR_ELEMENTS:
                raise ValueError(f"tensor {t.name!r} at shape {shape} has {n} elements, over the limit of "
                                 f"{MAX_TENSOR_ELEMENTS}: choose smaller shapes")


class FamilySpec(_Strict):
    """families/<name>/family.yaml."""
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    target: Literal["cpu", "cuda", "replay"]
    language: Literal["c", "cuda", "ptx", "replay"]
    template: str
    entry: str = "kernel"
    params: dict[str, list[str | int | float | bool]] = Field(min_length=1)
    constraints: list[str] = []
    compile_flags: str = ""
    launch: dict[str, str] = {}

    @field_validator("params")
    @classmethod
    def _nonempty(cls, v: dict) -> dict:
        for k, vals in v.items():
            if not vals:
                raise ValueError(f"parameter {k!r} has no values")
            if len(set(map(repr, vals))) != len(vals):
                raise ValueError(f"parameter {k!r} repeats a value")
        return v
