"""The problem package format, validated with pydantic: a bad spec names the field and what is wrong."""
from __future__ import annotations

import keyword
import math
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, field_validator, model_validator

from kfactory.platform.expressions import ERRORS as EXPRESSION_ERRORS, evaluate

from kfactory.problems.params import JINJA_RESERVED, abi_misfit, c_param_types, check_c_type

DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8")
#: GGUF block formats an input may be drawn as (Distribution.kind) -> bytes of one block of 32 elements: Q4_1 is
#: fp16 d, fp16 m, 16 bytes of nibbles; Q8_0 fp16 d, 32 int8 (kfactory.judge.inputs draws them)
GGML_BLOCK_BYTES = {"ggml_q4_1": 20, "ggml_q8_0": 34}
#: the most elements one tensor may have at any declared shape (2^28: 1 GiB of float32). The verifier holds
#: several input draws and poisoned outputs at once; a larger shape would exhaust a runner's memory, so it is
#: refused at the boundary instead
MAX_TENSOR_ELEMENTS = 1 << 28


#: the start of a C function declaration, up to its parameter list: a return type and a name (extern "C" and
#: __global__ allowed); a signature that does not start so is prose (an engine's ABI, a replay's), not checked
C_DECLARATION = re.compile(r'^\s*(?:extern\s+"C"\s+)?[A-Za-z_][\w\s*]*\b[A-Za-z_]\w*\s*\(')


#: a problem's (and a family's) name: what the archive files its records under
PROBLEM_NAME = r"^[a-z][a-z0-9_]*$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def register_bfloat16() -> None:
    """Make np.dtype("bfloat16") work: importing ml_dtypes registers it with numpy. Done where a bfloat16
    tensor is declared (TensorSpec), not at import: the import costs about a second of cpu (1.1 s on the
    project's host) that every command and service start paid whether or not any problem held a bfloat16."""
    import ml_dtypes  # noqa: F401  (imported for its registration)


class TensorSpec(_Strict):
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    dtype: Literal["float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8"]
    shape: list[str | int] = Field(min_length=1)

    @field_validator("dtype")
    @classmethod
    def _bfloat16_registered(cls, v: str) -> str:
        # every array of a bfloat16 tensor is made for a spec that declares it, after this ran
        if v == "bfloat16":
            register_bfloat16()
        return v


class Distribution(_Strict):
    """How one input is drawn: normal(mean, std), uniform(low, high) or constant(value), optionally with -inf
    entries, then optionally mapped elementwise: `factor * transform(x)` with transform sigmoid or logsigmoid
    (how models make gates: a sigmoid for a write strength in (0, 1), a log-sigmoid for a log-space decay).

    ggml_q4_1 and ggml_q8_0 draw a uint8 tensor of GGUF blocks (its last axis one block's bytes): each block
    quantises 32 weights drawn normal(mean, std) as llama.cpp's reference quantiser does, so `std` is the
    magnitude of the weights the blocks represent (a tiny std gives subnormal fp16 scales, a large one large
    scales); `special_fraction` of the blocks are edge cases instead (scale 0, every code at its largest or
    smallest value, a negative scale)."""
    kind: Literal["normal", "uniform", "constant", "ggml_q4_1", "ggml_q8_0"]
    mean: float = Field(0.0, allow_inf_nan=False)
    std: float = Field(1.0, gt=0, allow_inf_nan=False)
    low: float = Field(-1.0, allow_inf_nan=False)
    high: float = Field(1.0, allow_inf_nan=False)
    value: float = 0.0
    neg_inf_fraction: float = Field(0.0, ge=0, lt=1)
    transform: Literal["none", "sigmoid", "logsigmoid"] = "none"
    factor: float = Field(1.0, allow_inf_nan=False)
    special_fraction: float = Field(0.0, ge=0, le=1)

    @model_validator(mode="after")
    def _options_fit_the_kind(self) -> "Distribution":
        if self.kind == "uniform" and self.high < self.low:
            raise ValueError(f"uniform: high ({self.high}) is below low ({self.low})")
        ggml = self.kind in GGML_BLOCK_BYTES
        if ggml and (self.neg_inf_fraction or self.transform != "none" or self.factor != 1.0):
            raise ValueError(f"kind {self.kind} draws GGUF blocks: neg_inf_fraction, transform and factor do not "
                             "apply to it (use mean, std and special_fraction)")
        if not ggml and self.special_fraction:
            raise ValueError(f"special_fraction applies to the ggml_q4_1 and ggml_q8_0 kinds, not {self.kind}")
        return self


class Tolerance(_Strict):
    # finite: an infinite tolerance passes any output, an empty one included
    atol: float = Field(ge=0, allow_inf_nan=False)
    rtol: float = Field(ge=0, allow_inf_nan=False)
    norm_rel: float = Field(gt=0, allow_inf_nan=False)


class Shapes(_Strict):
    # strict: YAML's `true` is no size
    optimize: list[dict[str, StrictInt]] = Field(min_length=1)
    verify: list[dict[str, StrictInt]] = []
    #: the campaign's objective (kfactory.judge.objective): one weight per optimisation shape, in their order, and
    #: the score is the weighted sum of their medians (for a workload, how often each shape runs in it). None:
    #: the first shape alone
    weights: list[StrictFloat] | None = None   # strict: YAML's `true` or "2" is no weight

    @model_validator(mode="after")
    def _weighed(self) -> "Shapes":
        w = self.weights
        if w is None:
            return self
        if len(w) != len(self.optimize):
            raise ValueError(f"weights: {len(w)} given for {len(self.optimize)} optimize shapes; give one per "
                             "shape, in their order")
        if any(not math.isfinite(x) or x < 0 for x in w) or not any(x > 0 for x in w):
            raise ValueError(f"weights {w}: each must be a finite number >= 0, and one at least > 0")
        if len({tuple(sorted(shape.items())) for shape in self.optimize}) < len(self.optimize):
            # a score is by shape name: a shape given twice would be one term with the last weight
            raise ValueError("weights: the optimize shapes name one shape twice; give it once, with the sum of "
                             "its weights")
        return self


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
    #: cuda: grid, block and smem expressions over the shape symbols (see kfactory.targets.cuda.launch)
    launch: dict[str, str] = {}


PARAM_NAME = r"^[A-Za-z][A-Za-z0-9_]*$"


class ParamSpec(_Strict):
    """One scalar parameter of the problem (problem.yaml `params:`): `{type: float|int, value, min, max, doc}`,
    or a bare number (its type then follows the number: `3` is an int, `1.0e-5` a float). The value is what
    campaigns verify and time with; min and max bound what an exported kernel accepts."""
    type: Literal["float", "int"]
    value: float | int
    min: float | int | None = None
    max: float | int | None = None
    doc: str = ""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data):
        if isinstance(data, bool):
            raise ValueError("a boolean is not a parameter value: give an int or a float")
        if isinstance(data, (int, float)):
            return {"type": "int" if isinstance(data, int) else "float", "value": data}
        if isinstance(data, str):
            # YAML 1.1 reads 1e-5 (no dot) as a string: the most likely slip, so the message says the fix
            raise ValueError(f"{data!r} is text, not a number"
                             + (" (YAML reads a number without a dot as text: write 1.0e-5, not 1e-5)"
                                if _looks_numeric(data) else ""))
        if isinstance(data, dict):
            for key in ("value", "min", "max"):
                v = data.get(key)
                if isinstance(v, str):
                    raise ValueError(f"{key} {v!r} is text, not a number"
                                     + (" (write 1.0e-5, not 1e-5)" if _looks_numeric(v) else ""))
                if isinstance(v, bool):
                    raise ValueError(f"{key}: a boolean is not a number")
        return data

    @model_validator(mode="after")
    def _typed(self) -> "ParamSpec":
        for key in ("value", "min", "max"):
            v = getattr(self, key)
            if v is None:
                continue
            if self.type == "int":
                # an int parameter takes integers only: 2.0 in YAML is a float, so probably a float was meant
                if not isinstance(v, int):
                    raise ValueError(f"{key} {v!r} is not an integer, and the type is int")
            elif not math.isfinite(v):
                raise ValueError(f"{key} {v!r} is not a finite number")
            else:
                setattr(self, key, float(v))
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}")
        if (self.min is not None and self.value < self.min) or (self.max is not None and self.value > self.max):
            raise ValueError(f"value {self.value} is outside the declared range [{_bound(self.min, '-inf')}, "
                             f"{_bound(self.max, 'inf')}]")
        return self

    def in_range(self, v) -> bool:
        """Whether `v` lies within [min, max] (open ends where none is declared)."""
        return (self.min is None or v >= self.min) and (self.max is None or v <= self.max)


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _bound(v, default: str) -> str:
    return default if v is None else str(v)


class ProblemSpec(_Strict):
    """problem.yaml."""
    name: str = Field(pattern=PROBLEM_NAME)
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
    #: the float64 reference as a device kernel, per target (cuda): entry `reference_f64(inputs..., double
    #: *outputs..., long long symbols..., double params...)` in the spec's order, so that the judge computes its
    #: truth where the outputs are and compares there (kfactory.problems.package.ProblemPackage.reference_f64)
    reference_f64: dict[str, RefKernel] = {}
    families: list[str] = []
    #: scalar parameters (kfactory.problems.params says how each reaches the reference, kernel and templates)
    params: dict[str, ParamSpec] = {}

    @field_validator("params")
    @classmethod
    def _param_names(cls, v: dict) -> dict:
        lower: dict[str, str] = {}
        for name in v:
            if not re.match(PARAM_NAME, name) or keyword.iskeyword(name) or name in JINJA_RESERVED:
                raise ValueError(f"{name!r} cannot name a parameter: use a letter then letters, digits and '_', "
                                 f"not a Python keyword or one of {sorted(JINJA_RESERVED)}")
            # exported C headers spell a parameter's default as an upper-case macro: eps and EPS would clash
            if name.lower() in lower:
                raise ValueError(f"{name!r} and {lower[name.lower()]!r} differ only in case")
            lower[name.lower()] = name
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "ProblemSpec":
        syms = set(self.symbols)
        if len(syms) != len(self.symbols):
            raise ValueError(f"symbols {self.symbols} name one symbol twice")
        if len({t.name for t in self.inputs + self.outputs}) != len(self.inputs + self.outputs):
            raise ValueError("inputs and outputs name one tensor twice")
        for t in self.inputs + self.outputs:
            bad = [d for d in t.shape if isinstance(d, str) and d not in syms]
            if bad:
                raise ValueError(f"tensor {t.name!r}: shape uses {bad} which are not in symbols {self.symbols}")
            if fixed := [d for d in t.shape if not isinstance(d, str) and d < 1]:
                raise ValueError(f"tensor {t.name!r}: shape sizes {fixed} must be >= 1")
            if t.dtype == "uint8" and t in self.outputs:
                # outputs are judged against a float64 reference within tolerances; bytes would need an exact
                # rule, which the judge does not have
                raise ValueError(f"output {t.name!r}: dtype uint8 is for inputs (GGUF blocks, raw bytes); "
                                 "declare the output as a float or int dtype")
            if t.dtype not in self.tolerance and t in self.outputs:
                raise ValueError(f"output {t.name!r} has dtype {t.dtype} but tolerance has no entry for it")
        for shape in self.shapes.optimize + self.shapes.verify:
            if set(shape) != syms:
                raise ValueError(f"shape {shape} must give exactly the symbols {self.symbols}")
            if any(v < 1 for v in shape.values()):
                raise ValueError(f"shape {shape}: every size must be >= 1")
            self._fits(shape)
            self._cost_at(shape)
        names = {t.name for t in self.inputs}
        for dname, d in self.distributions.items():
            if set(d) != names:
                raise ValueError(f"distribution {dname!r} must describe exactly the inputs {sorted(names)}")
            for t in self.inputs:
                if why := _kind_misfit(t, d[t.name]):
                    raise ValueError(f"distributions.{dname}.{t.name}: {why}")
        tensors = names | {t.name for t in self.outputs}
        if clash := sorted(set(self.params) & (tensors | syms)):
            raise ValueError(f"params: {clash} already name a tensor or a shape symbol")
        for target, abi in self.abi.items():
            known = tensors | syms | set(self.params)
            if unknown := [a for a in abi.args if a not in known]:
                raise ValueError(f"abi.{target}.args: {unknown} are neither tensors, symbols nor params")
            if target in ("cpu", "cuda") and (why := self._signature_misfit(abi)):   # replay's runs nothing
                raise ValueError(f"abi.{target}: {why}")
            if passed := [a for a in abi.args if a in self.params]:
                types = c_param_types(abi.signature)
                for name in passed:
                    if why := check_c_type(self.params[name].type, types.get(name), self.params[name]):
                        raise ValueError(f"abi.{target}.signature: param {name!r}: {why}")
        return self

    def _signature_misfit(self, abi: "Abi") -> str:
        """kfactory.problems.params.abi_misfit for this spec ('' too when the signature is prose, as a replay
        problem's or an engine's)."""
        if not C_DECLARATION.match(abi.signature):
            return ""
        try:
            return abi_misfit(abi.signature, abi.args, {t.name: t.dtype for t in self.inputs + self.outputs},
                              {t.name for t in self.outputs}, self.symbols)
        except ValueError:
            return ""

    def _cost_at(self, shape: dict[str, int]) -> None:
        """cost.bytes and cost.flops at a declared shape: finite numbers of at least 0 (a campaign measures every
        kernel's bandwidth and speed-of-light floor with them; 0 has none, as a recorded tuning space)."""
        for field_name in ("bytes", "flops"):
            expr = getattr(self.cost, field_name)
            try:
                value = evaluate(expr, dict(shape))
                finite = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
            except EXPRESSION_ERRORS as e:
                raise ValueError(f"cost.{field_name}: {expr!r} cannot be evaluated at shape {shape}: {e}") from e
            if not finite or value < 0:
                raise ValueError(f"cost.{field_name}: {expr!r} is {value!r} at shape {shape}; it must be a finite "
                                 "number of at least 0")

    def _fits(self, shape: dict[str, int]) -> None:
        for t in self.inputs + self.outputs:
            n = 1
            for d in t.shape:
                n *= shape[d] if isinstance(d, str) else d
            if n > MAX_TENSOR_ELEMENTS:
                raise ValueError(f"tensor {t.name!r} at shape {shape} has {n} elements, over the limit of "
                                 f"{MAX_TENSOR_ELEMENTS}: choose smaller shapes")


def _kind_misfit(t: TensorSpec, d: Distribution) -> str:
    """Why a distribution cannot draw tensor `t` ("" when it can): GGUF blocks need a uint8 tensor whose last
    axis is the block's bytes, and a uint8 tensor takes blocks or bytes (uniform or constant within 0..255)."""
    if d.kind in GGML_BLOCK_BYTES:
        size = GGML_BLOCK_BYTES[d.kind]
        if t.dtype != "uint8":
            return f"kind {d.kind} draws GGUF blocks into a uint8 tensor, but {t.name!r} is {t.dtype}"
        if t.shape[-1] != size:
            return (f"kind {d.kind} needs the last axis of {t.name!r} to be the block's {size} bytes (a fixed "
                    f"size), not {t.shape[-1]!r}")
        return ""
    if t.dtype != "uint8":
        return ""
    if d.kind == "normal":
        return (f"{t.name!r} is uint8: draw it as GGUF blocks (ggml_q4_1, ggml_q8_0) or as bytes (uniform with "
                "0 <= low < high <= 256, constant 0..255), not normal")
    if d.kind == "uniform" and not 0 <= d.low < d.high <= 256:
        return f"{t.name!r} is uint8: a uniform draw needs 0 <= low < high <= 256 (it has {d.low}, {d.high})"
    if d.kind == "constant" and not (float(d.value).is_integer() and 0 <= d.value <= 255):
        return f"{t.name!r} is uint8: a constant must be an integer 0..255 (it is {d.value})"
    if d.neg_inf_fraction or d.transform != "none":
        return f"{t.name!r} is uint8: neg_inf_fraction and transform do not apply to bytes"
    return ""


class FamilySpec(_Strict):
    """families/<name>/family.yaml."""
    name: str = Field(pattern=PROBLEM_NAME)
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
