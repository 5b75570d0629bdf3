"""The orders in which kernels timed together take turns: a Williams design, shared by the runner's rounds
(kfactory.sandbox.child.sample_interleaved) and the judge's timings of one decision (kfactory.judge.rotated).

Each order is a permutation of the kernels; over all of them every kernel is in every place equally often and
right after every other kernel equally often. The rows are the shifts of 0, 1, n-1, 2, n-2, ... (a Latin square in
which each ordered pair is adjacent once), and for an odd n their mirror images too (2n orders). Why neighbours:
a kernel's time depends on the kernel before it (its buffers laid out right after that kernel's, its calls right
after that kernel's calls): on the 2-core host the same softmax kernel under two keys, one after a slower kernel
and one after itself, differed by 1.1% in six blocks of six, and as much the other way with the keys swapped.
"""
from __future__ import annotations


def williams(n: int) -> list[list[int]]:
    """The orders of indices 0..n-1 (see the module's docstring): n of them, 2n for an odd n over 1."""
    first = [0]
    for i in range(1, n):
        first.append((i + 1) // 2 if i % 2 else n - i // 2)
    orders = [[(x + j) % n for x in first] for j in range(n)]
    return orders + [o[::-1] for o in orders] if n % 2 and n > 1 else orders
