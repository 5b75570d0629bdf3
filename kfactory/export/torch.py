"""`--format torch`: NAME_torch.py, a torch.library custom op `kfactory::NAME` over the Python export (NAME.py,
written too) with a fake implementation, so it traces under torch.compile."""
from __future__ import annotations


from kfactory.export.evidence import Judged, summary_lines
from kfactory.export.templates import fill

OP_NAMESPACE = "kfactory"


def op_text(j: Judged, problem, name: str) -> str:
    """The text of NAME_torch.py."""
    ins = [t.name for t in problem.spec.inputs]
    params = ", ".join(f"{n}: torch.Tensor" for n in ins)
    args = ", ".join(ins) + ("," if len(ins) == 1 else "")
    several = len(problem.spec.outputs) > 1
    ret = (f"typing.Tuple[{', '.join('torch.Tensor' for _ in problem.spec.outputs)}]" if several else "torch.Tensor")
    pick = "tuple({})" if several else "{}[0]"
    extra = f'''

import typing  # noqa: E402


@torch.library.custom_op("{OP_NAMESPACE}::{name}", mutates_args=())
def {name}({params}) -> {ret}:
    """{problem.name} on the exported kernel ({j.target_kind}); inputs contiguous, on one device."""
    return {pick.format(f"_kf_run({args.rstrip(',')})")}


@{name}.register_fake
def _kf_fake({", ".join(ins)}):
    return {pick.format(f"_kf_empty_outputs(({args}))")}
'''
    doc = "\n".join(summary_lines(j, problem, name)) + (
        f"\n\nUsage (with this directory on sys.path):\n    import {name}_torch\n"
        f"    y = {name}_torch.{name}(x)          # or torch.ops.{OP_NAMESPACE}.{name}(x)\n"
        f"    torch.compile(lambda x: {name}_torch.{name}(x) * 2)(x)\n")
    return fill("_torch_op.py", doc, {"module": name}, extra)

