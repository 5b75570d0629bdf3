"""`--format torch`: NAME_torch.py, a torch.library custom op `kfactory::NAME` over the Python export (NAME.py,
written too) with a fake implementation, so it traces under torch.compile. The problem's params that the kernel
takes as arguments are the op's float/int arguments, defaulting to the problem's values."""
from __future__ import annotations


from kfactory.export.abi import abi_args
from kfactory.export.evidence import Judged, summary_lines
from kfactory.export.templates import fill

OP_NAMESPACE = "kfactory"


def op_text(j: Judged, problem, name: str) -> str:
    """The text of NAME_torch.py."""
    ins = [t.name for t in problem.spec.inputs]
    kw = [(a.name, problem.spec.params[a.name]) for a in abi_args(problem, j.candidate.target) if a.param]
    params = ", ".join(f"{n}: torch.Tensor" for n in ins) + "".join(
        f", {n}: {p.type} = {p.value!r}" for n, p in kw)
    fake_params = ", ".join(ins) + "".join(f", {n}={p.value!r}" for n, p in kw)
    values = "{" + ", ".join(f"{n!r}: {n}" for n, _ in kw) + "}"
    args = ", ".join(ins) + ("," if len(ins) == 1 else "")
    several = len(problem.spec.outputs) > 1
    ret = (f"typing.Tuple[{', '.join('torch.Tensor' for _ in problem.spec.outputs)}]" if several else "torch.Tensor")
    pick = "tuple({})" if several else "{}[0]"
    extra = f'''

import typing  # noqa: E402


@torch.library.custom_op("{OP_NAMESPACE}::{name}", mutates_args=())
def {name}({params}) -> {ret}:
    """{problem.name} on the exported kernel ({j.target_kind}); inputs contiguous, on one device."""
    return {pick.format(f"_kf_run(({args}), {values})")}


@{name}.register_fake
def _kf_fake({fake_params}):
    return {pick.format(f"_kf_empty_outputs(({args}))")}
'''
    doc = "\n".join(summary_lines(j, problem, name)) + (
        f"\n\nUsage (with this directory on sys.path):\n    import {name}_torch\n"
        f"    y = {name}_torch.{name}(x)          # or torch.ops.{OP_NAMESPACE}.{name}(x)\n"
        f"    torch.compile(lambda x: {name}_torch.{name}(x) * 2)(x)\n")
    return fill("_torch_op.py", doc, {"module": name}, extra)

