"""Engine-level design choices: what one generated inference engine is, as a frozen, hashable value.

An `EngineDesign` picks how the weights reach the kernels, which operations are fused, how many threads run,
how the KV cache is laid out and whether the weights are repacked at load. Every point of `space()` computes
the same function (the model's forward, to fp32 rounding): they differ only in speed, which is what a campaign
over engines searches. `design_id()` names a point stably (the same choices give the same id in every process
and version), so builds and measurements can be cached and compared by it.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Callable, TypeVar

from kfactory.engines.defaults import MAX_THREADS
from kfactory.targets.cpu.cpuinfo import host_has

T = TypeVar("T")

#: weight formats the matrix kernels read. "q4_1": the GGUF blocks as stored (the embedding/LM head keeps its
#: Q8_0 blocks), dequantised inside the matvec; "f32": every matrix dequantised to float32 at load (4x-6x the
#: bytes per token, no unpacking). A "q8_0" repack of the Q4_1 matrices is not offered: Q8_0 cannot hold every
#: Q4_1 value (d*q + m) exactly, so it would change the weights the reference computes with.
WEIGHTS = ("q4_1", "f32")
#: KV cache layouts: "head_major" [block][kv_head][pos][head_dim] (one head's keys contiguous: the decode
#: attention streams them); "token_major" [block][pos][kv_head][head_dim] (one position's keys contiguous: a
#: step writes one run)
KV_LAYOUTS = ("head_major", "token_major")
#: where a decode step's matvec over quantised blocks comes from: the engine's own kernels, or a kernel the
#: kernel pipeline searched and verified for that op (kfactory/engines/ops.py), named by its candidate id
BUILTIN = "builtin"
#: the design fields that name a searched kernel, by the op problem they come from
KERNEL_FIELDS = ("matvec_q4_1", "matvec_q8_0")
#: how prefill (a product over many tokens) runs: "gemm" dequantises a panel of rows once into floats and runs a
#: register-blocked micro-kernel over every token of the chunk; "tiled" runs the decode kernels over tiles of 4
#: tokens, unpacking each block once per tile. Decode (one token) runs the same matvecs in both; its attention
#: takes the 4-keys kernel with "gemm" (attend_block, c/forward.c), the one-key kernel with "tiled".
PREFILLS = ("gemm", "tiled")
#: how a decode step's matvec turns Q4_1 codes into products where the engine is built with AVX-512 (prepacked
#: Q4_1 weights, the engine's own kernel): "convert" masks each code in place and converts it to a float, two
#: rows to a 512-bit vector, and applies the block's scale to the sum (4 shuffles a block of 4 rows); "table"
#: looks each code up in a 16-entry table of the row's dequantised values by permutes (12 shuffles, fewer
#: instructions in all). Which wins depends on the processor's shuffle port: on a Zen 4 (512-bit shuffles
#: double-pumped) "convert" measured 1.22x decode tok/s; an Intel core with a full-width shuffle port may favour
#: the table. Without AVX-512 both run the 256-bit conversion kernel (space() then offers "convert" only).
#: "vnni" (AVX512-VNNI processors only: space() offers it where the host has it, and its build fails elsewhere)
#: keeps the Q4_1 matrices in PACK16 (16 rows interleaved, one 32-bit lane a row) and takes each block's dot
#: products in integers: x is rounded per block of 32 to 29-bit integers on a power-of-two grid (finer than fp32's
#: own rounding of the block's largest value) and split into four byte digits, and vpdpbusd adds 4 code x digit
#: products a lane; the sums are exact, the block's scale applies once per row. On a Zen 4 core it took 2.0x the
#: blocks a second of "convert" from cache (27.5 GB/s against 13.6) and 1.8x streamed (23.0 against 12.9, the
#: read probe 26): memory bounds it. The Q8_0 matrices (the tied head) go the same way, over PACK16 with codes
#: stored + 128 (q8group16_vnni: 1.19x the conversion kernel streamed; decode x1.09-1.13 at 1 thread). It needs
#: prefill "gemm" (its rows path takes the few tokens below the GEMM's minimum one at a time).
#: "vnni24" is "vnni" with x rounded per block to 24-bit integers (the grid fp32 rounds the block's largest value
#: on, at most one ulp of it) in three byte digits, the lower two unsigned (8 bits each, as vpdpbusd's unsigned
#: operand against the codes taken as signed): a quarter fewer vpdpbusd than vnni's four digits (29 bits).
Q4_DECODES = ("convert", "table", "vnni", "vnni24")
#: {integer q4_decode: the byte digits of x it multiplies each quantised weight by} (matmul.c's vnni_digits: vnni
#: A 2^21 + B 2^14 + C 2^7 + D, vnni24 A 2^16 + B 2^8 + C); the roofline counts a decode step's integer work by
#: it (roofline.Formats.decode_int8)
VNNI_DIGITS = {"vnni": 4, "vnni24": 3}
#: the processor flags (/proc/cpuinfo) a q4_decode's kernel needs beyond AVX-512F
Q4_DECODE_NEEDS = {dec: ("avx512_vnni", "avx512bw") for dec in VNNI_DIGITS}
#: how an idle OpenMP thread of a design that does not spin waits for the next parallel region: "passive" sleeps
#: at once (OMP_WAIT_POLICY=passive); "bounded" spins GOMP_SPINCOUNT iterations first, then sleeps (libgomp's
#: own default, which it cuts to a few spins when a team has more threads than the process has cpus). A decode
#: step opens ~150 regions back to back: on an idle host, 2 threads measured 176 tok/s bounded against 137
#: passive (x1.28 in one process, smollm2-135m), and a bounded spin yields the core after a while to a host's
#: other jobs, where an active one never does; a campaign measures which wait wins on its host.
WAITS = ("passive", "bounded")
#: how much faster in decode a spinning design must be than the fastest verified design whose threads sleep for
#: a campaign to choose it (kfactory.engines.campaign.best_of, EngineProblem.winner through the services): a
#: spinning engine's idle threads hold their cores between calls too (OMP_WAIT_POLICY=active), a cost tok/s does
#: not show (an exported engine in a server that waits for requests keeps its cores busy); smollm2 on a 2-core
#: Zen 4 EPYC measured spinning and a bounded wait within x0.9-1.1 of each other from campaign to campaign,
#: inside the host's noise
SPIN_MARGIN = 1.10


def prefer_calm(items: list[T], rate: Callable[[T], tuple[float, ...]], spins: Callable[[T], bool]) -> T:
    """The campaign's winner among `items` (non-empty) by SPIN_MARGIN's rule: the fastest by `rate` (decode tok/s
    first, the rest breaking ties), unless it spins and one that does not decodes within SPIN_MARGIN of it; then
    the fastest of those. One rule for the local campaign's records (DesignResult) and the planner's result
    (Measured events): kfactory.engines.campaign.best_of, EngineProblem.winner."""
    fastest = max(items, key=rate)
    calm = [i for i in items if not spins(i)]
    if not spins(fastest) or not calm:
        return fastest
    best_calm = max(calm, key=rate)
    return best_calm if rate(best_calm)[0] * SPIN_MARGIN >= rate(fastest)[0] else fastest
#: how the threads of a multi-thread design share a decode step: "op" opens an OpenMP parallel region for each
#: matvec and the attention (~5 a block: each a fork and a join, one thread running the norms, RoPE and SiLU
#: between them while the others wait); "step" opens one region a step, in which every thread computes the small
#: element-wise ops itself on its own copy of the residual stream, takes its share of each matvec's rows, and
#: meets the others at a barrier only where it needs what they wrote (c/team.c). Both compute every value with
#: the same code, so their logits are bit-identical. On a 2-core Zen 4 (smollm2-135m, vnni24, bench/engine_ab.py,
#: rounds alternated) "step" decoded x1.222 the tok/s of "op" (median of 12 rounds, 1.138-1.265; x1.09 with
#: spinning threads), the gain in the host's fast moments (its read bandwidth ~60 GB/s against ~40); in five
#: campaigns that searched both, every effect line favoured it (x1.07-1.30), sleeping threads most (x1.20-1.45:
#: 5 sleeps and wake-ups a block instead of 10). So space() offers "step" for every multi-thread design and "op"
#: stays to compare against (bench/engine_ab.py), as prefill "tiled" does: searched beside it, a single timing on
#: a noisy host could not tell them apart and the campaigns' winners stayed "op" designs.
TEAMS = ("op", "step")
#: libgomp's spin count of a "bounded" wait (its default with OMP_WAIT_POLICY unset), set explicitly so that the
#: environment a design was measured in does not decide it
BOUNDED_SPINS = 300000
#: the ops whose threads a design may set apart from `threads` (op_threads): the Q, K, V matvec(s), the
#: attention, the output projection, the gate/up matvec(s), the down projection and the LM head
OPS = ("qkv", "attn", "o", "gate_up", "down", "head")
#: the op_threads values space() offers a multi-thread design: each op alone on one thread, and the three small
#: ops of a block (qkv, attn, o) together; a small op's parallel region can cost more in waking and joining
#: threads than it saves
OP_THREAD_CHOICES = ("", *(f"{op}=1" for op in OPS), "qkv=1,attn=1,o=1")
_CANDIDATE_ID = re.compile(r"^[0-9a-f]{12,64}$")


class DesignError(ValueError):
    """A design value outside the valid ones; the message names the field and the valid values."""


@dataclass(frozen=True)
class EngineDesign:
    """One engine's choices. Every field changes the generated C or the tensors handed to it, never the
    function computed.

    weights:      "q4_1" (blocks kept, dequantised in the kernel) or "f32" (dequantised at load); see WEIGHTS.
    fuse_qkv:     one matvec over the rows of Q, K and V concatenated (one pass over the normed activations,
                  one parallel region instead of three), instead of three matvecs.
    fuse_gate_up: one matvec over the gate and up rows concatenated, instead of two.
    fuse_norm:    the residual add and the next RMSNorm in one pass (the sum of squares is taken while adding),
                  instead of an add pass and a norm pass.
    threads:      OpenMP threads of the matrix and attention kernels (1 runs without entering OpenMP);
                  op_threads may run single ops on fewer.
    kv_layout:    "head_major" or "token_major"; see KV_LAYOUTS.
    prepack:      weights repacked at load for the kernels: rows interleaved in groups of 4 (a decode step's
                  load of x feeds 4 rows), the 4 rows' scales side by side, and Q4_1's nibbles reordered so
                  that one widening and shifts unpack them (kfactory/engines/prepare.py); False keeps the GGUF
                  row order and block layout (quantised weights are then not copied).
    spin:         with threads > 1, idle OpenMP threads spin between parallel regions (OMP_WAIT_POLICY=active:
                  the lowest wake-up latency on an idle host) instead of sleeping (passive). A decode step has
                  ~5 regions per block; on an oversubscribed host a spinning thread holds the core its partner
                  needs and a step can take 50x longer, so sleeping is the default.
    wait:         with threads > 1 and no spin, how an idle thread waits: "passive" (sleeps at once) or
                  "bounded" (spins BOUNDED_SPINS iterations, then sleeps); see WAITS.
    op_threads:   threads of single ops apart from `threads`: "" (every op on `threads`), or "op=N" entries
                  joined by commas, ops from OPS in that order, each 1 <= N < threads (e.g. "attn=1,o=1":
                  the attention and the output projection on one thread). An engine created with fewer
                  threads than an entry's N runs that op on all of its threads.
    team:         with threads > 1, "op" (a parallel region for each op) or "step" (one a decode step, the
                  threads meeting at barriers); see TEAMS. Prefill runs a region an op either way. `space()`
                  holds "step" only: "op" is there to compare against.
    matvec_q4_1:  "builtin", or the candidate id of a verified `matvec_q4_1` kernel (kfactory/engines/ops.py):
                  that kernel then runs every decode step's matvec over Q4_1 blocks. It reads the GGUF
                  layout, so it needs weights "q4_1", and the Q4_1 matrices stay in rows whatever prepack says
                  (layout_of).
    matvec_q8_0:  the same for the Q8_0 matvec (the tied LM head) with a verified `matvec_q8_0` kernel.
    q4_decode:    "convert", "table", "vnni" or "vnni24": how a decode step's 512-bit matvec unpacks Q4_1
                  codes; see Q4_DECODES. It applies to prepacked "q4_1" weights with the engine's own Q4_1
                  kernel; the integer ones ("vnni", "vnni24") also need prefill "gemm", store the Q4_1 matrices
                  in PACK16 (layout_of) and take the Q8_0 ones (the head) in integers too, over PACK16
                  (unless matvec_q8_0 is searched).
    prefill:      "gemm" or "tiled": the kernels of a product over 12 tokens or more; see PREFILLS. Without
                  AVX2 both run the portable kernels. `space()` holds "gemm" only: it measured 1.9x the tiled
                  prefill on SmolLM2 (docs/engines.md), so "tiled" is there to compare against, not to search.
    """
    weights: str = "q4_1"
    fuse_qkv: bool = True
    fuse_gate_up: bool = True
    fuse_norm: bool = True
    threads: int = 1
    kv_layout: str = "head_major"
    prepack: bool = True
    spin: bool = False
    matvec_q4_1: str = BUILTIN
    matvec_q8_0: str = BUILTIN
    prefill: str = PREFILLS[0]
    wait: str = WAITS[0]
    op_threads: str = ""
    q4_decode: str = Q4_DECODES[0]
    team: str = TEAMS[0]

    def __post_init__(self):
        if self.weights not in WEIGHTS:
            raise DesignError(f"weights {self.weights!r} is not one of {', '.join(WEIGHTS)}")
        if self.prefill not in PREFILLS:
            raise DesignError(f"prefill {self.prefill!r} is not one of {', '.join(PREFILLS)}")
        if self.kv_layout not in KV_LAYOUTS:
            raise DesignError(f"kv_layout {self.kv_layout!r} is not one of {', '.join(KV_LAYOUTS)}")
        for name in ("fuse_qkv", "fuse_gate_up", "fuse_norm", "prepack", "spin"):
            if not isinstance(getattr(self, name), bool):
                raise DesignError(f"{name} must be true or false, not {getattr(self, name)!r}")
        if not isinstance(self.threads, int) or isinstance(self.threads, bool) \
                or not 1 <= self.threads <= MAX_THREADS:
            raise DesignError(f"threads must be an integer in 1..{MAX_THREADS}, not {self.threads!r}")
        if self.spin and self.threads == 1:
            raise DesignError("spin applies to threads > 1 (one thread never waits for another)")
        if self.wait not in WAITS:
            raise DesignError(f"wait {self.wait!r} is not one of {', '.join(WAITS)}")
        if self.wait != WAITS[0] and (self.threads == 1 or self.spin):
            raise DesignError(f"wait {self.wait!r} applies to threads > 1 without spin (one thread never waits; a "
                              "spinning one never sleeps)")
        if self.team not in TEAMS:
            raise DesignError(f"team {self.team!r} is not one of {', '.join(TEAMS)}")
        if self.team != TEAMS[0] and self.threads == 1:
            raise DesignError(f"team {self.team!r} applies to threads > 1 (one thread has no team to share a step)")
        if self.q4_decode not in Q4_DECODES:
            raise DesignError(f"q4_decode {self.q4_decode!r} is not one of {', '.join(Q4_DECODES)}")
        if self.q4_decode != Q4_DECODES[0] and not self.q4_decode_applies():
            raise DesignError(f"q4_decode {self.q4_decode!r} applies to weights 'q4_1' prepacked, with the engine's "
                              "own matvec_q4_1 (the kernel that unpacks them)")
        if self.q4_decode in VNNI_DIGITS and self.prefill != "gemm":
            raise DesignError(f"q4_decode {self.q4_decode!r} needs prefill 'gemm', not {self.prefill!r} (its rows "
                              "path takes only the few tokens below the GEMM's minimum)")
        self.op_thread_map()
        for name in KERNEL_FIELDS:
            self._check_kernel(name, getattr(self, name))

    def q4_decode_applies(self) -> bool:
        """Whether q4_decode picks a kernel: Q4_1 blocks kept, prepacked, read by the engine's own matvec."""
        return self.weights == "q4_1" and self.prepack and self.matvec_q4_1 == BUILTIN

    def decode_int8(self) -> dict[str, int]:
        """{block format ("q4_1", "q8_0"): the byte digits of x each of its weights is multiplied by} for the
        matrices a decode step multiplies in integers (those in PACK16: VNNI_DIGITS of an integer q4_decode);
        empty where every product is fp32."""
        return {fmt.lower(): VNNI_DIGITS[self.q4_decode] for fmt in ("Q4_1", "Q8_0")
                if self.layout_of(fmt) == "pack16"}

    def op_thread_map(self) -> dict[str, int]:
        """{op: threads} of op_threads; DesignError naming the entry and the valid form when it is not one."""
        if not isinstance(self.op_threads, str):
            raise DesignError(f"op_threads must be a string of op=N entries, not {self.op_threads!r}")
        if not self.op_threads:
            return {}
        if self.threads == 1:
            raise DesignError("op_threads applies to threads > 1 (one thread runs every op)")
        out: dict[str, int] = {}
        for entry in self.op_threads.split(","):
            op, sep, n = entry.partition("=")
            if not sep or op not in OPS or not n.isdigit():
                raise DesignError(f"op_threads entry {entry!r} is not op=N with op one of {', '.join(OPS)}")
            if not 1 <= int(n) < self.threads:
                raise DesignError(f"op_threads entry {entry!r}: N must lie in 1..{self.threads - 1} (below the "
                                  f"design's threads, {self.threads}; an op on all of them needs no entry)")
            if op in out:
                raise DesignError(f"op_threads names {op!r} twice")
            out[op] = int(n)
        canonical = ",".join(f"{op}={out[op]}" for op in OPS if op in out)
        if canonical != self.op_threads:
            raise DesignError(f"op_threads {self.op_threads!r}: write it as {canonical!r} (ops in the order "
                              f"{', '.join(OPS)})")
        return out

    def _check_kernel(self, name: str, value: object) -> None:
        if value == BUILTIN:
            return
        if not isinstance(value, str) or not _CANDIDATE_ID.match(value):
            raise DesignError(f"{name} must be {BUILTIN!r} or a kernel's candidate id (12 to 64 lowercase hex "
                              f"digits), not {value!r}")
        if self.weights != "q4_1":
            raise DesignError(f"{name} = {value[:12]}: a searched kernel reads the GGUF blocks as stored, so it "
                              "needs weights 'q4_1'")

    def layout_of(self, fmt: str) -> str:
        """The layout of the matrices stored in block format `fmt` ("Q4_1", "Q8_0", "F32"): "rows" where a
        searched kernel reads them (the GGUF blocks as stored), else "pack4" when prepacked ("pack16" for Q4_1
        and Q8_0 under an integer q4_decode, VNNI_DIGITS), else "rows"."""
        searched = {"Q4_1": self.matvec_q4_1, "Q8_0": self.matvec_q8_0}.get(fmt, BUILTIN) != BUILTIN
        if not self.prepack or searched:
            return "rows"
        return "pack16" if fmt in ("Q4_1", "Q8_0") and self.q4_decode in VNNI_DIGITS else "pack4"

    def at_threads(self, threads: int) -> "EngineDesign":
        """This design on `threads` threads: spin, a bounded wait and the op_threads entries kept only where
        they still apply (a thread can wait; an op's N below the new count)."""
        ops = ",".join(f"{op}={n}" for op, n in self.op_thread_map().items() if n < threads)
        return replace(self, threads=threads, spin=self.spin and threads > 1,
                       wait=self.wait if threads > 1 else WAITS[0], op_threads=ops,
                       team=self.team if threads > 1 else TEAMS[0])

    def omp_env(self) -> dict[str, str | None]:
        """The OpenMP environment this design runs in (libgomp reads it once, when the library loads): each
        variable's value, or None for one that must be unset."""
        if self.spin:
            return {"OMP_WAIT_POLICY": "active", "GOMP_SPINCOUNT": None}
        if self.wait == "bounded":
            return {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": str(BOUNDED_SPINS)}
        return {"OMP_WAIT_POLICY": "passive", "GOMP_SPINCOUNT": None}

    def searched_kernels(self) -> dict[str, str]:
        """{op problem: candidate id} of the kernels this design takes from the kernel pipeline."""
        return {name: getattr(self, name) for name in KERNEL_FIELDS if getattr(self, name) != BUILTIN}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "EngineDesign":
        """The design of `data`; unknown keys are refused (naming the valid ones), missing keys take defaults."""
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise DesignError(f"unknown design field(s) {', '.join(unknown)}; fields: {', '.join(names)}")
        return cls(**data)

    def design_id(self) -> str:
        """A stable short name: a readable prefix and a hash of every field (sorted JSON), so two designs share
        an id exactly when they are equal."""
        # the kernel fields join the hash only when set: designs with the engine's own kernels keep the ids
        # they had before those fields existed (records and build caches name them)
        named = {k: v for k, v in self.as_dict().items() if not (k in KERNEL_FIELDS and v == BUILTIN)}
        # likewise prefill at its default: ids name the designs they named before the field existed
        if self.prefill == PREFILLS[0]:
            del named["prefill"]
        if self.wait == WAITS[0]:
            del named["wait"]
        if not self.op_threads:
            del named["op_threads"]
        if self.q4_decode == Q4_DECODES[0]:
            del named["q4_decode"]
        if self.team == TEAMS[0]:
            del named["team"]
        digest = hashlib.sha256(json.dumps(named, sort_keys=True).encode()).hexdigest()[:10]
        fused = "".join(tag for tag, on in (("q", self.fuse_qkv), ("g", self.fuse_gate_up), ("n", self.fuse_norm))
                        if on) or "none"
        searched = "".join(f"-{tag}" for tag, name in (("m4", "matvec_q4_1"), ("m8", "matvec_q8_0"))
                           if getattr(self, name) != BUILTIN)
        tiled = "" if self.prefill == PREFILLS[0] else f"-{self.prefill}"
        tiled += "" if self.q4_decode == Q4_DECODES[0] else f"-{self.q4_decode}"
        # each op's initial and its threads: qkv=1,attn=1 -> -opq1a1
        ops = "-op" + "".join(f"{op[0]}{n}" for op, n in self.op_thread_map().items()) if self.op_threads else ""
        waits = "s" if self.spin else "b" if self.wait == "bounded" else ""
        waits += "-step" if self.team == "step" else ""
        return (f"{self.weights}-f{fused}-t{self.threads}{waits}-"
                f"{self.kv_layout.split('_')[0]}{'-pp' if self.prepack else ''}{searched}{tiled}{ops}-{digest}")


def q4_decodes_offered(avx512: bool | None = None, vnni: bool | None = None) -> tuple[str, ...]:
    """The q4_decode values space() offers: every one with AVX-512 (`avx512`; default: whether this host's
    processor has it), but the integer ones (VNNI_DIGITS) only with `vnni` too (default: whether it has their
    Q4_DECODE_NEEDS); the default alone without AVX-512."""
    if avx512 is None:
        avx512 = host_has("avx512f")
    if vnni is None:
        vnni = all(host_has(flag) for flag in Q4_DECODE_NEEDS["vnni"])
    return tuple(d for d in Q4_DECODES if d not in VNNI_DIGITS or vnni) if avx512 else Q4_DECODES[:1]


def space(max_threads: int | None = None, avx512: bool | None = None,
          vnni: bool | None = None) -> list[EngineDesign]:
    """Every valid design point with 1..max_threads threads (default: this host's cores), in a fixed order,
    with the engine's own matvec kernels (searched ones join in the campaign, kfactory/engines/ops.py). Where
    the engine is built without AVX-512, q4_decode changes no instruction, so only its default is offered;
    q4_decodes_offered(avx512, vnni) says which. Its multi-thread designs share a step in one region (team
    "step"; TEAMS)."""
    top = max_threads if max_threads is not None else (os.cpu_count() or 1)
    if not 1 <= top <= MAX_THREADS:
        raise DesignError(f"max_threads must lie in 1..{MAX_THREADS}, not {top}")
    # how idle threads wait: sleeping, spinning, or a bounded spin (threads > 1 only); more than one thread
    # shares a step in one region (TEAMS: "step" is searched, "op" compared against)
    waits = ((False, WAITS[0]), (True, WAITS[0]), (False, "bounded"))
    decodes = q4_decodes_offered(avx512, vnni)
    return [EngineDesign(w, q, g, n, t, kv, pp, spin, wait=wait, op_threads=ops, q4_decode=dec,
                         team=TEAMS[1] if t > 1 else TEAMS[0])
            for w, q, g, n, t, kv, pp, (spin, wait), ops, dec in itertools.product(
                WEIGHTS, (False, True), (False, True), (False, True), range(1, top + 1), KV_LAYOUTS, (False, True),
                waits, OP_THREAD_CHOICES, decodes)
            if (t > 1 or (not spin and wait == WAITS[0] and not ops))
            and (dec == Q4_DECODES[0] or (w == "q4_1" and pp))]
