/* ---- matmul.c: y = W x for a tile of tokens, W in any format and layout, dequantised in the kernel ------
 * y[t*ldy + r] = sum_c W[r][c] * x[t*ldx + c], t < n, r < rows. Quantised blocks are never expanded to
 * memory: a Q4_1 row dot product is sum_b d_b * (q_b . x_b) + m_b * sum(x_b) (the block sums of x are taken
 * once per call), Q8_0's is sum_b d_b * (q_b . x_b); every sum is fp32. Rows are split into chunks of
 * KF_RCHUNK across threads; inside a chunk the tokens go in tiles of KF_TT so that a tile of x stays in L1
 * while the chunk's rows pass over it (prefill), and each unpacked block serves the whole tile. */
#define KF_TT 4      /* tokens per tile, ROWS layout (4 accumulators) */
#define KF_TT4 2     /* tokens per tile, PACK4 F32 (4 rows x 2 tokens = 8 accumulators) */
#define KF_RCHUNK 16 /* rows per unit of work */
/* multiply-adds below which a product runs on one thread: waking the team costs more than it saves (and far
 * more when the host is oversubscribed and a woken thread waits for a core) */
#define KF_PAR_MIN 32768.0
/* bytes ahead of the block being read that a decode kernel asks the cache for: the hardware prefetcher alone
 * left a streamed matvec at ~8.5 GB/s of the core's 15 GB/s read rate; 2.5-32 KB ahead measured 5-15% faster
 * (past the end of a matrix the hint reads nothing harmful: a prefetch never faults) */
#define KF_PREFETCH 4096

static inline int block_bytes(int format) { return format == KF_Q4_1 ? 20 : 34; }
static inline int pack_bytes(int format) { return format == KF_Q4_1 ? 80 : format == KF_Q8_0 ? 136 : 128; }
/* bytes of a PACK16 group's block (16 rows): Q4_1 320, Q8_0 544 (common.c's layout comment), and where block b of
 * row r's group starts */
static inline int pack16_bytes(int format) { return format == KF_Q4_1 ? 320 : 544; }
static inline const uint8_t *pack16_block(const kf_tensor *w, int r, int b) {
  return (const uint8_t *)w->data + ((size_t)(r / 16) * (w->cols / 32) + b) * pack16_bytes(w->format);
}

/* Element values of block b of row r (any format and layout): the scalar path, and the embedding lookup. */
static void dequant_block(const kf_tensor *w, int r, int b, float out[32]) {
  const uint8_t *base = (const uint8_t *)w->data;
  int nb = w->cols / 32;
  if (w->format == KF_F32) {
    if (w->layout == KF_ROWS) { memcpy(out, (const float *)base + (size_t)r * w->cols + 32 * b, 128); return; }
    const float *g = (const float *)base + (size_t)(r / 4) * 4 * w->cols;
    for (int k = 0; k < 4; k++) memcpy(out + 8 * k, g + (size_t)(4 * b + k) * 32 + (r % 4) * 8, 32);
    return;
  }
  if (w->layout == KF_PACK16 && w->format == KF_Q8_0) {  /* row r%16 of the group: codes + 128 by 4-element lanes */
    const uint8_t *blk = pack16_block(w, r, b);
    int i = r % 16;
    float d16 = f16(rd16(blk + 2 * i));
    for (int c = 0; c < 8; c++)
      for (int k = 0; k < 4; k++) out[4 * c + k] = d16 * (float)((int)blk[32 + 64 * c + 4 * i + k] - 128);
    return;
  }
  if (w->layout == KF_PACK16) {  /* Q4_1: row r%16 of the group, codes by 4-element lanes */
    const uint8_t *blk = pack16_block(w, r, b);
    int i = r % 16;
    float d16 = f16(rd16(blk + 2 * i)), m16 = f16(rd16(blk + 32 + 2 * i));
    for (int c = 0; c < 4; c++)
      for (int k = 0; k < 4; k++) {
        unsigned q = blk[64 + 64 * c + 4 * i + k];
        out[8 * c + k] = fmaf(d16, (float)(q & 15), m16);
        out[8 * c + 4 + k] = fmaf(d16, (float)(q >> 4), m16);
      }
    return;
  }
  float d, m = 0.0f;
  const uint8_t *qs;
  if (w->layout == KF_ROWS) {
    const uint8_t *blk = base + ((size_t)r * nb + b) * block_bytes(w->format);
    d = f16(rd16(blk));
    if (w->format == KF_Q4_1) { m = f16(rd16(blk + 2)); qs = blk + 4; } else { qs = blk + 2; }
  } else {
    const uint8_t *blk = base + ((size_t)(r / 4) * nb + b) * pack_bytes(w->format);
    d = f16(rd16(blk + 2 * (r % 4)));
    if (w->format == KF_Q4_1) { m = f16(rd16(blk + 8 + 2 * (r % 4))); qs = blk + 16 + 16 * (r % 4); }
    else { qs = blk + 8 + 32 * (r % 4); }
  }
  if (w->format == KF_Q4_1 && w->layout == KF_ROWS) {
    for (int j = 0; j < 16; j++) { out[j] = d * (float)(qs[j] & 15) + m; out[j + 16] = d * (float)(qs[j] >> 4) + m; }
  } else if (w->format == KF_Q4_1) {  /* PACK4: element 8k+i is nibble k of u16 lane i */
    for (int i = 0; i < 8; i++) {
      unsigned lane = (unsigned)qs[2 * i] | (unsigned)qs[2 * i + 1] << 8;
      for (int k = 0; k < 4; k++) out[8 * k + i] = d * (float)((lane >> (4 * k)) & 15) + m;
    }
  } else {
    for (int j = 0; j < 32; j++) out[j] = d * (float)(int8_t)qs[j];
  }
}

static void get_row(const kf_tensor *w, int r, float *out) {
  for (int b = 0; b < w->cols / 32; b++) dequant_block(w, r, b, out + 32 * b);
}

/* Rows [r0, r1), tokens [0, n): the portable path (also the reference for the vector kernels' layouts). */
static __attribute__((unused)) void rows_scalar(const kf_tensor *w, int r0, int r1, const float *x, int ldx, int n, float *y, int ldy) {
  float blk[32];
  int nb = w->cols / 32;
  for (int r = r0; r < r1; r++)
    for (int t = 0; t < n; t++) {
      float s = 0.0f;
      for (int b = 0; b < nb; b++) { dequant_block(w, r, b, blk); s += dot(blk, x + (size_t)t * ldx + 32 * b, 32); }
      y[(size_t)t * ldy + r] = s;
    }
}

#ifdef __AVX2__
/* the 32 values q_j of a Q4_1 block as 4 x 8 floats (j < 16 low nibbles, j >= 16 high nibbles) */
#define Q4_UNPACK(qs, w0, w1, w2, w3) do {                                              \
    const __m128i m4_ = _mm_set1_epi8(0x0F);                                            \
    __m128i q_ = _mm_loadu_si128((const __m128i *)(qs));                                \
    __m128i lo_ = _mm_and_si128(q_, m4_), hi_ = _mm_and_si128(_mm_srli_epi16(q_, 4), m4_); \
    w0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo_));                                 \
    w1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(lo_, lo_)));       \
    w2 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi_));                                 \
    w3 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(hi_, hi_)));       \
  } while (0)
/* the same from PACK4's nibble order (u16 lane i holds q_{8k+i} at bits 4k): one widening, then shifts and
 * masks, which run on more ports than Q4_UNPACK's byte shuffles (a quarter fewer cycles per block) */
#define Q4_UNPACK_LANES(qs, w0, w1, w2, w3) do {                                                  \
    __m256i v_ = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(qs)));                  \
    const __m256i m_ = _mm256_set1_epi32(15);                                                     \
    w0 = _mm256_cvtepi32_ps(_mm256_and_si256(v_, m_));                                            \
    w1 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v_, 4), m_));                      \
    w2 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v_, 8), m_));                      \
    w3 = _mm256_cvtepi32_ps(_mm256_srli_epi32(v_, 12));                                           \
  } while (0)
#define Q8_UNPACK(qs, w0, w1, w2, w3) do {                                                          \
    w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(qs))));        \
    w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((qs) + 8))));  \
    w2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((qs) + 16))));\
    w3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((qs) + 24))));\
  } while (0)

static inline __m256 dot32(__m256 w0, __m256 w1, __m256 w2, __m256 w3, const float *x) {
  __m256 s = _mm256_mul_ps(w0, _mm256_loadu_ps(x));
  s = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + 8), s);
  s = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x + 16), s);
  return _mm256_fmadd_ps(w3, _mm256_loadu_ps(x + 24), s);
}

#if !KF_WEIGHTS_F32
/* One row of a ROWS-layout quantised matrix against T tokens (T a constant at each call site). */
static inline __attribute__((always_inline)) void qrow(const uint8_t *row, int format, int nb, const float *x,
                                                       int ldx, const float *xs, int T, float *y, int ldy) {
  __m256 acc[KF_TT];
  float macc[KF_TT];
  for (int t = 0; t < T; t++) { acc[t] = _mm256_setzero_ps(); macc[t] = 0.0f; }
  if (format == KF_Q4_1) {
    for (int b = 0; b < nb; b++) {
      const uint8_t *blk = row + 20 * b;
      __m256 w0, w1, w2, w3, dv = _mm256_set1_ps(f16(rd16(blk)));
      float m = f16(rd16(blk + 2));
      Q4_UNPACK(blk + 4, w0, w1, w2, w3);
      for (int t = 0; t < T; t++) {
        acc[t] = _mm256_fmadd_ps(dot32(w0, w1, w2, w3, x + t * ldx + 32 * b), dv, acc[t]);
        macc[t] += m * xs[t * nb + b];
      }
    }
  } else {
    for (int b = 0; b < nb; b++) {
      const uint8_t *blk = row + 34 * b;
      __m256 w0, w1, w2, w3, dv = _mm256_set1_ps(f16(rd16(blk)));
      Q8_UNPACK(blk + 2, w0, w1, w2, w3);
      for (int t = 0; t < T; t++) acc[t] = _mm256_fmadd_ps(dot32(w0, w1, w2, w3, x + t * ldx + 32 * b), dv, acc[t]);
    }
  }
  for (int t = 0; t < T; t++) y[t * ldy] = hsum8(acc[t]) + macc[t];
}

/* A full tile of KF_TT tokens against a PACK4 group, one row at a time: each unpacked block serves the 4
 * tokens (the prefill path; decode takes qgroup, where the 4 rows share each load of x). */
static inline __attribute__((always_inline)) void qgroup_rows(const uint8_t *grp, int format, int nb,
                                                              const float *x, int ldx, const float *xs,
                                                              float *y, int ldy, int valid) {
  int pb = pack_bytes(format);
  for (int r = 0; r < valid; r++) {
    __m256 acc[KF_TT];
    float macc[KF_TT];
    for (int t = 0; t < KF_TT; t++) { acc[t] = _mm256_setzero_ps(); macc[t] = 0.0f; }
    for (int b = 0; b < nb; b++) {
      const uint8_t *blk = grp + (size_t)b * pb;
      __m256 w0, w1, w2, w3, dv = _mm256_set1_ps(f16(rd16(blk + 2 * r)));
      float m = 0.0f;
      if (format == KF_Q4_1) {
        m = f16(rd16(blk + 8 + 2 * r));
        Q4_UNPACK_LANES(blk + 16 + 16 * r, w0, w1, w2, w3);
      } else {
        Q8_UNPACK(blk + 8 + 32 * r, w0, w1, w2, w3);
      }
      for (int t = 0; t < KF_TT; t++) {
        acc[t] = _mm256_fmadd_ps(dot32(w0, w1, w2, w3, x + t * ldx + 32 * b), dv, acc[t]);
        /* Q8_0 has no m, and matmul takes no block sums for it: xs may hold anything (0 * NaN is NaN) */
        if (format == KF_Q4_1) macc[t] += m * xs[t * nb + b];
      }
    }
    for (int t = 0; t < KF_TT; t++) y[t * ldy + r] = hsum8(acc[t]) + macc[t];
  }
}

/* Decode (one token) against a PACK4 group, one kernel per format: x's block is loaded into registers once for
 * the 4 rows, and each row's scale comes from memory by broadcast (a load, no shuffle): measured 11% fewer
 * cycles per block than the generic qgroup below.
 * Q4_1's nibble k of a u16 lane is masked in place, never shifted down: the lane converts to q * 16^k, and xk
 * holds x's segment k (floats 8k..8k+7 of each block) times 16^-k (decode_scaled_x), so each product is q * x
 * exactly, as with a shift, and the sums round the same way (the engine's logits are bit-identical). Masks
 * instead of shift-and-mask save 3 of a row's 17 vector instructions; from cache, where the kernel is bound by
 * the vector ports, that measured x1.12 blocks per second. */
static inline __attribute__((always_inline)) void q4group1(const uint8_t *grp, int nb, const float *xk,
                                                           const float *xs, float *y, int valid) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  __m128 macc = _mm_setzero_ps();
  const __m256i m0 = _mm256_set1_epi32(0xF), m1 = _mm256_set1_epi32(0xF0);
  const __m256i m2 = _mm256_set1_epi32(0xF00), m3 = _mm256_set1_epi32(0xF000);
  for (int b = 0; b < nb; b++) {
    const uint8_t *blk = grp + (size_t)b * 80;
    _mm_prefetch((const char *)blk + KF_PREFETCH, _MM_HINT_T0);
    float d[4];
    _mm_storeu_ps(d, _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)blk)));
    macc = _mm_fmadd_ps(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(blk + 8))), _mm_set1_ps(xs[b]), macc);
    const float *xb = xk + 32 * b;
    __m256 x0 = _mm256_loadu_ps(xb), x1 = _mm256_loadu_ps(xb + 8);
    __m256 x2 = _mm256_loadu_ps(xb + 16), x3 = _mm256_loadu_ps(xb + 24);
#define ROW(r, acc) do {                                                                               \
    __m256i v_ = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(blk + 16 + 16 * (r))));     \
    __m256 s_ = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v_, m0)), x0);                      \
    s_ = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v_, m1)), x1, s_);                       \
    s_ = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v_, m2)), x2, s_);                       \
    s_ = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v_, m3)), x3, s_);                       \
    acc = _mm256_fmadd_ps(s_, _mm256_broadcast_ss(d + (r)), acc); } while (0)
    ROW(0, a0); ROW(1, a1); ROW(2, a2); ROW(3, a3);
#undef ROW
  }
  float m[4];
  _mm_storeu_ps(m, macc);
  __m256 accs[4] = {a0, a1, a2, a3};
  for (int r = 0; r < valid; r++) y[r] = hsum8(accs[r]) + m[r];
}

/* x scaled for q4group1: segment k of every block times 16^-k (powers of two: exact, unless x is below 2^-114
 * and turns subnormal, far below any activation a forward produces); unused where AVX-512 takes decode */
static __attribute__((unused)) void decode_scaled_x(const float *x, int cols, float *xk) {
  static const float scale[4] = {1.0f, 0x1p-4f, 0x1p-8f, 0x1p-12f};
  for (int c = 0; c < cols; c++) xk[c] = x[c] * scale[(c / 8) % 4];
}
/* x scaled as for q4group1 and laid out for q4group1_512: block b's segment k (times 16^-k) twice over, at
 * xk[64b + 16k .. 64b + 16k + 15], so one 512-bit load gives a pair of rows the segment in both halves (a
 * broadcast load of 8 floats takes a vector port on Zen 4, a plain load does not: x1.1 blocks a second) */
static __attribute__((unused)) void decode_dup_x(const float *x, int cols, float *xk) {
  static const float scale[4] = {1.0f, 0x1p-4f, 0x1p-8f, 0x1p-12f};
  for (int c = 0; c < 2 * cols; c++) xk[c] = x[(c / 64) * 32 + ((c / 16) % 4) * 8 + c % 8] * scale[(c / 16) % 4];
}

/* Block b of a Q8_0 PACK4 group for the decode kernels: its address, with the bytes KF_PREFETCH ahead asked for
 * and the 4 rows' scales d as floats. */
static inline __attribute__((always_inline)) const uint8_t *q8_block(const uint8_t *grp, int b, float d[4]) {
  const uint8_t *blk = grp + (size_t)b * 136;
  _mm_prefetch((const char *)blk + KF_PREFETCH, _MM_HINT_T0);
  _mm_prefetch((const char *)blk + KF_PREFETCH + 64, _MM_HINT_T0);
  _mm_storeu_ps(d, _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)blk)));
  return blk;
}

#ifdef __AVX512F__
/* Decode against a Q4_1 PACK4 group with 512-bit vectors (where -march=native has AVX-512; design q4_decode
 * "table"; "convert" takes q4group1_512 below): each 4-bit code
 * indexes a 16-entry table of the row's dequantised values, d*j + m for j = 0..15 (one FMA a row and block,
 * one rounding: the f32 design's weights), by vpermps, which reads only the low 4 bits of each index: so a row's
 * 16 code bytes widened to 16 lanes give the low nibbles' weights in one permute and, shifted by 4, the high
 * nibbles' in another; no mask and no conversion. x comes permuted to meet them (decode_lut_x). Per row and
 * block that is 7 vector instructions, 3 of them on the shuffle port, against q4group1's 14 on 256 bits; the
 * table's d and m are broadcast from memory (a load, not a shuffle: GCC otherwise broadcasts from a register on
 * the shuffle port, and the kernel measured x0.84-0.93 of q4group1 instead of x1.17-1.39). */
static inline __attribute__((always_inline)) void q4group1_lut(const uint8_t *grp, int nb, const float *xp,
                                                               float *y, int valid) {
  __m512 a[8];
  for (int i = 0; i < 8; i++) a[i] = _mm512_setzero_ps();
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int b = 0; b < nb; b++) {
    const uint8_t *blk = grp + (size_t)b * 80;
    _mm_prefetch((const char *)blk + KF_PREFETCH, _MM_HINT_T0);
    float dm[8];   /* d[4] then m[4] */
    _mm256_storeu_ps(dm, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk)));
    __m512 xa = _mm512_loadu_ps(xp + 32 * b), xb = _mm512_loadu_ps(xp + 32 * b + 16);
#define ROW(r) do {                                                                                       \
    __m512 d_, m_;                                                                                       \
    __asm__("vbroadcastss %1, %0" : "=v"(d_) : "m"(dm[r]));                                             \
    __asm__("vbroadcastss %1, %0" : "=v"(m_) : "m"(dm[4 + (r)]));                                       \
    __m512 t_ = _mm512_fmadd_ps(iota, d_, m_);                                                           \
    __m512i q_ = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 16 + 16 * (r))));         \
    a[2 * (r)] = _mm512_fmadd_ps(_mm512_permutexvar_ps(q_, t_), xa, a[2 * (r)]);                        \
    a[2 * (r) + 1] = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(q_, 4), t_), xb,          \
                                     a[2 * (r) + 1]); } while (0)
    ROW(0); ROW(1); ROW(2); ROW(3);
#undef ROW
  }
  /* reduced at constant indices first: a loop to `valid` over a[] kept the accumulators in memory, stored on
   * every block (8 stores of 64 bytes a group, which halved the kernel's rate) */
  float s[4];
  for (int r = 0; r < 4; r++) s[r] = _mm512_reduce_add_ps(_mm512_add_ps(a[2 * r], a[2 * r + 1]));
  for (int r = 0; r < valid; r++) y[r] = s[r];
}

/* Decode against a Q4_1 PACK4 group with 512-bit vectors, two rows to a vector (design q4_decode "convert"):
 * rows r and r+1's 16 code bytes widened from u16 to u32 lanes (lanes 0-7 row r, 8-15 row r+1) and masked in
 * place as in q4group1 (nibble k converts to q * 16^k against x's segment k times 16^-k: decode_dup_x), the
 * pair's scales d put in the halves by one permute, and the mins added as m times the block's sum of x. A block
 * costs 4 shuffles (2 widenings, 2 permutes) and ~30 vector instructions against q4group1_lut's 12 shuffles
 * (8 of them 512-bit permutes): on a Zen 4 (whose 512-bit shuffles, by these rates, hold their port for two
 * cycles) 1.3x the blocks a second from cache and 1.22x decode tok/s end to end (docs/engines.md). */
static inline __attribute__((always_inline)) void q4group1_512(const uint8_t *grp, int nb, const float *xk,
                                                               const float *xs, float *y, int valid) {
  __m512 a01 = _mm512_setzero_ps(), a23 = a01;
  __m128 macc = _mm_setzero_ps();
  const __m512i m0 = _mm512_set1_epi32(0xF), m1 = _mm512_set1_epi32(0xF0);
  const __m512i m2 = _mm512_set1_epi32(0xF00), m3 = _mm512_set1_epi32(0xF000);
  const __m512i lo = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const __m512i hi = _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  for (int b = 0; b < nb; b++) {
    const uint8_t *blk = grp + (size_t)b * 80;
    _mm_prefetch((const char *)blk + KF_PREFETCH, _MM_HINT_T0);
    __m512 d = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)blk)));
    macc = _mm_fmadd_ps(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(blk + 8))), _mm_set1_ps(xs[b]), macc);
    const float *xb = xk + 64 * b;
    __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
    __m512 x2 = _mm512_loadu_ps(xb + 32), x3 = _mm512_loadu_ps(xb + 48);
#define Q(v, m) _mm512_cvtepi32_ps(_mm512_and_si512(v, m))
#define PAIR(r, acc, idx) do {                                                                              \
    __m512i v_ = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(blk + 16 + 16 * (r))));         \
    __m512 s_ = _mm512_mul_ps(Q(v_, m0), x0);                                                                \
    s_ = _mm512_fmadd_ps(Q(v_, m1), x1, s_);                                                                 \
    s_ = _mm512_fmadd_ps(Q(v_, m2), x2, s_);                                                                 \
    s_ = _mm512_fmadd_ps(Q(v_, m3), x3, s_);                                                                 \
    acc = _mm512_fmadd_ps(s_, _mm512_permutexvar_ps(idx, d), acc); } while (0)
    PAIR(0, a01, lo); PAIR(2, a23, hi);
#undef PAIR
#undef Q
  }
  float m[4], s[4];
  _mm_storeu_ps(m, macc);
  /* the upper halves through a 64-bit extract: AVX512F's own (extractf32x8 needs AVX512DQ) */
#define UPPER(a) _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1))
  s[0] = hsum8(_mm512_castps512_ps256(a01));
  s[1] = hsum8(UPPER(a01));
  s[2] = hsum8(_mm512_castps512_ps256(a23));
  s[3] = hsum8(UPPER(a23));
#undef UPPER
  for (int r = 0; r < valid; r++) y[r] = s[r] + m[r];
}

/* x permuted for q4group1_lut, block by block: byte j of a row's codes (PACK4: u16 lane i holds elements
 * i, 8+i, 16+i, 24+i in its nibbles, low byte first) holds element lo(j) in its low nibble and lo(j) + 8 in its
 * high one, lo(j) = j/2 for even j and 16 + (j-1)/2 for odd j; so xp[32b + j] = x[32b + lo(j)] and
 * xp[32b + 16 + j] = x[32b + lo(j) + 8] */
static void decode_lut_x(const float *x, int cols, float *xp) {
  for (int b = 0; b < cols / 32; b++)
    for (int j = 0; j < 16; j++) {
      int lo = j % 2 == 0 ? j / 2 : 16 + (j - 1) / 2;
      xp[32 * b + j] = x[32 * b + lo];
      xp[32 * b + 16 + j] = x[32 * b + lo + 8];
    }
}

/* Decode against a Q8_0 PACK4 group with 512-bit vectors: a row's block is two widenings and conversions of 16
 * codes, a multiply and two FMAs (7 instructions against q8group1's 13); d broadcast from memory as in
 * q4group1_lut. */
static inline __attribute__((always_inline)) void q8group1_512(const uint8_t *grp, int nb, const float *x, float *y,
                                                               int valid) {
  __m512 a[4];
  for (int i = 0; i < 4; i++) a[i] = _mm512_setzero_ps();
  for (int b = 0; b < nb; b++) {
    float d[4];
    const uint8_t *blk = q8_block(grp, b, d);
    __m512 x0 = _mm512_loadu_ps(x + 32 * b), x1 = _mm512_loadu_ps(x + 32 * b + 16);
#define ROW(r) do {                                                                                       \
    const uint8_t *q_ = blk + 8 + 32 * (r);                                                              \
    __m512 d_;                                                                                           \
    __asm__("vbroadcastss %1, %0" : "=v"(d_) : "m"(d[r]));                                              \
    __m512 s_ = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q_))), x0); \
    s_ = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q_ + 16)))), x1, s_); \
    a[r] = _mm512_fmadd_ps(s_, d_, a[r]); } while (0)
    ROW(0); ROW(1); ROW(2); ROW(3);
#undef ROW
  }
  float s[4];   /* constant indices first, as in q4group1_lut */
  for (int r = 0; r < 4; r++) s[r] = _mm512_reduce_add_ps(a[r]);
  for (int r = 0; r < valid; r++) y[r] = s[r];
}
#endif

static inline __attribute__((always_inline)) void q8group1(const uint8_t *grp, int nb, const float *x, float *y,
                                                           int valid) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int b = 0; b < nb; b++) {
    float d[4];
    const uint8_t *blk = q8_block(grp, b, d);
    const float *xb = x + 32 * b;
    __m256 x0 = _mm256_loadu_ps(xb), x1 = _mm256_loadu_ps(xb + 8);
    __m256 x2 = _mm256_loadu_ps(xb + 16), x3 = _mm256_loadu_ps(xb + 24);
#define ROW(r, acc) do {                                                                                  \
    const uint8_t *q_ = blk + 8 + 32 * (r);                                                              \
    __m256 s_ = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q_))), x0); \
    s_ = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q_ + 8)))), x1, s_); \
    s_ = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q_ + 16)))), x2, s_); \
    s_ = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q_ + 24)))), x3, s_); \
    acc = _mm256_fmadd_ps(s_, _mm256_broadcast_ss(d + (r)), acc); } while (0)
    ROW(0, a0); ROW(1, a1); ROW(2, a2); ROW(3, a3);
#undef ROW
  }
  __m256 accs[4] = {a0, a1, a2, a3};
  for (int r = 0; r < valid; r++) y[r] = hsum8(accs[r]);
}

#else
/* F32, ROWS: one row against T tokens (two accumulators per token: the FMA latency is not the limit) */
static inline __attribute__((always_inline)) void frow(const float *row, int cols, const float *x, int ldx, int T,
                                                       float *y, int ldy) {
  __m256 a0[KF_TT], a1[KF_TT];
  for (int t = 0; t < T; t++) { a0[t] = _mm256_setzero_ps(); a1[t] = _mm256_setzero_ps(); }
  for (int c = 0; c < cols; c += 16) {
    __m256 w0 = _mm256_loadu_ps(row + c), w1 = _mm256_loadu_ps(row + c + 8);
    for (int t = 0; t < T; t++) {
      a0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * ldx + c), a0[t]);
      a1[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + t * ldx + c + 8), a1[t]);
    }
  }
  for (int t = 0; t < T; t++) y[t * ldy] = hsum8(_mm256_add_ps(a0[t], a1[t]));
}

/* F32, PACK4: 4 rows interleaved by 8 columns, against T tokens */
static inline __attribute__((always_inline)) void fgroup(const float *grp, int cols, const float *x, int ldx,
                                                         int T, float *y, int ldy, int valid) {
  __m256 acc[4][KF_TT4];
  for (int t = 0; t < T; t++)
    for (int r = 0; r < 4; r++) acc[r][t] = _mm256_setzero_ps();
  for (int c = 0; c < cols; c += 8) {
    const float *g = grp + (size_t)c * 4;
    for (int t = 0; t < T; t++) {
      __m256 xv = _mm256_loadu_ps(x + t * ldx + c);
      for (int r = 0; r < 4; r++) acc[r][t] = _mm256_fmadd_ps(_mm256_loadu_ps(g + 8 * r), xv, acc[r][t]);
    }
  }
  for (int t = 0; t < T; t++)
    for (int r = 0; r < valid; r++) y[t * ldy + r] = hsum8(acc[r][t]);
}
#endif

#if KF_Q4_VNNI
#if !(defined(__AVX512VNNI__) && defined(__AVX512BW__))
#error "design q4_decode vnni needs AVX512-VNNI and AVX512BW (-march=native on this processor has not)"
#endif
#if !KF_PREFILL_GEMM
#error "design q4_decode vnni needs prefill gemm (the VNNI rows path takes fewer than KF_GEMM_MIN tokens)"
#endif
/* floats of one token's digits for the integer kernels: KF_VNNI_DIGITS x 32 bytes a block, the block's scale,
 * and 4 int32 slots for its digit sums (q8group16_vnni's) */
#ifndef KF_VNNI_DIGITS
#define KF_VNNI_DIGITS 4
#endif
#if KF_VNNI_DIGITS != 3 && KF_VNNI_DIGITS != 4
#error "KF_VNNI_DIGITS is 3 (q4_decode vnni24) or 4 (vnni)"
#endif
#define KF_VNNI_FLOATS(nb) ((8 * KF_VNNI_DIGITS + 5) * (nb))

/* The power-of-two grid a block of 32 values (v0, v1) is rounded to `bits` bits on: with max|x| < 2^e, the scale
 * *s = 2^(e-bits) and *inv = 2^(bits-e), so |x * inv| <= 2^bits (e >= bits - 126 keeps both normal floats:
 * -98 at 28 bits, -103 at 23; smaller blocks round on that grid). 0 for a block of zeros (*s 0) or one holding an infinity or a NaN (*s NaN: the
 * products are then NaN as an fp32 dot product's would be), 1 otherwise. */
static inline int block_grid(__m512 v0, __m512 v1, int bits, float *inv, float *s) {
  __m512 a0 = _mm512_abs_ps(v0), a1 = _mm512_abs_ps(v1), big = _mm512_set1_ps(FLT_MAX);
  /* an infinity or a NaN (a max would drop a NaN): not <= FLT_MAX, unordered counting as true */
  int bad = (_mm512_cmp_ps_mask(a0, big, _CMP_NLE_UQ) | _mm512_cmp_ps_mask(a1, big, _CMP_NLE_UQ)) != 0;
  float mx = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
  if (mx == 0.0f || bad) {
    *s = bad ? NAN : 0.0f;
    return 0;
  }
  uint32_t mx_bits;
  memcpy(&mx_bits, &mx, 4);
  int e = (int)(mx_bits >> 23) - 126 < bits - 126 ? bits - 126 : (int)(mx_bits >> 23) - 126;
  uint32_t inv_bits = (uint32_t)(127 + bits - e) << 23, sc_bits = (uint32_t)(127 + e - bits) << 23;
  memcpy(inv, &inv_bits, 4);
  memcpy(s, &sc_bits, 4);
  return 1;
}

#if KF_VNNI_DIGITS == 3
/* x as the vnni24 kernels read it (design q4_decode "vnni24"): block b's 32 values as integers v = round(x / s_b)
 * on the block's power-of-two grid s_b = 2^(e-23), max|x_b| < 2^e, so |v| <= 2^23: the block rounded to 24 bits,
 * as fp32 rounds its largest value (at most one fp32 ulp of it, 2^-24 of 2^e). v = A 2^16 + B 2^8 + C with A
 * signed (-128..127) and B, C unsigned bytes (0..255): the kernels multiply A as vpdpbusd's signed operand against
 * the codes, and B and C as its unsigned one against the codes taken as signed (Q4_1's 0..15 as they are, Q8_0's
 * with their +128 flipped off), so each byte carries 8 bits and three digits do the work of vnni's four. Stored
 * A[32] B[32] C[32] at 96 bytes a block, then the scales s_b as floats, then each block's sum of its A digits
 * (int32, for q8group16_vnni) in a slot of 4. Zeros and non-finite blocks: block_grid. */
static void vnni_digits(const float *x, int cols, float *xq) {
  int nb = cols / 32;
  int8_t *dg = (int8_t *)xq;
  float *sc = xq + 24 * nb;
  int32_t *ts = (int32_t *)(xq + 25 * nb);
  const __m512i top = _mm512_set1_epi32((1 << 23) - 1), bottom = _mm512_set1_epi32(-(1 << 23));
  const __m512i low8 = _mm512_set1_epi32(255);
  for (int b = 0; b < nb; b++) {
    __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
    float inv;
    memset(ts + 4 * b, 0, 16);
    if (!block_grid(v0, v1, 23, &inv, &sc[b])) {
      memset(dg + 96 * b, 0, 96);
      continue;
    }
    __m512 iv = _mm512_set1_ps(inv);
    __m512i sum = _mm512_setzero_si512();
    for (int h = 0; h < 2; h++) {
      __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(h ? v1 : v0, iv));   /* exact product, rounded to nearest */
      q = _mm512_max_epi32(_mm512_min_epi32(q, top), bottom);
      int8_t *o = dg + 96 * b + 16 * h;
      __m512i a = _mm512_srai_epi32(q, 16);
      sum = _mm512_add_epi32(sum, a);
      _mm_storeu_si128((__m128i *)o, _mm512_cvtepi32_epi8(a));
      _mm_storeu_si128((__m128i *)(o + 32), _mm512_cvtepi32_epi8(_mm512_and_si512(_mm512_srli_epi32(q, 8), low8)));
      _mm_storeu_si128((__m128i *)(o + 64), _mm512_cvtepi32_epi8(_mm512_and_si512(q, low8)));
    }
    ts[4 * b] = _mm512_reduce_add_epi32(sum);
  }
}
#else
/* x as q4group16_vnni reads it (design q4_decode "vnni"): block b's 32 values as integers v = round(x / s_b) on
 * the block's own power-of-two grid, s_b = 2^(e-28) with max|x_b| < 2^e, so |v| <= 2^28 (29 bits: the rounding
 * is at most s_b/2 = 2^-29 of 2^e, below fp32's half ulp of the block's largest value, 2^-25 of 2^e; three such
 * digits, 22 bits, measured decode logits 6x further from the reference than fp32's on tiny-llama); v split into
 * signed byte digits v = A 2^21 + B 2^14 + C 2^7 + D, A in -128..127, B, C and D in 0..127, stored A[32] B[32]
 * C[32] D[32] at 128 bytes a block, then the scales s_b as floats, then each block's sums of its A, B, C and D
 * digits as int32 (q8group16_vnni takes its codes' +128 back out with them). Zeros and non-finite blocks: block_grid. */
static void vnni_digits(const float *x, int cols, float *xq) {
  int nb = cols / 32;
  int8_t *dg = (int8_t *)xq;
  float *sc = xq + 32 * nb;
  int32_t *ts = (int32_t *)(xq + 33 * nb);
  const __m512i top = _mm512_set1_epi32((1 << 28) - 1), bottom = _mm512_set1_epi32(-(1 << 28));
  const __m512i low7 = _mm512_set1_epi32(127);
  for (int b = 0; b < nb; b++) {
    __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
    float inv;
    if (!block_grid(v0, v1, 28, &inv, &sc[b])) {
      memset(dg + 128 * b, 0, 128);
      memset(ts + 4 * b, 0, 16);
      continue;
    }
    __m512 iv = _mm512_set1_ps(inv);
    __m512i sum[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
    for (int h = 0; h < 2; h++) {
      __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(h ? v1 : v0, iv));   /* exact product, rounded to nearest */
      q = _mm512_max_epi32(_mm512_min_epi32(q, top), bottom);
      int8_t *o = dg + 128 * b + 16 * h;
      __m512i a = _mm512_srai_epi32(q, 21);
      sum[0] = _mm512_add_epi32(sum[0], a);
      _mm_storeu_si128((__m128i *)o, _mm512_cvtepi32_epi8(a));
      for (int k = 1; k < 4; k++) {
        __m512i d = _mm512_and_si512(_mm512_srli_epi32(q, 21 - 7 * k), low7);
        sum[k] = _mm512_add_epi32(sum[k], d);
        _mm_storeu_si128((__m128i *)(o + 32 * k), _mm512_cvtepi32_epi8(d));
      }
    }
    for (int k = 0; k < 4; k++) ts[4 * b + k] = _mm512_reduce_add_epi32(sum[k]);
  }
}

#endif

static inline int32_t load_i32(const int8_t *p) { int32_t v; memcpy(&v, p, 4); return v; }

#if KF_VNNI_DIGITS == 3
/* The vnni24 kernels take S groups of 16 rows side by side (S = 1 or 2, a constant where they are inlined), each
 * group its own stream of memory, all of them multiplied by the same broadcasts of x's digits. Two streams read
 * faster than one: a Zen 4 core streamed a Q4_1 matrix at 23.3-24.9 GB/s over two or four groups a pass against
 * 19.6-21.6 over one, where its read probe reads ~25 (bench/engine_matvec_rate.py), with no software prefetch
 * (which cost the two streams that gain: 20.5-21.3 at 1 KB ahead, 19.8-20.4 at 8 KB). */
#ifndef KF_VNNI_STREAMS
#define KF_VNNI_STREAMS 2
#endif
#define KF_MAX_STREAMS KF_VNNI_STREAMS

/* q4group16_vnni over vnni24's digits (vnni_digits above) for S groups g[s], rows to y[s] (valid[s] of them): per
 * chunk the codes, 0..15, are vpdpbusd's unsigned operand against A and its signed one against B and C.
 * |sum q A| <= 15 128 32 < 2^16 and sum q B < 2^17, so (sum q A) 2^8 + sum q B is exact in 32 bits and below 2^24
 * (exact as a float); that and sum q C meet in one FMA. Per block of 16 rows: 24 vpdpbusd against vnni's 32. */
static inline __attribute__((always_inline)) void q4groups_vnni(const uint8_t *const *g, int S, int nb,
                                                                const float *xq, const float *xs, float *const *y,
                                                                const int *valid) {
  const int8_t *dg = (const int8_t *)xq;
  const float *sc = xq + 24 * nb;
  __m512 acc[KF_MAX_STREAMS], macc[KF_MAX_STREAMS];
  for (int s = 0; s < S; s++) acc[s] = macc[s] = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  for (int b = 0; b < nb; b++) {
    const int8_t *xa = dg + 96 * b, *xb = xa + 32, *xc = xa + 64;
    __m512i ia[KF_MAX_STREAMS], ib[KF_MAX_STREAMS], ic[KF_MAX_STREAMS];
    for (int s = 0; s < S; s++) ia[s] = ib[s] = ic[s] = _mm512_setzero_si512();
    for (int c = 0; c < 4; c++) {
      __m512i a0 = _mm512_set1_epi32(load_i32(xa + 8 * c)), a1 = _mm512_set1_epi32(load_i32(xa + 8 * c + 4));
      __m512i b0 = _mm512_set1_epi32(load_i32(xb + 8 * c)), b1 = _mm512_set1_epi32(load_i32(xb + 8 * c + 4));
      __m512i c0 = _mm512_set1_epi32(load_i32(xc + 8 * c)), c1 = _mm512_set1_epi32(load_i32(xc + 8 * c + 4));
      for (int s = 0; s < S; s++) {
        __m512i v = _mm512_loadu_si512((const void *)(g[s] + (size_t)b * 320 + 64 + 64 * c));
        __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        ia[s] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(ia[s], lo, a0), hi, a1);
        ib[s] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(ib[s], b0, lo), b1, hi);
        ic[s] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(ic[s], c0, lo), c1, hi);
      }
    }
    __m512 sb = _mm512_set1_ps(sc[b]), xsb = _mm512_set1_ps(xs[b]);
    for (int s = 0; s < S; s++) {
      const uint8_t *blk = g[s] + (size_t)b * 320;
      __m512 q = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(ia[s], 8), ib[s])),
                                 _mm512_set1_ps(256.0f), _mm512_cvtepi32_ps(ic[s]));
      __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
      __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32)));
      acc[s] = _mm512_fmadd_ps(q, _mm512_mul_ps(d, sb), acc[s]);
      macc[s] = _mm512_fmadd_ps(m, xsb, macc[s]);
    }
  }
  for (int s = 0; s < S; s++) {
    float out[16];
    _mm512_storeu_ps(out, _mm512_add_ps(acc[s], macc[s]));
    for (int r = 0; r < valid[s]; r++) y[s][r] = out[r];
  }
}

/* q8group16_vnni over vnni24's digits for S groups: the codes are stored + 128, vpdpbusd's unsigned operand
 * against A (less 128 x the block's sum of A, as vnni's), and, their top bit flipped back to the signed codes,
 * its signed operand against B and C. (sum w A) 2^8 + sum w B is exact in 32 bits (|.| < 2^28) and rounds once
 * to a float, then meets sum w C in one FMA. Per block of 16 rows: 24 vpdpbusd and 8 xors against vnni's 32
 * vpdpbusd. */
static inline __attribute__((always_inline)) void q8groups_vnni(const uint8_t *const *g, int S, int nb,
                                                                const float *xq, float *const *y, const int *valid) {
  const int8_t *dg = (const int8_t *)xq;
  const float *sc = xq + 24 * nb;
  const int32_t *ts = (const int32_t *)(xq + 25 * nb);
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  __m512 acc[KF_MAX_STREAMS];
  for (int s = 0; s < S; s++) acc[s] = _mm512_setzero_ps();
  for (int b = 0; b < nb; b++) {
    const int8_t *xa = dg + 96 * b, *xb = xa + 32, *xc = xa + 64;
    __m512i ia[KF_MAX_STREAMS], ib[KF_MAX_STREAMS], ic[KF_MAX_STREAMS];
    for (int s = 0; s < S; s++) ia[s] = ib[s] = ic[s] = _mm512_setzero_si512();
    for (int c = 0; c < 8; c++) {
      __m512i a = _mm512_set1_epi32(load_i32(xa + 4 * c)), bd = _mm512_set1_epi32(load_i32(xb + 4 * c));
      __m512i cd = _mm512_set1_epi32(load_i32(xc + 4 * c));
      for (int s = 0; s < S; s++) {
        __m512i v = _mm512_loadu_si512((const void *)(g[s] + (size_t)b * 544 + 32 + 64 * c));
        __m512i w = _mm512_xor_si512(v, flip);
        ia[s] = _mm512_dpbusd_epi32(ia[s], v, a);
        ib[s] = _mm512_dpbusd_epi32(ib[s], bd, w);
        ic[s] = _mm512_dpbusd_epi32(ic[s], cd, w);
      }
    }
    __m512 sb = _mm512_set1_ps(sc[b]);
    __m512i fix = _mm512_set1_epi32(128 * ts[4 * b]);
    for (int s = 0; s < S; s++) {
      __m512i top = _mm512_sub_epi32(ia[s], fix);
      __m512 q = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(top, 8), ib[s])),
                                 _mm512_set1_ps(256.0f), _mm512_cvtepi32_ps(ic[s]));
      __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(g[s] + (size_t)b * 544)));
      acc[s] = _mm512_fmadd_ps(q, _mm512_mul_ps(d, sb), acc[s]);
    }
  }
  for (int s = 0; s < S; s++) {
    float out[16];
    _mm512_storeu_ps(out, acc[s]);
    for (int r = 0; r < valid[s]; r++) y[s][r] = out[r];
  }
}

/* One token's product over the PACK16 groups of rows r0..r1 (r0 a multiple of 16) in KF_VNNI_STREAMS streams:
 * the range cut in that many runs of groups, their i-th groups side by side (the groups left over, one at a
 * time, last). */
static void pack16_rows_vnni(const kf_tensor *w, int r0, int r1, const float *xq, const float *xs, float *y) {
  enum { S = KF_VNNI_STREAMS };
  int nb = w->cols / 32, groups = (r1 - r0 + 15) / 16, per = groups / S;
  const uint8_t *g[KF_MAX_STREAMS];
  float *ys[KF_MAX_STREAMS];
  int valid[KF_MAX_STREAMS];
  for (int i = 0; i < per + groups % S; i++) {
    int lone = i >= per, n = lone ? 1 : S;
    for (int s = 0; s < n; s++) {
      int r = r0 + 16 * (lone ? S * per + (i - per) : i + s * per);
      g[s] = pack16_block(w, r, 0);
      ys[s] = y + r;
      valid[s] = w->rows - r < 16 ? w->rows - r : 16;
    }
    if (w->format == KF_Q8_0) {
      if (lone) q8groups_vnni(g, 1, nb, xq, ys, valid); else q8groups_vnni(g, S, nb, xq, ys, valid);
    } else {
      if (lone) q4groups_vnni(g, 1, nb, xq, xs, ys, valid); else q4groups_vnni(g, S, nb, xq, xs, ys, valid);
    }
  }
}
#else
/* A block's four digit sums, lane by lane, as one float: (A 2^7 + B) 2^14 + (C 2^7 + D), each pair in 32-bit
 * integers and the pairs in one FMA */
static inline __attribute__((always_inline)) __m512 digit_sums(__m512i ia, __m512i ib, __m512i ic, __m512i id) {
  __m512 hi2 = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(ia, 7), ib));
  __m512 lo2 = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(ic, 7), id));
  return _mm512_fmadd_ps(hi2, _mm512_set1_ps(16384.0f), lo2);
}

/* Decode against a Q4_1 PACK16 group (design q4_decode "vnni"): 32-bit lane i is row i. A 64-byte chunk of
 * codes holds 16 rows x 4 bytes; masked, its low nibbles are the rows' codes for elements 8c..8c+3 and its high
 * ones for 8c+4..8c+7, and vpdpbusd adds each lane's 4 code x digit products to the lane's integer sum (the
 * digits of 4 elements broadcast to every lane). Four digit sums per block, combined in pairs exactly in 32 bits
 * (each pair below 2^24) and the pairs in one FMA, are q . v; the block's scale d_r s_b (a power of two apart
 * from d_r) applies once per row and block, and the mins as m_r times the block's sum of x. Per block of 16
 * rows: 4 loads, 12 mask/shift instructions, 32 vpdpbusd and ~12 more, against q4group1_512's ~60 vector
 * instructions for 16 rows: the kernel outruns a core's memory stream (docs/engines.md). The integer sums are
 * exact, so the only rounding besides fp32's is the digits', below fp32's own (vnni_digits). */
static inline __attribute__((always_inline)) void q4group16_vnni(const uint8_t *grp, int nb, const float *xq,
                                                                 const float *xs, float *y, int valid) {
  const int8_t *dg = (const int8_t *)xq;
  const float *sc = xq + 32 * nb;
  __m512 acc = _mm512_setzero_ps(), macc = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  for (int b = 0; b < nb; b++) {
    const uint8_t *blk = grp + (size_t)b * 320;
    for (int l = 0; l < 320; l += 64) _mm_prefetch((const char *)blk + KF_PREFETCH + l, _MM_HINT_T0);
    const int8_t *xa = dg + 128 * b, *xb = xa + 32, *xc = xa + 64, *xd = xa + 96;
    __m512i ia = _mm512_setzero_si512(), ib = ia, ic = ia, id = ia;
    for (int c = 0; c < 4; c++) {
      __m512i v = _mm512_loadu_si512((const void *)(blk + 64 + 64 * c));
      __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
      ia = _mm512_dpbusd_epi32(ia, lo, _mm512_set1_epi32(load_i32(xa + 8 * c)));
      ia = _mm512_dpbusd_epi32(ia, hi, _mm512_set1_epi32(load_i32(xa + 8 * c + 4)));
      ib = _mm512_dpbusd_epi32(ib, lo, _mm512_set1_epi32(load_i32(xb + 8 * c)));
      ib = _mm512_dpbusd_epi32(ib, hi, _mm512_set1_epi32(load_i32(xb + 8 * c + 4)));
      ic = _mm512_dpbusd_epi32(ic, lo, _mm512_set1_epi32(load_i32(xc + 8 * c)));
      ic = _mm512_dpbusd_epi32(ic, hi, _mm512_set1_epi32(load_i32(xc + 8 * c + 4)));
      id = _mm512_dpbusd_epi32(id, lo, _mm512_set1_epi32(load_i32(xd + 8 * c)));
      id = _mm512_dpbusd_epi32(id, hi, _mm512_set1_epi32(load_i32(xd + 8 * c + 4)));
    }
    __m512 q = digit_sums(ia, ib, ic, id);
    __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
    __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32)));
    acc = _mm512_fmadd_ps(q, _mm512_mul_ps(d, _mm512_set1_ps(sc[b])), acc);
    macc = _mm512_fmadd_ps(m, _mm512_set1_ps(xs[b]), macc);
  }
  float out[16];
  _mm512_storeu_ps(out, _mm512_add_ps(acc, macc));
  for (int r = 0; r < valid; r++) y[r] = out[r];
}

/* Decode against a Q8_0 PACK16 group (the head, design q4_decode "vnni"): lane i is row i; each 64-byte chunk holds
 * 16 rows x 4 codes stored + 128 (unsigned, as vpdpbusd's first operand wants them), and the digits of the same 4
 * elements are the signed operand. S_k = sum (w + 128) d_k less 128 x the block's digit sum T_k is sum w d_k,
 * exact in 32 bits; the pairs meet in one FMA (rounded once, as fp32) and the block's scale d_r s_b applies once.
 * 32 vpdpbusd a block of 16 rows (544 bytes), against the conversion kernel's two converts and FMAs a row:
 * at the head's 49152 x 576, one core streamed it at 24.5 GB/s against 20.6 (bench/engine_matvec_rate.py). */
static inline __attribute__((always_inline)) void q8group16_vnni(const uint8_t *grp, int nb, const float *xq, float *y,
                                                                 int valid) {
  const int8_t *dg = (const int8_t *)xq;
  const float *sc = xq + 32 * nb;
  const int32_t *ts = (const int32_t *)(xq + 33 * nb);
  __m512 acc = _mm512_setzero_ps();
  for (int b = 0; b < nb; b++) {
    const uint8_t *blk = grp + (size_t)b * 544;
    for (int l = 0; l < 544; l += 64) _mm_prefetch((const char *)blk + KF_PREFETCH + l, _MM_HINT_T0);
    const int8_t *xa = dg + 128 * b, *xb = xa + 32, *xc = xa + 64, *xd = xa + 96;
    __m512i ia = _mm512_setzero_si512(), ib = ia, ic = ia, id = ia;
    for (int c = 0; c < 8; c++) {
      __m512i v = _mm512_loadu_si512((const void *)(blk + 32 + 64 * c));
      ia = _mm512_dpbusd_epi32(ia, v, _mm512_set1_epi32(load_i32(xa + 4 * c)));
      ib = _mm512_dpbusd_epi32(ib, v, _mm512_set1_epi32(load_i32(xb + 4 * c)));
      ic = _mm512_dpbusd_epi32(ic, v, _mm512_set1_epi32(load_i32(xc + 4 * c)));
      id = _mm512_dpbusd_epi32(id, v, _mm512_set1_epi32(load_i32(xd + 4 * c)));
    }
    const int32_t *t = ts + 4 * b;
    ia = _mm512_sub_epi32(ia, _mm512_set1_epi32(128 * t[0]));
    ib = _mm512_sub_epi32(ib, _mm512_set1_epi32(128 * t[1]));
    ic = _mm512_sub_epi32(ic, _mm512_set1_epi32(128 * t[2]));
    id = _mm512_sub_epi32(id, _mm512_set1_epi32(128 * t[3]));
    __m512 q = digit_sums(ia, ib, ic, id);
    __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
    acc = _mm512_fmadd_ps(q, _mm512_mul_ps(d, _mm512_set1_ps(sc[b])), acc);
  }
  float out[16];
  _mm512_storeu_ps(out, acc);
  for (int r = 0; r < valid; r++) y[r] = out[r];
}
#endif
#endif

/* tile dispatch: the kernels above with T a compile-time constant; a full tile, else one token at a time
 * (two instances per kernel keep the build short) */
#define TILE(call_with_T, T) do { if ((T) == 1) { call_with_T(1); } else { call_with_T(FULL); } } while (0)

static void rows_avx2(const kf_tensor *w, int r0, int r1, const float *x, int ldx, int n, float *y, int ldy,
                      const float *xs, const float *xk) {
  const uint8_t *base = (const uint8_t *)w->data;
  int cols = w->cols, nb = cols / 32, fmt = w->format;
  (void)nb;
  (void)xs;
  /* the layout is the tensor's: a design may keep one format's matrices in rows (read by a searched kernel at
   * decode) while the others are PACK4 */
  if (w->layout == KF_ROWS) {
  size_t rb = fmt == KF_F32 ? (size_t)cols * 4 : (size_t)nb * block_bytes(fmt);
  for (int t0 = 0; t0 < n;) {
    int T = n - t0 >= KF_TT ? KF_TT : 1;
    const float *xt = x + (size_t)t0 * ldx;
    const float *xst = xs + (size_t)t0 * nb;
    float *yt = y + (size_t)t0 * ldy;
    (void)xst;
    for (int r = r0; r < r1; r++) {
#define FULL KF_TT
#if KF_WEIGHTS_F32
#define CALL(TC) frow((const float *)(base + r * rb), cols, xt, ldx, TC, yt + r, ldy)
#else
#define CALL(TC) qrow(base + r * rb, fmt, nb, xt, ldx, xst, TC, yt + r, ldy)
#endif
      TILE(CALL, T);
#undef CALL
#undef FULL
    }
    t0 += T;
  }
  return;
  }
#if KF_Q4_VNNI && KF_VNNI_DIGITS == 4   /* (vnni24's groups are split in matmul: pack16_rows_vnni) */
  if (w->layout == KF_PACK16) {   /* one token at a time: the digits of each are made in matmul */
    for (int t = 0; t < n; t++)
      for (int r = r0; r < r1; r += 16) {
        const float *xq = xk + (size_t)t * KF_VNNI_FLOATS(nb);
        const uint8_t *grp = pack16_block(w, r, 0);
        int valid = w->rows - r < 16 ? w->rows - r : 16;
        if (fmt == KF_Q8_0)
          q8group16_vnni(grp, nb, xq, y + (size_t)t * ldy + r, valid);
        else
          q4group16_vnni(grp, nb, xq, xs + (size_t)t * nb, y + (size_t)t * ldy + r, valid);
      }
    return;
  }
#endif
  size_t gb = fmt == KF_F32 ? (size_t)cols * 16 : (size_t)nb * pack_bytes(fmt);
  for (int t0 = 0; t0 < n;) {
#if KF_WEIGHTS_F32
    int T = n - t0 >= KF_TT4 ? KF_TT4 : 1;
#else
    int T = n - t0 >= KF_TT ? KF_TT : 1;
#endif
    const float *xt = x + (size_t)t0 * ldx;
    const float *xst = xs + (size_t)t0 * nb;
    float *yt = y + (size_t)t0 * ldy;
    (void)xst;
    for (int r = r0; r < r1; r += 4) {
      int valid = w->rows - r < 4 ? w->rows - r : 4;
#define FULL KF_TT4
#if KF_WEIGHTS_F32
#define CALL(TC) fgroup((const float *)(base + (r / 4) * gb), cols, xt, ldx, TC, yt + r, ldy, valid)
      TILE(CALL, T);
#else
#ifdef __AVX512F__
#if !KF_Q4_TABLE
      if (T == 1 && fmt == KF_Q4_1) q4group1_512(base + (r / 4) * gb, nb, xk + (size_t)(t0 - n + n % KF_TT) * 2 * cols,
                                                 xst, yt + r, valid);
#else
      if (T == 1 && fmt == KF_Q4_1) q4group1_lut(base + (r / 4) * gb, nb, xk + (size_t)(t0 - n + n % KF_TT) * cols,
                                                 yt + r, valid);
#endif
      else if (T == 1) q8group1_512(base + (r / 4) * gb, nb, xt, yt + r, valid);
#else
      if (T == 1 && fmt == KF_Q4_1) q4group1(base + (r / 4) * gb, nb, xk + (size_t)(t0 - n + n % KF_TT) * cols, xst,
                                             yt + r, valid);
      else if (T == 1) q8group1(base + (r / 4) * gb, nb, xt, yt + r, valid);
#endif
      else qgroup_rows(base + (r / 4) * gb, fmt, nb, xt, ldx, xst, yt + r, ldy, valid);
#endif
#undef CALL
#undef FULL
    }
    t0 += T;
  }
}
#endif

/* ---- prefill as a GEMM (KF_PREFILL_GEMM, AVX2): Y[t][r] = sum_c X[t][c] W[r][c] over many tokens ---------
 * The tiled kernels above unpack every block once per 4 tokens and end each dot product in a horizontal sum;
 * here a panel of KF_GR rows is dequantised once (w = d*q + m in fp32, one rounding, as the f32 design's load
 * does) into a row-major float buffer and then serves every token of the call. The tokens are vectorised: X is
 * packed once per call as tiles of 16 tokens, [tile][c][16], so the micro-kernel multiplies a broadcast weight
 * by 16 tokens' values: 6 rows x 2 vectors = 12 accumulators, 12 FMAs per column against 2 loads and 6
 * broadcasts, no horizontal sum. A tile's last tokens are zeros (a tail of at most 8 tokens takes the 1-vector
 * kernel); a panel past the last row is zeros and is not stored. Rows of panels are split over threads. */
#ifdef __AVX512F__
#define KF_GR 12         /* rows per panel: 12 accumulators of 16 tokens, so one load of a tile's column serves 12 FMAs */
#else
#define KF_GR 6          /* rows per panel (6 x 2 accumulators + 2 token vectors + 1 broadcast = 15 registers) */
#endif
#define KF_GT 16         /* tokens per packed tile (2 vectors) */
/* tokens from which a product takes the GEMM; fewer run the tiled kernels (decode among them): at 8 tokens a
 * panel's dequantisation serves too few tokens and the tiled kernels measured 1.2x faster, at 12 the GEMM 1.1x */
#define KF_GEMM_MIN 12

/* scratch floats a call of matmul needs for up to max_n tokens on `threads` threads: Q4_1 block sums (tiled
 * path) or the packed tokens and one panel per thread (GEMM), plus room to align to 64 bytes */
static size_t matmul_scratch_floats(int max_n, int threads) {
  /* block sums of every token, then x scaled for q4group1 for the tokens that take it (decode_tokens), twice
   * over for q4group1_512 (decode_dup_x) */
  size_t sums = (size_t)max_n * (KF_MAXCOLS / 32 + 1) + (size_t)(KF_TT - 1) * 2 * KF_MAXCOLS;
#if KF_Q4_VNNI
  /* or the digits of every token the rows path takes (fewer than KF_GEMM_MIN: more go to the GEMM) */
  sums = (size_t)max_n * (KF_MAXCOLS / 32 + 1) + (size_t)KF_GEMM_MIN * KF_VNNI_FLOATS(KF_MAXCOLS / 32);
#endif
#if KF_PREFILL_GEMM && defined(__AVX2__)
  size_t gemm = (size_t)((max_n + KF_GT - 1) / KF_GT) * KF_GT * KF_MAXCOLS + (size_t)threads * KF_GR * KF_MAXCOLS;
  if (gemm > sums) sums = gemm;
#endif
  (void)threads;
  return sums + 16;
}

#if KF_PREFILL_GEMM && defined(__AVX2__)
/* Block b of row r as 32 floats (w = d*q + m, or d*q), from any quantised format and layout. */
static inline void gemm_dequant_block(const kf_tensor *w, int r, int b, int nb, float *out) {
  const uint8_t *base = (const uint8_t *)w->data;
  __m256 w0, w1, w2, w3, dv, mv = _mm256_setzero_ps();
  if (w->layout == KF_PACK16 && w->format == KF_Q8_0) {
    /* row r%16's 4-byte lane of each of the 8 chunks: elements 4c..4c+3, stored + 128 */
    const uint8_t *blk = pack16_block(w, r, b);
    int i = r % 16;
    dv = _mm256_set1_ps(f16(rd16(blk + 2 * i)));
    int32_t lane[8];
    for (int c = 0; c < 8; c++) memcpy(lane + c, blk + 32 + 64 * c + 4 * i, 4);
    __m128i lo = _mm_xor_si128(_mm_loadu_si128((const __m128i *)lane), _mm_set1_epi8((char)0x80));  /* back to int8 */
    __m128i hi = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(lane + 4)), _mm_set1_epi8((char)0x80));
    w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
    w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
    w2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    w3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
  } else if (w->layout == KF_PACK16) {
    /* row r%16's 4-byte lane of each chunk c: bytes [c][k], elements 8c+k (low nibbles) and 8c+4+k (high) */
    const uint8_t *blk = pack16_block(w, r, b);
    int i = r % 16;
    dv = _mm256_set1_ps(f16(rd16(blk + 2 * i)));
    mv = _mm256_set1_ps(f16(rd16(blk + 32 + 2 * i)));
    int32_t lane[4];
    for (int c = 0; c < 4; c++) memcpy(lane + c, blk + 64 + 64 * c + 4 * i, 4);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    __m128i raw = _mm_loadu_si128((const __m128i *)lane);
    __m128i lo = _mm_and_si128(raw, m4), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
    __m128i e0 = _mm_unpacklo_epi32(lo, hi), e1 = _mm_unpackhi_epi32(lo, hi);   /* elements 0..15, 16..31 */
    w0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(e0));
    w1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(e0, 8)));
    w2 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(e1));
    w3 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(e1, 8)));
  } else if (w->layout == KF_ROWS) {
    const uint8_t *blk = base + ((size_t)r * nb + b) * block_bytes(w->format);
    dv = _mm256_set1_ps(f16(rd16(blk)));
    if (w->format == KF_Q4_1) { mv = _mm256_set1_ps(f16(rd16(blk + 2))); Q4_UNPACK(blk + 4, w0, w1, w2, w3); }
    else { Q8_UNPACK(blk + 2, w0, w1, w2, w3); }
  } else {
    const uint8_t *blk = base + ((size_t)(r / 4) * nb + b) * pack_bytes(w->format);
    dv = _mm256_set1_ps(f16(rd16(blk + 2 * (r % 4))));
    if (w->format == KF_Q4_1) {
      mv = _mm256_set1_ps(f16(rd16(blk + 8 + 2 * (r % 4))));
      Q4_UNPACK_LANES(blk + 16 + 16 * (r % 4), w0, w1, w2, w3);
    } else {
      Q8_UNPACK(blk + 8 + 32 * (r % 4), w0, w1, w2, w3);
    }
  }
  _mm256_storeu_ps(out, _mm256_fmadd_ps(w0, dv, mv));
  _mm256_storeu_ps(out + 8, _mm256_fmadd_ps(w1, dv, mv));
  _mm256_storeu_ps(out + 16, _mm256_fmadd_ps(w2, dv, mv));
  _mm256_storeu_ps(out + 24, _mm256_fmadd_ps(w3, dv, mv));
}

/* The rows r0..r0+KF_GR-1 of w as floats, row j at panel + j * KF_PS (dequantised, or copied from F32 weights;
 * rows past the matrix are zeros). The stride is a compile-time constant so that the micro-kernels address
 * every row from one pointer with a constant displacement: 12 row pointers (as this had) outnumbered the
 * registers, and GCC moved them between vector and general registers inside the kernel's loop. */
#define KF_PS KF_MAXCOLS
static void gemm_panel(const kf_tensor *w, int r0, float *panel) {
  int cols = w->cols, nb = cols / 32;
  for (int j = 0; j < KF_GR; j++) {
    int r = r0 + j;
    float *dst = panel + (size_t)j * KF_PS;
    if (r >= w->rows) { memset(dst, 0, (size_t)cols * 4); continue; }
    if (w->format == KF_F32 && w->layout == KF_ROWS) { memcpy(dst, (const float *)w->data + (size_t)r * cols, (size_t)cols * 4); continue; }
    for (int b = 0; b < nb; b++) {
      if (w->format == KF_F32) dequant_block(w, r, b, dst + 32 * b);  /* PACK4 F32: four 8-float copies */
      else gemm_dequant_block(w, r, b, nb, dst + 32 * b);
    }
  }
}

#ifdef __AVX512F__
/* KF_GR (12) rows x 16 tokens of one packed tile with 512-bit vectors: the tile's 16 tokens are one vector, each
 * row an accumulator; per column one load of the tokens and 12 FMAs, each broadcasting a weight from the panel.
 * (6 rows, as the 256-bit kernel has, measured prefill x1.13 at 1 thread: each load of the tokens then fed 6
 * FMAs, and the tiles stream from L2 or beyond for every panel.) */
static inline __attribute__((always_inline)) void gemm_kernel16(const float *pa, const float *xt, int cols,
                                                                float *out) {
  __m512 a[KF_GR];
  for (int j = 0; j < KF_GR; j++) a[j] = _mm512_setzero_ps();
  for (int c = 0; c < cols; c++) {
    __m512 x0 = _mm512_load_ps(xt + (size_t)KF_GT * c);
    for (int j = 0; j < KF_GR; j++) a[j] = _mm512_fmadd_ps(_mm512_set1_ps(pa[j * KF_PS + c]), x0, a[j]);
  }
  for (int j = 0; j < KF_GR; j++) _mm512_storeu_ps(out + j * KF_GT, a[j]);
}

/* gemm_kernel16 over two full tiles at once (24 accumulators): each broadcast weight feeds two FMAs, so a
 * column costs 14 loads for 24 FMAs instead of 13 for 12, and the panel is read once for both tiles. Each
 * sum runs over the columns in the same order as gemm_kernel16's: the results are the same bits. */
static inline __attribute__((always_inline)) void gemm_kernel16x2(const float *pa, const float *xt0,
                                                                  const float *xt1, int cols, float *out0,
                                                                  float *out1) {
  __m512 a[KF_GR], b[KF_GR];
  for (int j = 0; j < KF_GR; j++) a[j] = b[j] = _mm512_setzero_ps();
  for (int c = 0; c < cols; c++) {
    __m512 x0 = _mm512_load_ps(xt0 + (size_t)KF_GT * c), x1 = _mm512_load_ps(xt1 + (size_t)KF_GT * c);
    for (int j = 0; j < KF_GR; j++) {
      __m512 w_ = _mm512_set1_ps(pa[j * KF_PS + c]);
      a[j] = _mm512_fmadd_ps(w_, x0, a[j]);
      b[j] = _mm512_fmadd_ps(w_, x1, b[j]);
    }
  }
  for (int j = 0; j < KF_GR; j++) { _mm512_storeu_ps(out0 + j * KF_GT, a[j]); _mm512_storeu_ps(out1 + j * KF_GT, b[j]); }
}
#endif

/* 6 rows (at pa + j * KF_PS) x (8 * NV) tokens of one packed tile over all columns;
 * out[j * KF_GT + i] = Y[token i][row j]. */
static inline __attribute__((always_inline)) void gemm_kernel6(const float *pa, const float *xt, int cols, int NV,
                                                              float *out) {
  __m256 a[6][2];
  for (int j = 0; j < 6; j++) { a[j][0] = _mm256_setzero_ps(); a[j][1] = _mm256_setzero_ps(); }
  for (int c = 0; c < cols; c++) {
    __m256 x0 = _mm256_load_ps(xt + (size_t)KF_GT * c), x1 = x0;
    if (NV > 1) x1 = _mm256_load_ps(xt + (size_t)KF_GT * c + 8);
    for (int j = 0; j < 6; j++) {
      __m256 w_ = _mm256_broadcast_ss(pa + j * KF_PS + c);
      a[j][0] = _mm256_fmadd_ps(w_, x0, a[j][0]);
      if (NV > 1) a[j][1] = _mm256_fmadd_ps(w_, x1, a[j][1]);
    }
  }
  for (int j = 0; j < 6; j++) {
    _mm256_storeu_ps(out + j * KF_GT, a[j][0]);
    if (NV > 1) _mm256_storeu_ps(out + j * KF_GT + 8, a[j][1]);
  }
}

/* KF_GR rows x (8 * NV) tokens of one packed tile over all columns; out[j * KF_GT + i] = Y[token i][row j]. */
static inline __attribute__((always_inline)) void gemm_kernel(const float *pa, const float *xt, int cols, int NV,
                                                              float *out) {
#ifdef __AVX512F__
  if (NV > 1) { gemm_kernel16(pa, xt, cols, out); return; }
  gemm_kernel6(pa, xt, cols, NV, out);                  /* 8 tokens or fewer: two halves of 6 rows */
  gemm_kernel6(pa + 6 * KF_PS, xt, cols, NV, out + 6 * KF_GT);
#else
  gemm_kernel6(pa, xt, cols, NV, out);
#endif
}

/* y = W x over n >= KF_GEMM_MIN tokens; scratch: matmul_scratch_floats(n, threads) floats */
static void gemm(const kf_tensor *w, const float *x, int ldx, int n, float *y, int ldy, float *scratch,
                 int threads) {
  int cols = w->cols, rows = w->rows, tiles = (n + KF_GT - 1) / KF_GT, panels = (rows + KF_GR - 1) / KF_GR;
  float *xp = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
  float *panels_at = xp + (size_t)tiles * KF_GT * cols;
  /* X as [tile][c][16 tokens], the tokens past n zeros: packed once, read by every panel */
  for (int tt = 0; tt < tiles; tt++)
    for (int i = 0; i < KF_GT; i++) {
      int t = tt * KF_GT + i;
      float *dst = xp + (size_t)tt * KF_GT * cols + i;
      if (t < n) { const float *src = x + (size_t)t * ldx; for (int c = 0; c < cols; c++) dst[(size_t)KF_GT * c] = src[c]; }
      else for (int c = 0; c < cols; c++) dst[(size_t)KF_GT * c] = 0.0f;
    }
  int par = threads > 1 && (double)rows * cols * n >= KF_PAR_MIN;
  (void)par;
#pragma omp parallel num_threads(threads) if (par)
  {
    int tid = 0;
#ifdef _OPENMP
    tid = omp_get_thread_num();
#endif
    float *panel = panels_at + (size_t)tid * KF_GR * KF_MAXCOLS;
    float out[2][KF_GR * KF_GT];
#pragma omp for schedule(static)
    for (int pi = 0; pi < panels; pi++) {
      int r0 = pi * KF_GR, nr = rows - r0 < KF_GR ? rows - r0 : KF_GR;
      gemm_panel(w, r0, panel);
      for (int tt = 0; tt < tiles;) {
        int t0 = tt * KF_GT, nt = n - t0 < KF_GT ? n - t0 : KF_GT;
        const float *xt = xp + (size_t)tt * KF_GT * cols;
        int pair = 0;
#ifdef __AVX512F__
        pair = n - t0 >= 2 * KF_GT;   /* two full tiles */
        if (pair) gemm_kernel16x2(panel, xt, xt + (size_t)KF_GT * cols, cols, out[0], out[1]);
#endif
        if (!pair) gemm_kernel(panel, xt, cols, nt > 8 ? 2 : 1, out[0]);
        for (int k = 0; k <= pair; k++)   /* a pair's tiles are full: nt is KF_GT for both */
          for (int i = 0; i < nt; i++)
            for (int j = 0; j < nr; j++) y[(size_t)(t0 + k * KF_GT + i) * ldy + r0 + j] = out[k][j * KF_GT + i];
        tt += 1 + pair;
      }
    }
  }
}
#endif

/* kernels searched by the kernel pipeline for the matvec problems (kfactory/engines/ops.py): each is its own
 * translation unit, compiled with the flags it was verified with, its entry renamed to these names and
 * hidden (the library exports the engine's ABI only); the problems' ABI: w the GGUF blocks [rows][blocks], x [blocks * 32], y [rows] */
#if KF_OP_MATVEC_Q4_1
__attribute__((visibility("hidden"))) void kf_op_matvec_q4_1(const uint8_t *w, const float *x, float *y, int64_t rows, int64_t blocks);
#endif
#if KF_OP_MATVEC_Q8_0
__attribute__((visibility("hidden"))) void kf_op_matvec_q8_0(const uint8_t *w, const float *x, float *y, int64_t rows, int64_t blocks);
#endif

/* The forms of x the n tokens' kernels read, made once for all the rows in xs (matmul_scratch_floats(n, 1)
 * floats): Q4_1's block sums, then the integer decode's digits or x scaled for q4group1 (the returned pointer).
 * noinline, as matmul_share: one machine code for matmul and decode_team, so that both round alike. */
static __attribute__((noinline)) float *matmul_prep(const kf_tensor *w, const float *x, int ldx, int n, float *xs) {
  int nb = w->cols / 32;
  if (w->format == KF_Q4_1)
    for (int t = 0; t < n; t++)
      for (int b = 0; b < nb; b++) {
        const float *xb = x + (size_t)t * ldx + 32 * b;
        float s = 0.0f;
        for (int j = 0; j < 32; j++) s += xb[j];
        xs[t * nb + b] = s;
      }
  /* the tokens the PACK4 loop takes one at a time (decode's one token, a tile's leftovers) read x scaled for
   * q4group1, made once here for all the rows */
  float *xk = xs + (size_t)n * nb;
#if KF_Q4_VNNI
  if (w->layout == KF_PACK16)
    for (int t = 0; t < n; t++) vnni_digits(x + (size_t)t * ldx, w->cols, xk + (size_t)t * KF_VNNI_FLOATS(nb));
#endif
#if defined(__AVX2__) && !KF_WEIGHTS_F32
  if (w->format == KF_Q4_1 && w->layout == KF_PACK4)
    for (int t = n - n % KF_TT; t < n; t++)
#if defined(__AVX512F__) && !KF_Q4_TABLE
      decode_dup_x(x + (size_t)t * ldx, w->cols, xk + (size_t)(t - n + n % KF_TT) * 2 * w->cols);
#elif defined(__AVX512F__)
      decode_lut_x(x + (size_t)t * ldx, w->cols, xk + (size_t)(t - n + n % KF_TT) * w->cols);
#else
      decode_scaled_x(x + (size_t)t * ldx, w->cols, xk + (size_t)(t - n + n % KF_TT) * w->cols);
#endif
#endif
  return xk;
}

/* [*a, *b): part id of `count` units cut in nt contiguous parts as even as whole units allow */
static inline void share_of(int count, int id, int nt, int *a, int *b) {
  *a = (int)((long)count * id / nt);
  *b = (int)((long)count * (id + 1) / nt);
}

/* Thread id of nt's part of y = W x over n tokens, from matmul_prep's forms of x: a contiguous run of rows,
 * 16-row units (PACK16 groups, or KF_RCHUNK chunks), so that a part's bounds are even rows (decode_team ropes
 * the pairs of its own rows). Its rows [*r0, *r1) (empty when the part is). Each row's product is the same
 * whichever thread takes it. */
static __attribute__((noinline)) void matmul_share(const kf_tensor *w, const float *x, int ldx, int n, float *y, int ldy, const float *xs,
                         const float *xk, int id, int nt, int *r0, int *r1) {
  int rows = w->rows, nb = w->cols / 32, c0, c1;
  (void)nb;
#if KF_Q4_VNNI && KF_VNNI_DIGITS == 3
  if (w->layout == KF_PACK16) {   /* each thread its contiguous share of the groups, in KF_VNNI_STREAMS streams */
    share_of((rows + 15) / 16, id, nt, &c0, &c1);
    *r0 = 16 * c0;
    *r1 = 16 * c1 < rows ? 16 * c1 : rows;
    for (int t = 0; t < n && c0 < c1; t++)
      pack16_rows_vnni(w, *r0, *r1, xk + (size_t)t * KF_VNNI_FLOATS(nb), xs + (size_t)t * nb, y + (size_t)t * ldy);
    return;
  }
#endif
  share_of((rows + KF_RCHUNK - 1) / KF_RCHUNK, id, nt, &c0, &c1);
  *r0 = c0 * KF_RCHUNK;
  *r1 = c1 * KF_RCHUNK < rows ? c1 * KF_RCHUNK : rows;
  for (int c = c0; c < c1; c++) {
    int a = c * KF_RCHUNK, b = a + KF_RCHUNK < rows ? a + KF_RCHUNK : rows;
#ifdef __AVX2__
    rows_avx2(w, a, b, x, ldx, n, y, ldy, xs, xk);
#else
    (void)xs;
    (void)xk;
    rows_scalar(w, a, b, x, ldx, n, y, ldy);
#endif
  }
}

/* whether the design links a searched kernel for w's format (it then takes a decode step's whole product) */
static inline int has_searched(const kf_tensor *w) {
  return (KF_OP_MATVEC_Q4_1 && w->format == KF_Q4_1) || (KF_OP_MATVEC_Q8_0 && w->format == KF_Q8_0);
}

/* One token's product by a searched kernel where the design links one for w's format (has_searched: the whole
 * matrix, on the calling thread): 1 when it ran, else 0 */
static int searched_matvec(const kf_tensor *w, const float *x, float *y) {
#if KF_OP_MATVEC_Q4_1
  if (w->format == KF_Q4_1) { kf_op_matvec_q4_1((const uint8_t *)w->data, x, y, w->rows, w->cols / 32); return 1; }
#endif
#if KF_OP_MATVEC_Q8_0
  if (w->format == KF_Q8_0) { kf_op_matvec_q8_0((const uint8_t *)w->data, x, y, w->rows, w->cols / 32); return 1; }
#endif
  (void)w;
  (void)x;
  (void)y;
  return 0;
}

/* whether a product of rows x cols over n tokens is worth more than one thread */
static inline int matmul_par(const kf_tensor *w, int n, int threads) {
  return threads > 1 && (double)w->rows * w->cols * n >= KF_PAR_MIN;
}

/* y = W x over n tokens; xs: scratch of matmul_scratch_floats(n, threads) floats (the block sums Q4_1 needs, or
 * the GEMM's packed tokens and panels) */
static void matmul(const kf_tensor *w, const float *x, int ldx, int n, float *y, int ldy, float *xs, int threads) {
  if (n == 1 && searched_matvec(w, x, y)) return;
#if KF_PREFILL_GEMM && defined(__AVX2__)
  if (n >= KF_GEMM_MIN) { gemm(w, x, ldx, n, y, ldy, xs, threads); return; }
#endif
  float *xk = matmul_prep(w, x, ldx, n, xs);
#pragma omp parallel num_threads(threads) if (matmul_par(w, n, threads))
  {
    int r0, r1;
    matmul_share(w, x, ldx, n, y, ldy, xs, xk, kf_thread(), kf_threads(), &r0, &r1);
  }
}
