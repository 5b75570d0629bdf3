/* ---- forward.c: the engine (weights, KV cache, scratch), the Llama forward, the ABI ------------------- */
#define KF_CHUNK 64  /* prefill tokens per pass over the weights (scratch is sized for it) */

/* The model's conventions, one macro each (kfactory/models/reference.py): RoPE rotates the adjacent pair
 * (KF_PAIR(i), KF_MATE(i)) of each head; query head h reads key/value head KF_KV_OF(h). */
#define KF_PAIR(i) (2 * (i))
#define KF_MATE(i) (2 * (i) + 1)
#define KF_KV_OF(h) ((h) / KF_GROUP)

#if KF_KV_HEAD_MAJOR
#define KV_AT(cache, e, l, kvh, p) ((cache) + ((((size_t)(l) * KF_KV_HEADS + (kvh)) * (e)->ctx + (p)) * KF_HEAD_DIM))
#else
#define KV_AT(cache, e, l, kvh, p) ((cache) + ((((size_t)(l) * (e)->ctx + (p)) * KF_KV_HEADS + (kvh)) * KF_HEAD_DIM))
#endif

typedef struct {
  const kf_tensor *attn_norm, *ffn_norm, *q, *k, *v, *qkv, *o, *gate, *up, *gate_up, *down;
} kf_layer;

typedef struct {
  kf_tensor *tensors;
  int n_tensors;
  kf_layer layer[KF_BLOCKS];
  const kf_tensor *embd, *out_norm;
  int ctx, threads, pos;
  float eps;
  float *kc, *vc, *cosv, *sinv;
  float *x, *h, *qkv, *att, *gu, *xs, *scores;
  float *part, *part_ml;   /* a split decode attention's parts: per head, per part (attention) */
  float *team;             /* decode_team's per-thread scratch (TEAM_FLOATS a thread), or NULL */
} kf_engine;

/* the layout a matrix of `format` must have: rows where a searched kernel reads it at decode (it reads the GGUF
 * blocks as stored), else the design's (PACK4 when prepacked; Q4_1 in PACK16 for the VNNI decode) */
static int want_layout(int format) {
#if KF_OP_MATVEC_Q4_1
  if (format == KF_Q4_1) return KF_ROWS;
#endif
#if KF_OP_MATVEC_Q8_0
  if (format == KF_Q8_0) return KF_ROWS;
#endif
#if KF_Q4_VNNI
  if (format == KF_Q4_1 || format == KF_Q8_0) return KF_PACK16;
#endif
  (void)format;
  return KF_PREPACK ? KF_PACK4 : KF_ROWS;
}

static const kf_tensor *need(kf_engine *e, const char *name, int rows, int cols, int matrix) {
  for (int i = 0; i < e->n_tensors; i++) {
    const kf_tensor *t = &e->tensors[i];
    if (!t->name || strcmp(t->name, name) != 0) continue;
    if (t->rows != rows || t->cols != cols) {
      set_error("tensor %s: expected %d x %d, got %d x %d", name, rows, cols, t->rows, t->cols);
      return NULL;
    }
    if (!t->data) { set_error("tensor %s: no data", name); return NULL; }
    if (!matrix) {
      if (t->format != KF_F32 || t->layout != KF_ROWS) { set_error("tensor %s: a norm must be F32 rows", name); return NULL; }
      return t;
    }
#if KF_WEIGHTS_F32
    int format_ok = t->format == KF_F32;
#else
    int format_ok = t->format == KF_Q4_1 || t->format == KF_Q8_0;
#endif
    if (!format_ok || t->layout != want_layout(t->format) || cols % 32) {
      set_error("tensor %s: format %d, layout %d is not what this engine was generated for", name, t->format, t->layout);
      return NULL;
    }
    return t;
  }
  set_error("tensor %s is missing", name);
  return NULL;
}

static int bind(kf_engine *e) {
  char name[96];
#define NEED(field, suffix, rows, cols, matrix) do {                                 \
    snprintf(name, sizeof name, "blk.%d." suffix ".weight", l);                      \
    if (!(L->field = need(e, name, rows, cols, matrix))) return 0; } while (0)
  for (int l = 0; l < KF_BLOCKS; l++) {
    kf_layer *L = &e->layer[l];
    NEED(attn_norm, "attn_norm", 1, KF_HIDDEN, 0);
    NEED(ffn_norm, "ffn_norm", 1, KF_HIDDEN, 0);
#if KF_FUSE_QKV
    NEED(qkv, "attn_qkv", KF_QKV, KF_HIDDEN, 1);
#else
    NEED(q, "attn_q", KF_QDIM, KF_HIDDEN, 1);
    NEED(k, "attn_k", KF_KVDIM, KF_HIDDEN, 1);
    NEED(v, "attn_v", KF_KVDIM, KF_HIDDEN, 1);
#endif
    NEED(o, "attn_output", KF_HIDDEN, KF_QDIM, 1);
#if KF_FUSE_GATE_UP
    NEED(gate_up, "ffn_gate_up", 2 * KF_FFN, KF_HIDDEN, 1);
#else
    NEED(gate, "ffn_gate", KF_FFN, KF_HIDDEN, 1);
    NEED(up, "ffn_up", KF_FFN, KF_HIDDEN, 1);
#endif
    NEED(down, "ffn_down", KF_HIDDEN, KF_FFN, 1);
  }
#undef NEED
  e->embd = need(e, "token_embd.weight", KF_VOCAB, KF_HIDDEN, 1);
  e->out_norm = need(e, "output_norm.weight", 1, KF_HIDDEN, 0);
  return e->embd && e->out_norm;
}

/* decode_team's scratch a thread (floats): its own residual stream, normed activations, attention output and
 * SiLU product, the forms of x its matvecs read (matmul_prep), rounded up to whole cache lines so that no two
 * threads write one line */
#define TEAM_FLOATS (((size_t)2 * KF_HIDDEN + KF_QDIM + KF_FFN + matmul_scratch_floats(1, 1) + 15) / 16 * 16)

void kf_engine_free(void *p) {
  kf_engine *e = (kf_engine *)p;
  if (!e) return;
  float *bufs[] = {e->kc, e->vc, e->cosv, e->sinv, e->x, e->h, e->qkv, e->att, e->gu, e->xs, e->scores, e->part,
                   e->part_ml, e->team};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
  free(e->tensors);
  free(e);
}

void *kf_engine_new(const kf_tensor *tensors, int n_tensors, const kf_config *cfg, int ctx_capacity, int threads) {
  if (!tensors || n_tensors <= 0 || !cfg || ctx_capacity <= 0 || threads <= 0) {
    set_error("kf_engine_new: bad arguments (ctx %d, threads %d)", ctx_capacity, threads);
    return NULL;
  }
  int want[7] = {KF_BLOCKS, KF_HIDDEN, KF_HEADS, KF_KV_HEADS, KF_HEAD_DIM, KF_FFN, KF_VOCAB};
  int got[7] = {cfg->blocks, cfg->hidden, cfg->heads, cfg->kv_heads, cfg->head_dim, cfg->ffn, cfg->vocab};
  static const char *names[7] = {"blocks", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab"};
  for (int i = 0; i < 7; i++)
    if (want[i] != got[i]) { set_error("config %s is %d; this engine was generated for %d", names[i], got[i], want[i]); return NULL; }
  kf_engine *e = (kf_engine *)calloc(1, sizeof *e);
  if (!e) return NULL;
  e->ctx = ctx_capacity;
  e->threads = threads;
  e->eps = cfg->rms_eps;
  e->n_tensors = n_tensors;
  e->tensors = (kf_tensor *)malloc(sizeof(kf_tensor) * n_tensors);
  size_t kv = (size_t)KF_BLOCKS * ctx_capacity * KF_KVDIM, rot = (size_t)ctx_capacity * (KF_HEAD_DIM / 2);
  e->kc = (float *)malloc(kv * 4);
  e->vc = (float *)malloc(kv * 4);
  e->cosv = (float *)malloc(rot * 4);
  e->sinv = (float *)malloc(rot * 4);
  e->x = (float *)malloc((size_t)KF_CHUNK * KF_HIDDEN * 4);
  e->h = (float *)malloc((size_t)KF_CHUNK * KF_HIDDEN * 4);
  e->qkv = (float *)malloc((size_t)KF_CHUNK * KF_QKV * 4);
  e->att = (float *)malloc((size_t)KF_CHUNK * KF_QDIM * 4);
  e->gu = (float *)malloc((size_t)KF_CHUNK * 2 * KF_FFN * 4);
  e->xs = (float *)malloc(matmul_scratch_floats(KF_CHUNK, threads) * 4);
  e->scores = (float *)malloc((size_t)threads * KF_GROUP * ctx_capacity * 4);
  e->part = (float *)malloc((size_t)KF_HEADS * threads * KF_HEAD_DIM * 4);
  e->part_ml = (float *)malloc((size_t)KF_HEADS * threads * 2 * 4);
#if KF_TEAM_STEP
  e->team = (float *)aligned_alloc(64, (size_t)threads * TEAM_FLOATS * 4);   /* whole lines a thread */
#endif
  if (!e->tensors || !e->kc || !e->vc || !e->cosv || !e->sinv || !e->x || !e->h || !e->qkv || !e->att || !e->gu ||
      !e->xs || !e->scores || !e->part || !e->part_ml || (KF_TEAM_STEP && !e->team)) {
    set_error("kf_engine_new: out of memory (ctx %d, threads %d)", ctx_capacity, threads);
    kf_engine_free(e);
    return NULL;
  }
  memcpy(e->tensors, tensors, sizeof(kf_tensor) * n_tensors);
  if (!bind(e)) { kf_engine_free(e); return NULL; }
  /* angle = pos * base^(-2i/head_dim), in double as the reference does, rounded once to float */
  for (int p = 0; p < ctx_capacity; p++)
    for (int i = 0; i < KF_HEAD_DIM / 2; i++) {
      double a = (double)p * pow((double)cfg->rope_base, -2.0 * i / KF_HEAD_DIM);
      e->cosv[(size_t)p * (KF_HEAD_DIM / 2) + i] = (float)cos(a);
      e->sinv[(size_t)p * (KF_HEAD_DIM / 2) + i] = (float)sin(a);
    }
  for (int i = 0; i < n_tensors; i++) e->tensors[i].name = NULL;  /* the caller's strings need not outlive this */
  return e;
}

/* RoPE on pairs i0..i1 of the head at v */
static inline __attribute__((always_inline)) void rope_pairs(float *restrict v, const float *restrict c,
                                                             const float *restrict s, int i0, int i1) {
  for (int i = i0; i < i1; i++) {
    float x0 = v[KF_PAIR(i)], x1 = v[KF_MATE(i)];
    v[KF_PAIR(i)] = x0 * c[i] - x1 * s[i];
    v[KF_MATE(i)] = x0 * s[i] + x1 * c[i];
  }
}

/* a thread of decode_team ropes the rows of its share, which may end inside a head: right where a pair is two
 * adjacent rows, so that no share's bounds (even rows) cut one */
#if KF_TEAM_STEP && (KF_PAIR(1) != 2 || KF_MATE(1) != 3)
#error "design team step takes RoPE's pairs as adjacent rows (2i, 2i + 1)"
#endif
/* RoPE on rows [a, b) of one token's Q, K, V (qkv: KF_QKV floats; a and b even), at position pos, and the K and
 * V rows among them into layer l's cache. By rows, not heads, so that a thread of decode_team takes the rows its
 * own share of the QKV product made (forward() passes all of them); noinline: one machine code for both paths,
 * so they round alike. */
static __attribute__((noinline)) void rope_kv_rows(kf_engine *e, int l, float *qkv, int pos, int a, int b) {
  const float *c = e->cosv + (size_t)pos * (KF_HEAD_DIM / 2), *s = e->sinv + (size_t)pos * (KF_HEAD_DIM / 2);
  /* a run within one head at a time (Q, K and V are whole heads, so every head starts on a multiple of
   * KF_HEAD_DIM): Q's and K's runs roped (their pairs by rope_pairs), then K's and V's copied into the cache
   * (a head's row there is contiguous); a whole head takes the constant bounds and size */
  for (int r = a, run; r < b; r += run) {
    int d = r % KF_HEAD_DIM;
    run = KF_HEAD_DIM - d < b - r ? KF_HEAD_DIM - d : b - r;
    if (r < KF_QDIM + KF_KVDIM) {
      if (run == KF_HEAD_DIM) rope_pairs(qkv + r, c, s, 0, KF_HEAD_DIM / 2);
      else rope_pairs(qkv + (r - d), c, s, d / 2, (d + run) / 2);
    }
    if (r >= KF_QDIM) {
      int k = r - KF_QDIM, isv = k >= KF_KVDIM, kk = isv ? k - KF_KVDIM : k;
      float *to = KV_AT(isv ? e->vc : e->kc, e, l, kk / KF_HEAD_DIM, pos) + d;
      if (run == KF_HEAD_DIM) memcpy(to, qkv + r, KF_HEAD_DIM * 4);
      else memcpy(to, qkv + r, (size_t)run * 4);
    }
  }
}

/* out = softmax(q . K[0..pos] / sqrt(d)) V for query head `head` of layer l; s: scratch of pos + 1 floats */
static __attribute__((unused)) void attend(const kf_engine *e, int l, int head, const float *q, int pos,
                                           float *out, float *s) {
  int kvh = KF_KV_OF(head);
  const float scale = 1.0f / sqrtf((float)KF_HEAD_DIM);
  float mx = -INFINITY;
  for (int p = 0; p <= pos; p++) {
    s[p] = dot(q, KV_AT(e->kc, e, l, kvh, p), KF_HEAD_DIM) * scale;
    if (s[p] > mx) mx = s[p];
  }
  float inv = 1.0f / exp_shift_sum(s, pos + 1, mx);
  for (int d = 0; d < KF_HEAD_DIM; d++) out[d] = 0.0f;
  for (int p = 0; p <= pos; p++) {
    const float *v = KV_AT(e->vc, e, l, kvh, p);
    for (int d = 0; d < KF_HEAD_DIM; d++) out[d] += s[p] * v[d];
  }
  for (int d = 0; d < KF_HEAD_DIM; d++) out[d] *= inv;
}

#if KF_PREFILL_GEMM && defined(__AVX2__) && KF_HEAD_DIM % 8 == 0
#define KF_ATTEND_BLOCK 1
#else
#define KF_ATTEND_BLOCK 0
#endif

#if KF_ATTEND_BLOCK
/* attend() with the scores of 4 keys at a time (4 independent FMA chains instead of one 8-step chain per key,
 * whose latency bounded the scores) and the weighted sum of V held in 8 registers: prefill and decode (after
 * 128 tokens, decode measured x1.03 tok/s against attend(), after 1024 x1.12). */
static void attend_block(const kf_engine *e, int l, int head, const float *q, int pos, float *out, float *s) {
  int kvh = KF_KV_OF(head);
  const float scale = 1.0f / sqrtf((float)KF_HEAD_DIM);
  float mx;
  __m128 mx4 = _mm_set1_ps(-INFINITY);
  int p = 0;
  for (; p + 4 <= pos + 1; p += 4) {
    const float *k0 = KV_AT(e->kc, e, l, kvh, p), *k1 = KV_AT(e->kc, e, l, kvh, p + 1);
    const float *k2 = KV_AT(e->kc, e, l, kvh, p + 2), *k3 = KV_AT(e->kc, e, l, kvh, p + 3);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int d = 0; d < KF_HEAD_DIM; d += 8) {
      __m256 qv = _mm256_loadu_ps(q + d);
      a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
      a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + d), a1);
      a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + d), a2);
      a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + d), a3);
    }
    /* the 4 horizontal sums at once: pairwise adds, then the two 128-bit halves */
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    __m128 sum = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    sum = _mm_mul_ps(sum, _mm_set1_ps(scale));
    _mm_storeu_ps(s + p, sum);
    mx4 = _mm_max_ps(mx4, sum);
  }
  mx4 = _mm_max_ps(mx4, _mm_movehl_ps(mx4, mx4));
  mx4 = _mm_max_ss(mx4, _mm_movehdup_ps(mx4));
  mx = _mm_cvtss_f32(mx4);
  for (; p <= pos; p++) {
    s[p] = dot(q, KV_AT(e->kc, e, l, kvh, p), KF_HEAD_DIM) * scale;
    if (s[p] > mx) mx = s[p];
  }
  float inv = 1.0f / exp_shift_sum(s, pos + 1, mx);
  __m256 acc[KF_HEAD_DIM / 8];
  for (int d = 0; d < KF_HEAD_DIM / 8; d++) acc[d] = _mm256_setzero_ps();
  for (p = 0; p <= pos; p++) {
    const float *v = KV_AT(e->vc, e, l, kvh, p);
    __m256 sp = _mm256_set1_ps(s[p]);
    for (int d = 0; d < KF_HEAD_DIM / 8; d++) acc[d] = _mm256_fmadd_ps(sp, _mm256_loadu_ps(v + 8 * d), acc[d]);
  }
  for (int d = 0; d < KF_HEAD_DIM / 8; d++) _mm256_storeu_ps(out + 8 * d, _mm256_mul_ps(acc[d], _mm256_set1_ps(inv)));
}
#endif

/* one query head's attention over positions 0..pos: attend_block where it is built, else attend */
static void attend_head(const kf_engine *e, int l, int head, const float *q, int pos, float *out, float *s) {
#if KF_ATTEND_BLOCK
  attend_block(e, l, head, q, pos, out, s);
#else
  attend(e, l, head, q, pos, out, s);
#endif
}

#define KF_MAX_PARTS 64   /* parts of a split decode attention at most (a design's threads stop there too) */
/* vectors of V's dimensions summed per pass of attend_group: KF_GROUP x KF_GV accumulators stay in registers */
#define KF_GV (KF_HEAD_DIM / 8 < 12 / KF_GROUP ? KF_HEAD_DIM / 8 : 12 / KF_GROUP)
#if KF_ATTEND_BLOCK && KF_GROUP <= 3 && (KF_HEAD_DIM / 8) % KF_GV == 0
#define KF_ATTEND_GROUP 1
/* A decode step's attention for the KF_GROUP query heads that share key/value head kvh, over the positions
 * [p0, p1) of the cache: attend_block's sums, in its order (bit-identical over [0, pos + 1)), but each key and
 * value is loaded once for all the group's heads instead of once a head. s: scratch of KF_GROUP x e->ctx floats.
 * parts 1: the softmax-weighted sum goes to e->att. Else [p0, p1) is part c of a split context: each head's
 * sum of exp(score - max) V, unnormalised, and its max and sum of exp go to the head's slot c of e->part and
 * e->part_ml (merge_parts combines the parts). Measured against attend_block per head (smollm2-135m, old and
 * new libraries alternated): 1 thread x1.02 after 128 tokens, x1.05 after 1024; 2 threads x1.02 and x1.39
 * (the key/value heads split over the threads: each head's keys are read by one core only). */
static void attend_group(kf_engine *e, int l, int kvh, int p0, int p1, float *s, int parts, int c) {
  const float scale = 1.0f / sqrtf((float)KF_HEAD_DIM);
  const float *q[KF_GROUP];
  float *sg[KF_GROUP], mx[KF_GROUP];
  __m128 mx4[KF_GROUP];
  /* the query heads that read kvh, by KF_KV_OF (the one place the grouping is defined: KF_GROUP heads a
   * key/value head) */
  int head[KF_GROUP], ng = 0;
  for (int h = 0; h < KF_HEADS && ng < KF_GROUP; h++)
    if (KF_KV_OF(h) == kvh) head[ng++] = h;
  for (int g = 0; g < KF_GROUP; g++) {
    q[g] = e->qkv + (size_t)head[g] * KF_HEAD_DIM;
    sg[g] = s + (size_t)g * e->ctx;
    mx4[g] = _mm_set1_ps(-INFINITY);
  }
  int p = p0;
  for (; p + 4 <= p1; p += 4) {
    const float *k0 = KV_AT(e->kc, e, l, kvh, p), *k1 = KV_AT(e->kc, e, l, kvh, p + 1);
    const float *k2 = KV_AT(e->kc, e, l, kvh, p + 2), *k3 = KV_AT(e->kc, e, l, kvh, p + 3);
    __m256 a[KF_GROUP][4];
    for (int g = 0; g < KF_GROUP; g++)
      for (int j = 0; j < 4; j++) a[g][j] = _mm256_setzero_ps();
    for (int d = 0; d < KF_HEAD_DIM; d += 8) {
      __m256 kv0 = _mm256_loadu_ps(k0 + d), kv1 = _mm256_loadu_ps(k1 + d);
      __m256 kv2 = _mm256_loadu_ps(k2 + d), kv3 = _mm256_loadu_ps(k3 + d);
      for (int g = 0; g < KF_GROUP; g++) {
        __m256 qv = _mm256_loadu_ps(q[g] + d);
        a[g][0] = _mm256_fmadd_ps(qv, kv0, a[g][0]);
        a[g][1] = _mm256_fmadd_ps(qv, kv1, a[g][1]);
        a[g][2] = _mm256_fmadd_ps(qv, kv2, a[g][2]);
        a[g][3] = _mm256_fmadd_ps(qv, kv3, a[g][3]);
      }
    }
    for (int g = 0; g < KF_GROUP; g++) {
      __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a[g][0], a[g][1]), _mm256_hadd_ps(a[g][2], a[g][3]));
      __m128 sum = _mm_mul_ps(_mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)),
                              _mm_set1_ps(scale));
      _mm_storeu_ps(sg[g] + p, sum);
      mx4[g] = _mm_max_ps(mx4[g], sum);
    }
  }
  float inv[KF_GROUP];
  for (int g = 0; g < KF_GROUP; g++) {
    __m128 m = _mm_max_ps(mx4[g], _mm_movehl_ps(mx4[g], mx4[g]));
    mx[g] = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
    for (int r = p; r < p1; r++) {
      sg[g][r] = dot(q[g], KV_AT(e->kc, e, l, kvh, r), KF_HEAD_DIM) * scale;
      if (sg[g][r] > mx[g]) mx[g] = sg[g][r];
    }
    float sum = exp_shift_sum(sg[g] + p0, p1 - p0, mx[g]);
    inv[g] = 1.0f / sum;
    if (parts > 1) {
      float *ml = e->part_ml + ((size_t)head[g] * parts + c) * 2;
      ml[0] = mx[g];
      ml[1] = sum;
      inv[g] = 1.0f;
    }
  }
  for (int d0 = 0; d0 < KF_HEAD_DIM / 8; d0 += KF_GV) {
    __m256 acc[KF_GROUP][KF_GV];
    for (int g = 0; g < KF_GROUP; g++)
      for (int j = 0; j < KF_GV; j++) acc[g][j] = _mm256_setzero_ps();
    for (int r = p0; r < p1; r++) {
      const float *v = KV_AT(e->vc, e, l, kvh, r) + 8 * d0;
      __m256 vv[KF_GV];
      for (int j = 0; j < KF_GV; j++) vv[j] = _mm256_loadu_ps(v + 8 * j);
      for (int g = 0; g < KF_GROUP; g++) {
        __m256 sp = _mm256_set1_ps(sg[g][r]);
        for (int j = 0; j < KF_GV; j++) acc[g][j] = _mm256_fmadd_ps(sp, vv[j], acc[g][j]);
      }
    }
    for (int g = 0; g < KF_GROUP; g++) {
      float *out = (parts > 1 ? e->part + ((size_t)head[g] * parts + c) * KF_HEAD_DIM
                              : e->att + (size_t)head[g] * KF_HEAD_DIM) + 8 * d0;
      for (int j = 0; j < KF_GV; j++) _mm256_storeu_ps(out + 8 * j, _mm256_mul_ps(acc[g][j], _mm256_set1_ps(inv[g])));
    }
  }
}

/* head h's output (to out) from the `parts` parts of its split context: each part's sum rescaled by exp(its max
 * - the overall max), over the rescaled sums of exp (the log-sum-exp merge; exact up to fp32 rounding).
 * noinline: one machine code for attention() and decode_team, so they round alike. */
static __attribute__((noinline)) void merge_parts(const kf_engine *e, int h, int parts, float *out) {
  const float *ml = e->part_ml + (size_t)h * 2 * parts, *acc = e->part + (size_t)h * parts * KF_HEAD_DIM;
  float m = -INFINITY, l = 0.0f, w[KF_MAX_PARTS];
  for (int c = 0; c < parts; c++) if (ml[2 * c] > m) m = ml[2 * c];
  for (int c = 0; c < parts; c++) { w[c] = expf(ml[2 * c] - m); l += w[c] * ml[2 * c + 1]; }
  for (int d = 0; d < KF_HEAD_DIM; d++) {
    float o = 0.0f;
    for (int c = 0; c < parts; c++) o += w[c] * acc[(size_t)c * KF_HEAD_DIM + d];
    out[d] = o / l;
  }
}
#else
#define KF_ATTEND_GROUP 0
#endif

/* A decode step's attention over `th` threads: one key/value head a work item where the heads divide evenly
 * among the threads, else each head's context split in `parts` (= th) ranges, one item each, merged after.
 * (SmolLM2's 3 heads on 2 threads went 2:1, the thread with two reading two thirds of the cache; split,
 * decode after 1024 tokens measured x1.10 on 2 threads, after 128 x0.98 within the host's noise.) Contexts
 * shorter than KF_SPLIT_MIN are not split: a part of a few keys costs more to merge than it saves. */
#define KF_SPLIT_MIN 64
/* whether the attention of n tokens at positions pos0.. is worth th > 1 threads */
static inline int attention_par(int n, int pos0, int th) {
  return th > 1 && (double)n * KF_HEADS * (pos0 + n) * KF_HEAD_DIM * 2 >= KF_PAR_MIN;
}

/* A decode step's attention (at position pos, on th threads) in work items: KF_KV_HEADS x *parts of
 * attend_group (parts 1 where the heads divide evenly among the threads or the context is short), or, without
 * it, one head an item (*parts 0) */
static int decode_items(int pos, int th, int *parts) {
#if KF_ATTEND_GROUP
  *parts = attention_par(1, pos, th) && KF_KV_HEADS % th != 0 && pos + 1 >= KF_SPLIT_MIN && th <= KF_MAX_PARTS
           ? th : 1;
  return KF_KV_HEADS * *parts;
#else
  (void)th;
  (void)pos;
  *parts = 0;
  return KF_HEADS;
#endif
}

/* item i of decode_items (q: the step's queries, after RoPE); s: the calling thread's scratch of
 * KF_GROUP x e->ctx floats. Its output goes to e->att, or, for a split context, to the head's slots of e->part
 * and e->part_ml (merge_parts combines them). */
static void decode_item(kf_engine *e, int l, int pos, int i, int parts, float *s) {
#if KF_ATTEND_GROUP
  int kvh = i / parts, c = i % parts;
  /* part c of the positions, its bounds on multiples of 4 (attend_group's 4-key blocks) */
  int p0 = c == 0 ? 0 : ((pos + 1) * c / parts) & ~3;
  int p1 = c + 1 == parts ? pos + 1 : ((pos + 1) * (c + 1) / parts) & ~3;
  attend_group(e, l, kvh, p0, p1, s, parts, c);
#else
  (void)parts;
  attend_head(e, l, i, e->qkv + (size_t)i * KF_HEAD_DIM, pos, e->att + (size_t)i * KF_HEAD_DIM, s);
#endif
}

static void attention(kf_engine *e, int l, int n, int pos0, int th) {
  int par = attention_par(n, pos0, th);
  (void)par;
#if KF_ATTEND_GROUP
  if (n == 1) {
    int parts, items = decode_items(pos0, th, &parts);
#pragma omp parallel for schedule(static) num_threads(th) if (par)
    for (int i = 0; i < items; i++)
      decode_item(e, l, pos0, i, parts, e->scores + (size_t)kf_thread() * KF_GROUP * e->ctx);
    if (parts > 1)
      for (int h = 0; h < KF_HEADS; h++) merge_parts(e, h, parts, e->att + (size_t)h * KF_HEAD_DIM);
    return;
  }
#endif
#pragma omp parallel for schedule(dynamic, 1) num_threads(th) if (par)
  for (int i = 0; i < n * KF_HEADS; i++) {
    int t = i / KF_HEADS, head = i % KF_HEADS, tid = kf_thread();
    const float *q = e->qkv + (size_t)t * KF_QKV + head * KF_HEAD_DIM;
    float *out = e->att + (size_t)t * KF_QDIM + head * KF_HEAD_DIM, *s = e->scores + (size_t)tid * e->ctx;
    attend_head(e, l, head, q, pos0 + t, out, s);
  }
}

/* one token's x += add (when add), then out = rmsnorm(x) * w; fused into one pass over x, or two (noinline: one
 * machine code for forward() and decode_team, so they round alike) */
static __attribute__((noinline)) void add_norm1(const kf_engine *e, float *x, const float *add, const kf_tensor *w, float *out) {
#if KF_FUSE_NORM
  rms_norm(x, add, (const float *)w->data, e->eps, out, KF_HIDDEN);
#else
  if (add) for (int i = 0; i < KF_HIDDEN; i++) x[i] += add[i];
  rms_norm(x, NULL, (const float *)w->data, e->eps, out, KF_HIDDEN);
#endif
}

/* add_norm1 over n tokens: e->x += add, e->h = the norm */
static void add_norm(kf_engine *e, const float *add, const kf_tensor *w, int n) {
  for (int t = 0; t < n; t++)
    add_norm1(e, e->x + (size_t)t * KF_HIDDEN, add ? add + (size_t)t * KF_HIDDEN : NULL, w,
              e->h + (size_t)t * KF_HIDDEN);
}

/* RoPE on the n tokens' queries and keys (at positions pos0..), and their keys and values into layer l's cache */
static void rope_kv(kf_engine *e, int l, int n, int pos0) {
  for (int t = 0; t < n; t++) rope_kv_rows(e, l, e->qkv + (size_t)t * KF_QKV, pos0 + t, 0, KF_QKV);
}

/* A build with KF_PROFILE defined (bench/engine_ops.py) adds each op's wall time on the calling thread, summed
 * over every forward, to the exported kf_profile[slot]; without it KF_OP(slot, stmt) is stmt, the same code. */
#ifdef KF_PROFILE
#include <time.h>
enum { KF_P_QKV, KF_P_ROPE_KV, KF_P_ATTN, KF_P_O, KF_P_NORM, KF_P_GATE_UP, KF_P_SILU, KF_P_DOWN, KF_P_HEAD, KF_P_N };
double kf_profile[KF_P_N];
static double kf_clock(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
#define KF_OP(slot, ...) do { double t0_ = kf_clock(); __VA_ARGS__; kf_profile[KF_P_##slot] += kf_clock() - t0_; } while (0)
#else
#define KF_OP(slot, ...) __VA_ARGS__
#endif

/* an op's threads: the design's op_threads entry (KF_T_*) where it is below the engine's count, else all */
#define KF_OP_THREADS(n, th) ((n) > 0 && (n) < (th) ? (n) : (th))

#if KF_TEAM_STEP
static void decode_team(kf_engine *e, int32_t tok, float *logits);   /* team.c */
#endif

/* n <= KF_CHUNK tokens at positions e->pos..; logits: NULL (none), the last token's, or all n (all) */
static void forward(kf_engine *e, const int32_t *tok, int n, float *logits, int all) {
#if KF_TEAM_STEP
  if (n == 1 && e->threads > 1) { decode_team(e, tok[0], logits); return; }
#endif
  int pos0 = e->pos, th = e->threads;
  int t_qkv = KF_OP_THREADS(KF_T_QKV, th), t_attn = KF_OP_THREADS(KF_T_ATTN, th), t_o = KF_OP_THREADS(KF_T_O, th);
  int t_gu = KF_OP_THREADS(KF_T_GATE_UP, th), t_down = KF_OP_THREADS(KF_T_DOWN, th);
  int t_head = KF_OP_THREADS(KF_T_HEAD, th);
  for (int t = 0; t < n; t++) get_row(e->embd, tok[t], e->x + (size_t)t * KF_HIDDEN);
  add_norm(e, NULL, e->layer[0].attn_norm, n);
  for (int l = 0; l < KF_BLOCKS; l++) {
    const kf_layer *L = &e->layer[l];
#if KF_FUSE_QKV
    KF_OP(QKV, matmul(L->qkv, e->h, KF_HIDDEN, n, e->qkv, KF_QKV, e->xs, t_qkv));
#else
    KF_OP(QKV, matmul(L->q, e->h, KF_HIDDEN, n, e->qkv, KF_QKV, e->xs, t_qkv));
    KF_OP(QKV, matmul(L->k, e->h, KF_HIDDEN, n, e->qkv + KF_QDIM, KF_QKV, e->xs, t_qkv));
    KF_OP(QKV, matmul(L->v, e->h, KF_HIDDEN, n, e->qkv + KF_QDIM + KF_KVDIM, KF_QKV, e->xs, t_qkv));
#endif
    KF_OP(ROPE_KV, rope_kv(e, l, n, pos0));
    KF_OP(ATTN, attention(e, l, n, pos0, t_attn));
    KF_OP(O, matmul(L->o, e->att, KF_QDIM, n, e->h, KF_HIDDEN, e->xs, t_o));
    KF_OP(NORM, add_norm(e, e->h, L->ffn_norm, n));
#if KF_FUSE_GATE_UP
    KF_OP(GATE_UP, matmul(L->gate_up, e->h, KF_HIDDEN, n, e->gu, 2 * KF_FFN, e->xs, t_gu));
#else
    KF_OP(GATE_UP, matmul(L->gate, e->h, KF_HIDDEN, n, e->gu, 2 * KF_FFN, e->xs, t_gu));
    KF_OP(GATE_UP, matmul(L->up, e->h, KF_HIDDEN, n, e->gu + KF_FFN, 2 * KF_FFN, e->xs, t_gu));
#endif
    KF_OP(SILU, for (int t = 0; t < n; t++)
                  silu_mul(e->gu + (size_t)t * 2 * KF_FFN, e->gu + (size_t)t * 2 * KF_FFN + KF_FFN, KF_FFN));
    KF_OP(DOWN, matmul(L->down, e->gu, 2 * KF_FFN, n, e->h, KF_HIDDEN, e->xs, t_down));
    KF_OP(NORM, add_norm(e, e->h, l + 1 < KF_BLOCKS ? e->layer[l + 1].attn_norm : e->out_norm, n));
  }
  e->pos = pos0 + n;
  if (logits && all) KF_OP(HEAD, matmul(e->embd, e->h, KF_HIDDEN, n, logits, KF_VOCAB, e->xs, t_head));
  else if (logits) KF_OP(HEAD, matmul(e->embd, e->h + (size_t)(n - 1) * KF_HIDDEN, KF_HIDDEN, 1, logits, KF_VOCAB, e->xs, t_head));
}

int kf_prefill(void *p, const int32_t *tokens, int n, float *logits, int all_logits) {
  kf_engine *e = (kf_engine *)p;
  if (!e || !tokens || n <= 0 || !logits) { set_error("kf_prefill: bad arguments (n %d)", n); return -1; }
  for (int i = 0; i < n; i++)
    if (tokens[i] < 0 || tokens[i] >= KF_VOCAB) { set_error("kf_prefill: token %d at %d is out of range", tokens[i], i); return -2; }
  if (e->pos + n > e->ctx) { set_error("kf_prefill: %d positions exceed the capacity %d", e->pos + n, e->ctx); return -3; }
  for (int i = 0; i < n; i += KF_CHUNK) {
    int m = n - i < KF_CHUNK ? n - i : KF_CHUNK;
    float *out = all_logits ? logits + (size_t)i * KF_VOCAB : (i + m == n ? logits : NULL);
    forward(e, tokens + i, m, out, all_logits);
  }
  return 0;
}

int kf_decode_step(void *p, int32_t token, float *logits) { return kf_prefill(p, &token, 1, logits, 0); }

void kf_reset(void *p) { if (p) ((kf_engine *)p)->pos = 0; }

int kf_position(void *p) { return p ? ((kf_engine *)p)->pos : -1; }

int kf_abi_version(void) { return KF_ABI_VERSION; }

const char *kf_design_id(void) { return KF_DESIGN_ID; }

const char *kf_last_error(void) { return kf_error; }
