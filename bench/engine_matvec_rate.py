"""How fast the engine's own decode matvec consumes weight blocks: from cache (one matrix multiplied again and
again: the kernel's instruction throughput) and streamed from memory (a rotation over matrices far larger than
the last-level cache), beside the cpu target's read probe on the same core. The gap between the first two and
the third says what bounds a decode step: the kernel's vector ports, or memory.

    python bench/engine_matvec_rate.py [--format q4_1|q8_0] [--rows 1536] [--blocks 18] [--design JSON]
                                       [--threads N]
    python bench/engine_matvec_rate.py --design '{"q4_decode": "vnni"}'   # the integer decode (PACK16)

The harness is the engine's generated C (kfactory.engines.codegen, the design's defines) with a `main` appended
that builds a PACK4 matrix (PACK16, Q4_1 or Q8_0, for a design with q4_decode "vnni") of random blocks (scales
set to small normal halves) and times the engine's `matmul` over one token on `--threads` threads (1 by default;
the read probe runs at the same count); it is compiled with the engine's flags and run as its own process. GB/s
counts the blocks' bytes (Q4_1: 20 per 32 weights, Q8_0: 34).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from kfactory.engines.build import FLAGS, LINK, compiler
from kfactory.engines.codegen import generate
from kfactory.engines.design import EngineDesign
from kfactory.engines.prepare import LAYOUTS
from kfactory.models import load_model
from kfactory.platform.config import Settings
from kfactory.targets import get_target
from kfactory.targets.cpu.ceiling import measure_read_bandwidth

MAIN = r"""
#include <time.h>
static double kf_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}
int main(int argc, char **argv) {
  int format = atoi(argv[1]), rows = atoi(argv[2]), nb = atoi(argv[3]), layout = atoi(argv[4]), cols = 32 * nb;
  int threads = atoi(argv[5]);
  int q4 = format == KF_Q4_1, group = layout == KF_PACK16 ? 16 : 4;
  int halves = layout == KF_PACK16 ? (q4 ? 32 : 16) : q4 ? 8 : 4;
  size_t pb = layout == KF_PACK16 ? (q4 ? 320 : 544) : q4 ? 80 : 136, bytes = (size_t)rows / group * nb * pb;
  size_t nmat = (size_t)(512e6 / bytes) + 1;   /* the streamed pool: 512 MB, far past any last-level cache */
  uint8_t *pool = aligned_alloc(64, bytes * nmat);
  for (size_t i = 0; i < bytes * nmat; i++) pool[i] = (uint8_t)((i * 2654435761u) >> 13);
  for (size_t g = 0; g < (size_t)rows / group * nb * nmat; g++) {   /* every scale (and Q4_1 min) a small normal half */
    uint16_t *h = (uint16_t *)(pool + g * pb);
    for (int j = 0; j < halves; j++) h[j] = 0x2000;
  }
  float *x = malloc(sizeof(float) * cols), *y = malloc(sizeof(float) * rows);
  float *xs = aligned_alloc(64, sizeof(float) * ((matmul_scratch_floats(1, 1) + 15) / 16 * 16));
  for (int i = 0; i < cols; i++) x[i] = (float)(i % 7) * 0.1f - 0.3f;
  kf_tensor w = {"w", format, layout, rows, cols, pool};
  for (int pass = 0; pass < 2; pass++) {             /* 0: one matrix again and again (cache); 1: streamed */
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
      int calls = (int)(1e9 / bytes) + 1;
      double t0 = kf_now();
      for (int c = 0; c < calls; c++) {
        w.data = pool + (pass ? (size_t)(c % (int)nmat) * bytes : 0);
        matmul(&w, x, cols, 1, y, rows, xs, threads);
      }
      double per = (kf_now() - t0) / calls;
      if (per < best) best = per;
    }
    printf("%s %.4f\n", pass ? "streamed" : "cache", bytes / best / 1e9);
  }
  return y[0] == 12345.0f;   /* keeps y live */
}
"""


def design_env(design: EngineDesign) -> dict[str, str]:
    """The OpenMP environment the design's engine runs in (its wait policy, spinning), less what it unsets."""
    return {k: v for k, v in design.omp_env().items() if v is not None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", choices=("q4_1", "q8_0"), default="q4_1")
    ap.add_argument("--rows", type=int, default=1536, help="a multiple of 16 (PACK4 and PACK16 groups)")
    ap.add_argument("--blocks", type=int, default=18, help="blocks of 32 per row (SmolLM2: 18 or 48)")
    ap.add_argument("--threads", type=int, default=1, help="threads of the matvec and of the read probe")
    ap.add_argument("--design", default="{}", help="EngineDesign fields as JSON (its defines and the layout it "
                    "keeps the format in; threads ignored), e.g. '{\"q4_decode\": \"vnni\"}'")
    args = ap.parse_args(argv)
    if args.rows % 16 or args.rows < 16 or args.blocks < 1 or args.threads < 1:
        ap.error("--rows must be a positive multiple of 16, --blocks and --threads positive")
    settings = Settings()
    design = EngineDesign.from_dict(json.loads(args.design))
    layout = design.layout_of(args.format.upper())
    if layout == "rows":
        ap.error(f"--design keeps {args.format.upper()} in rows (not prepacked, or a searched kernel): this bench "
                 "times the engine's own kernels over prepacked blocks")
    source = generate(design, load_model("smollm2-135m").open(Path(settings.data_dir) / "models").config) + MAIN
    flags = [f for f in FLAGS if f not in ("-shared", "-fPIC")]
    with tempfile.TemporaryDirectory(prefix="kf-matvec-rate-") as tmp:
        exe = Path(tmp) / "rate"
        build = subprocess.run([compiler(), "-x", "c", *flags, "-o", str(exe), "-", *LINK], input=source, text=True,
                               capture_output=True)
        if build.returncode != 0:
            print(build.stderr[-3000:], file=sys.stderr)
            return 2
        fmt = {"q4_1": 1, "q8_0": 2}[args.format]
        run = subprocess.run([str(exe), str(fmt), str(args.rows), str(args.blocks), str(LAYOUTS[layout]),
                              str(args.threads)],
                             env={"OMP_NUM_THREADS": str(args.threads), **design_env(design.at_threads(args.threads))},
                             capture_output=True, text=True, timeout=600, check=True)
    rates = {k: float(v) for k, v in (line.split() for line in run.stdout.splitlines())}
    read = measure_read_bandwidth(get_target("cpu", Settings(threads=args.threads)), args.threads)
    print(f"{args.format} {args.rows}x{args.blocks} blocks ({layout}, {design.design_id()}), engine decode matvec "
          f"on {args.threads} thread{'s' if args.threads > 1 else ''}: from cache "
          f"{rates['cache']:.2f} GB/s, streamed {rates['streamed']:.2f} GB/s; the read probe {read:.2f} GB/s "
          f"(cache/read {rates['cache'] / read:.2f}, streamed/read {rates['streamed'] / read:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
