"""Argument lists in shared memory, shared by every runner-backed session (cpu, cuda): the tensors of one call
in ABI order, the staged inputs and outputs of a call sequence, and the results read back."""
from __future__ import annotations

import numpy as np

from kfactory.judge.numerics import same_bytes
from kfactory.platform import hostthreads
from kfactory.problems.params import scalar_arg
from kfactory.sandbox.shm import ShmBuffers
from kfactory.targets.base import CallResult


def poison_value(dtype: str) -> float:
    """What an output is filled with before a run: NaN for floats (bf16 included: ml_dtypes registers it with
    kind 'V'), -1 for integers."""
    return -1 if np.dtype(dtype).kind in "iu" else float("nan")


def set_bytes(problem, shape: dict[str, int]) -> int:
    """Bytes of one set of the problem's inputs and outputs at a shape."""
    return sum(int(np.prod(problem.tensor_shape(t, shape))) * np.dtype(t.dtype).itemsize
               for t in problem.spec.inputs + problem.spec.outputs)


def call_bytes(problem, shape: dict[str, int], steps: int = 1) -> int:
    """Arena bytes a call of `steps` steps needs: the guarded tensors, and each further step's staged copies."""
    tensors = len(problem.spec.inputs) + len(problem.spec.outputs)
    return steps * (set_bytes(problem, shape) + tensors * (2 * ShmBuffers.GUARD + 2 * ShmBuffers.ALIGN))


def bench_bytes(problem, shape: dict[str, int], keys: int, sets: int) -> int:
    """Arena bytes a bench of `keys` kernels over `sets` input sets needs (each kernel has its own buffers)."""
    tensors = len(problem.spec.inputs) + len(problem.spec.outputs)
    return keys * sets * (set_bytes(problem, shape) + 2 * tensors * ShmBuffers.ALIGN)


def build_argset(problem, abi_args: list[str], bufs: ShmBuffers, shape: dict[str, int],
                 inputs: dict[str, np.ndarray], guards: list | None = None,
                 writes: list | None = None) -> tuple[list[dict], dict[str, np.ndarray]]:
    """The runner's argument list (ABI order, then tensors outside the ABI) and the parent's views, inputs written
    and outputs poisoned. With `guards` (a list to fill with (name, band)), every tensor gets guard bands around
    it. With `writes`, the writes are appended there as (view, value) instead, for the caller to make with
    write_all (a request of many sets writes them all at once)."""
    todo: list = [] if writes is None else writes
    spec, views, args = problem.spec, {}, []
    outs = {t.name: t for t in spec.outputs}
    ins = {t.name: t for t in spec.inputs}
    for name in abi_args + [t.name for t in spec.outputs + spec.inputs]:
        if name in views or not (name in ins or name in outs):
            continue
        t = ins.get(name) or outs[name]
        tshape = problem.tensor_shape(t, shape)
        if guards is None:
            path, offset, arr = bufs.new(tshape, t.dtype)
        else:
            path, offset, arr, bands = bufs.new_guarded(tshape, t.dtype)
            guards.extend((name, b) for b in bands)
        todo.append((arr, inputs[name] if name in ins else poison_value(t.dtype)))
        views[name] = arr
        args.append({"name": name, "path": path, "offset": offset, "dtype": t.dtype, "shape": list(arr.shape),
                     "role": "in" if name in ins else "out"})
    by_name = {a["name"]: a for a in args}
    # scalars: a shape symbol's size, or a problem parameter's value ({"float"} for a float parameter)
    ordered = [by_name[a] if a in by_name else scalar_arg(problem, a, shape) for a in abi_args]
    if writes is None:
        write_all(todo)
    return ordered + [a for a in args if a["name"] not in abi_args], views


def bench_argsets(problem, abi_args: list[str], bufs: ShmBuffers, shape: dict[str, int], keys: list[str],
                  input_sets: list[dict[str, np.ndarray]]) -> dict[str, list[tuple[list[dict], dict[str, np.ndarray]]]]:
    """Per key, build_argset's (arguments, views) of every input set, on buffers of its own: a bench's; every
    write made at once (write_all)."""
    writes: list = []
    per_key = {k: [build_argset(problem, abi_args, bufs, shape, inp, writes=writes) for inp in input_sets]
               for k in keys}
    write_all(writes)
    return per_key


def write_all(writes: list) -> None:
    """Make build_argset's writes, on the host's shared threads (kfactory.platform.hostthreads) when they are
    large: a timing pool of 4096x4096 sets is a GiB to write, which one thread writes at half the speed of two."""
    if sum(view.nbytes for view, _ in writes) < WRITE_AT_ONCE_BYTES:
        for view, value in writes:
            view[...] = value
        return
    hostthreads.each(lambda w: w[0].__setitem__(Ellipsis, w[1]), writes)


#: below this, a request's writes are made in the calling thread (the threads cost more than they save)
WRITE_AT_ONCE_BYTES = 8 << 20


def _staged(bufs: ShmBuffers, arr: np.ndarray) -> tuple[dict, np.ndarray]:
    """A copy of `arr` in shared memory and its descriptor, for the runner to copy from or into."""
    path, offset, view = bufs.new(arr.shape, str(arr.dtype))
    view[...] = arr
    return {"path": path, "offset": offset, "dtype": str(arr.dtype), "shape": list(arr.shape)}, view


def stage_steps(problem, bufs: ShmBuffers, shape: dict[str, int], steps: list[dict[str, np.ndarray]]):
    """(staged views, the command's "steps") for every step after the first: its inputs to copy in, where the
    previous step's outputs go, and the poison for the outputs."""
    spec, staged = problem.spec, []
    for inputs in steps[1:]:
        ins = {t.name: _staged(bufs, inputs[t.name]) for t in spec.inputs}
        outs = {t.name: _staged(bufs, np.empty(problem.tensor_shape(t, shape), t.dtype)) for t in spec.outputs}
        staged.append((ins, outs))
    cmd = [{"inputs": {n: d for n, (d, _) in ins.items()}, "outputs": {n: d for n, (d, _) in outs.items()},
            "poison": {t.name: poison_value(t.dtype) for t in spec.outputs}} for ins, outs in staged]
    return staged, cmd


def sequence_results(problem, steps: list[dict], staged: list, views: dict, seconds: list[float],
                     out_of_bounds: list[str], copy: bool = True) -> list[CallResult]:
    """One CallResult per step; input mutation is judged on the last step (its inputs are in the buffers). With
    copy=False the outputs are the shared buffers themselves (valid while the caller keeps them from reuse)."""
    spec, results = problem.spec, []
    for i, inputs in enumerate(steps):
        last = i + 1 == len(steps)
        src = {t.name: views[t.name] for t in spec.outputs} if last else {n: v for n, (_, v) in staged[i][1].items()}
        mutated = [t.name for t in spec.inputs if not same_bits(views[t.name], inputs[t.name])] if last else []
        outs = {n: np.array(v) for n, v in src.items()} if copy else dict(src)
        results.append(CallResult(outs, seconds[i], mutated, out_of_bounds))
    return results


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-for-bit equality (a NaN payload counts too), compared in 8-byte words where the size allows."""
    a, b = np.ascontiguousarray(a).reshape(-1).view(np.uint8), np.ascontiguousarray(b).reshape(-1).view(np.uint8)
    fast = same_bytes(a, b)
    if fast is not None:
        return fast
    if a.size != b.size:
        return False
    if a.size % 8 == 0:
        a, b = a.view(np.uint64), b.view(np.uint64)
    return bool(np.array_equal(a, b))
