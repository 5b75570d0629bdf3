"""The C side of an exported engine (kfactory/engines/export.py): NAME.h, the Makefile and NAME_example.c.

The header declares the ABI v1 functions (docs/engines.md) under NAME_ (the source is renamed to match, so two
exported engines link into one program), the weights file's header and entry (kfactory/engines/export_runtime.py
documents the file), and the design's constants. The Makefile builds libNAME.so with the flags the campaign
built and verified the engine with (kfactory.engines.build), and the example program. `@NAME@` in the texts
below is the export's name.
"""
from __future__ import annotations

import json
import re
import shlex

HEADER = r"""/* @NAME@.h: an inference engine exported by kfactory (ABI version 1).
 *
 * model @MODEL@, design @DESIGN_ID@
 * design: @DESIGN@
 * verification: @VERDICT@
 * built with: @BUILD@
 *
 * Usage: map @NAME@.weights (see @NAME@_weights_header below; @NAME@_example.c does it), hand its tensors
 * to @NAME@_engine_new with the file's config, then prefill and decode. Tensors' data is read in place and must
 * outlive the engine. Return codes: 0 ok, -1 bad arguments, -2 a token id outside [0, vocab), -3 the context
 * capacity would be exceeded (nothing runs then); @NAME@_last_error() says why a call failed. Threads: pass
 * @NAME@_THREADS (the design's); OpenMP reads its environment when the library loads: set OMP_WAIT_POLICY to
 * @NAME@_OMP_WAIT_POLICY and GOMP_SPINCOUNT to @NAME@_GOMP_SPINCOUNT where they are not empty, and leave them
 * unset where they are (the design was verified and timed so).
 */
#ifndef @GUARD@
#define @GUARD@

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define @NAME@_ABI_VERSION 1
#define @NAME@_DESIGN_ID "@DESIGN_ID@"
#define @NAME@_THREADS @THREADS@
#define @NAME@_OMP_WAIT_POLICY "@WAIT@"
#define @NAME@_GOMP_SPINCOUNT "@SPINS@"
#define @NAME@_VOCAB @VOCAB@
#define @NAME@_CONTEXT_LENGTH @CONTEXT@
#define @NAME@_EOS_ID @EOS@

/* format: 0 F32, 1 Q4_1, 2 Q8_0; layout: 0 ROWS, 1 PACK4, 2 PACK16 (docs/engines.md) */
typedef struct { const char *name; int32_t format, layout, rows, cols; const void *data; } @NAME@_tensor;
typedef struct { int32_t blocks, hidden, heads, kv_heads, head_dim, ffn, vocab; float rope_base, rms_eps; }
    @NAME@_config;

void *@NAME@_engine_new(const @NAME@_tensor *tensors, int n_tensors, const @NAME@_config *cfg,
                        int ctx_capacity, int threads);
int @NAME@_prefill(void *e, const int32_t *tokens, int n, float *logits, int all_logits);
int @NAME@_decode_step(void *e, int32_t token, float *logits);
void @NAME@_reset(void *e);
int @NAME@_position(void *e);
void @NAME@_engine_free(void *e);
int @NAME@_abi_version(void);
const char *@NAME@_design_id(void);
const char *@NAME@_last_error(void);

/* @NAME@.weights (little-endian): this header, n_tensors entries, the tensors' bytes at 64-aligned offsets */
typedef struct {
  char magic[8];                  /* "KFENGW01" */
  uint32_t file_version, abi_version, n_tensors, reserved;
  char design_id[64];             /* must equal @NAME@_design_id() */
  @NAME@_config config;
  uint32_t pad;
} @NAME@_weights_header;
typedef struct {
  char name[64];
  int32_t format, layout, rows, cols;
  uint64_t offset, nbytes;        /* from the start of the file */
} @NAME@_weights_entry;

#ifdef __cplusplus
}
#endif
#endif
"""

EXAMPLE = r"""/* @NAME@_example: map @NAME@.weights, prefill the token ids given, greedy-decode N tokens
 * (the lowest id on a tie), print the N ids on one line.
 * usage: ./@NAME@_example @NAME@.weights N ID [ID ...] */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "@NAME@.h"

_Static_assert(sizeof(@NAME@_weights_header) == 128, "weights header layout");
_Static_assert(sizeof(@NAME@_weights_entry) == 96, "weights entry layout");

static int fail(const char *what, const char *why) {
  fprintf(stderr, "@NAME@_example: %s: %s\n", what, why);
  return 1;
}

/* the whole of `s` as a decimal integer in [lo, hi] (atoi read "abc" as 0 and "3x" as 3) */
static int whole_number(const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (end == s || *end != '\0' || errno == ERANGE || v < lo || v > hi) return 0;
  *out = v;
  return 1;
}

int main(int argc, char **argv) {
  if (argc < 4) return fail("usage", "@NAME@_example WEIGHTS N ID [ID ...]");
  long n_new = 0;
  int n_prompt = argc - 3;
  if (!whole_number(argv[2], 1, 1L << 20, &n_new)) return fail("N", "must be a whole number of tokens, at least 1");
  int fd = open(argv[1], O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) return fail(argv[1], "cannot be opened");
  const uint8_t *file = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (file == MAP_FAILED || (size_t)st.st_size < sizeof(@NAME@_weights_header))
    return fail(argv[1], "cannot be mapped");
  @NAME@_weights_header h;
  memcpy(&h, file, sizeof h);
  if (memcmp(h.magic, "KFENGW01", 8) != 0 || h.abi_version != @NAME@_ABI_VERSION)
    return fail(argv[1], "not an ABI 1 weights file");
  if (strncmp(h.design_id, @NAME@_design_id(), sizeof h.design_id) != 0)
    return fail(argv[1], "prepared for another design");
  @NAME@_tensor *tensors = calloc(h.n_tensors, sizeof *tensors);
  @NAME@_weights_entry *entries = calloc(h.n_tensors, sizeof *entries);
  if (!tensors || !entries) return fail("memory", "out of memory");
  for (uint32_t i = 0; i < h.n_tensors; i++) {
    memcpy(&entries[i], file + sizeof h + i * sizeof *entries, sizeof *entries);
    if (entries[i].offset + entries[i].nbytes > (uint64_t)st.st_size) return fail(argv[1], "truncated");
    tensors[i] = (@NAME@_tensor){entries[i].name, entries[i].format, entries[i].layout, entries[i].rows,
                                 entries[i].cols, file + entries[i].offset};
  }
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)n_prompt);
  float *logits = malloc(sizeof(float) * (size_t)h.config.vocab);
  if (!ids || !logits) return fail("memory", "out of memory");
  for (int i = 0; i < n_prompt; i++) {
    long id;
    if (!whole_number(argv[3 + i], 0, (long)h.config.vocab - 1, &id))
      return fail(argv[3 + i], "is no token id (a whole number from 0 to the vocabulary's size less one)");
    ids[i] = (int32_t)id;
  }
  void *e = @NAME@_engine_new(tensors, (int)h.n_tensors, &h.config, (int)(n_prompt + n_new), @NAME@_THREADS);
  if (!e) return fail("@NAME@_engine_new", @NAME@_last_error());
  if (@NAME@_prefill(e, ids, n_prompt, logits, 0) != 0) return fail("@NAME@_prefill", @NAME@_last_error());
  for (int step = 0; step < n_new; step++) {
    int32_t best = 0;
    for (int32_t v = 1; v < h.config.vocab; v++)
      if (logits[v] > logits[best]) best = v;
    printf(step ? " %d" : "%d", best);
    if (step + 1 < n_new && @NAME@_decode_step(e, best, logits) != 0)
      return fail("@NAME@_decode_step", @NAME@_last_error());
  }
  printf("\n");
  @NAME@_engine_free(e);
  return 0;
}
"""

MAKEFILE = """# An inference engine exported by kfactory (@MODEL@, design @DESIGN_ID@).
# `make` builds lib@NAME@.so with the flags the engine was built and verified with, and @NAME@_example;
# `make run` prints N=8 greedy tokens after the ids in IDS. CC picks the compiler (default cc).
FLAGS = @FLAGS@
LINK = @LINK@
N ?= 8
IDS ?= @IDS@

all: lib@NAME@.so @NAME@_example

@OBJECT_RULES@lib@NAME@.so: @NAME@.c@OBJECTS@
\t$(CC) -x c $(FLAGS) -o .$@.tmp @NAME@.c -x none@OBJECTS@ $(LINK) && mv -f .$@.tmp $@

@NAME@_example: @NAME@_example.c @NAME@.h lib@NAME@.so
\t$(CC) -O2 -o $@ @NAME@_example.c -L. -l@NAME@ -Wl,-rpath,'$$ORIGIN'

run: @NAME@_example
\tenv -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT @OMPENV@ ./@NAME@_example @NAME@.weights $(N) $(IDS)

clean:
\trm -f lib@NAME@.so @NAME@_example@OBJECTS@

.PHONY: all run clean
"""


def fill(template: str, values: dict[str, str]) -> str:
    """`template` with every @KEY@ replaced by values[KEY]; a placeholder left over is a bug here."""
    out = template
    for key, value in values.items():
        out = out.replace(f"@{key}@", value)
    left = re.findall(r"@[A-Z_]+@", out)
    if left:
        raise ValueError(f"placeholders of the export templates left unfilled: {sorted(set(left))}")
    return out


def header_text(values: dict[str, str]) -> str:
    return fill(HEADER, {**values, "GUARD": f"{values['NAME'].upper()}_ENGINE_H"})


def example_text(values: dict[str, str]) -> str:
    return fill(EXAMPLE, values)


def makefile_text(values: dict[str, str], flags: tuple[str, ...], link: tuple[str, ...], ids: list[int],
                  object_steps: list[list[str]] | None = None) -> str:
    """The Makefile; `object_steps`: the commands that make the linked op kernels' objects (pairs: compile, then
    objcopy), each pair becoming one rule for its object."""
    rules, objects = [], []
    steps = object_steps or []
    for compile_step, localise in zip(steps[::2], steps[1::2]):
        obj, src = compile_step[compile_step.index("-o") + 1], compile_step[-1]
        cmd = shlex.join(compile_step[1:])
        rules.append(f"{obj}: {src}\n\t$(CC) {cmd} && {shlex.join(localise)}\n\n")
        objects.append(obj)
    return fill(MAKEFILE, {**values, "FLAGS": shlex.join(flags), "LINK": shlex.join(link),
                           "IDS": " ".join(str(i) for i in ids), "OBJECT_RULES": "".join(rules),
                           "OBJECTS": "".join(f" {o}" for o in objects)})


def c_comment(value: object) -> str:
    """`value` as text safe inside a C block comment."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text.replace("*/", "* /")
