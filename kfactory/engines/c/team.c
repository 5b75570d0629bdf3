/* ---- team.c: a decode step in one parallel region (design team "step") ------------------------------------
 * forward() opens a parallel region for every matvec and the attention of a block: ~5 a block, 151 a SmolLM2
 * step, each a fork (the idle threads woken) and a join, with the residual adds, norms, RoPE and SiLU between
 * them run by one thread while the others wait. decode_team opens one region a step: each thread computes the
 * small element-wise ops itself (on its own copy of the residual stream: the same values, computed twice), takes
 * its share of each matvec's rows from its own copy of x's digits, ropes the pairs of its own rows of Q and K and
 * writes its own K and V rows into the cache, and the threads meet at a barrier wherever one needs what another
 * wrote: 5 a block (after QKV, the attention, O, gate/up and down). Every value is computed by the same code as
 * forward()'s (matmul_prep, matmul_share, rope_kv_rows, decode_item, merge_parts, add_norm1, silu_mul), so the
 * logits are bit-identical; only who computes what, and when the threads wait, differ. */
#if KF_TEAM_STEP

/* The timed build (KF_PROFILE) adds thread 0's time in each op to the op's slot (its waits at the barriers are
 * in none: the step's time less the slots') */
#ifdef KF_PROFILE
#define KF_TEAM_OP(id, slot, ...) do { if ((id) == 0) KF_OP(slot, __VA_ARGS__); else { __VA_ARGS__; } } while (0)
#else
#define KF_TEAM_OP(id, slot, ...) __VA_ARGS__
#endif

/* Thread id's part of y = W x for one token, on `op_nt` of the team's nt threads (KF_OP_THREADS; one where
 * matmul would not go parallel); a searched kernel takes the whole matrix on thread 0, as matmul runs it on the
 * calling thread. xs: the thread's scratch for x's forms. Its rows [*r0, *r1) (empty when it has none). */
static void team_matvec(const kf_tensor *w, const float *x, float *y, float *xs, int id, int nt, int op_nt,
                        int *r0, int *r1) {
  *r0 = *r1 = 0;
  if (has_searched(w)) {
    if (id == 0 && searched_matvec(w, x, y)) *r1 = w->rows;
    return;
  }
  int n_eff = matmul_par(w, 1, op_nt) ? (op_nt < nt ? op_nt : nt) : 1;
  if (id >= n_eff) return;
  float *xk = matmul_prep(w, x, w->cols, 1, xs);
  matmul_share(w, x, w->cols, 1, y, 0, xs, xk, id, n_eff, r0, r1);
}

/* the QKV product's rows [r0, r1) (of a matrix whose row 0 is qkv-buffer row `at`) roped and cached */
static void team_qkv(kf_engine *e, int l, const kf_tensor *w, int at, const float *h, float *xs, int id, int nt,
                     int op_nt, int pos) {
  int r0, r1;
  team_matvec(w, h, e->qkv + at, xs, id, nt, op_nt, &r0, &r1);
  if (r0 < r1) rope_kv_rows(e, l, e->qkv, pos, at + r0, at + r1);
}

static void decode_team(kf_engine *e, int32_t tok, float *logits) {
  int pos = e->pos, th = e->threads;
  int t_qkv = KF_OP_THREADS(KF_T_QKV, th), t_attn = KF_OP_THREADS(KF_T_ATTN, th), t_o = KF_OP_THREADS(KF_T_O, th);
  int t_gu = KF_OP_THREADS(KF_T_GATE_UP, th), t_down = KF_OP_THREADS(KF_T_DOWN, th);
  int t_head = KF_OP_THREADS(KF_T_HEAD, th);
  get_row(e->embd, tok, e->x);
#pragma omp parallel num_threads(th)
  {
    int id = kf_thread(), nt = kf_threads();
    float *x = e->team + (size_t)id * TEAM_FLOATS, *h = x + KF_HIDDEN, *att = h + KF_HIDDEN, *g = att + KF_QDIM;
    float *xs = g + KF_FFN, *sc = e->scores + (size_t)id * KF_GROUP * e->ctx;
    /* the attention's items as attention() cuts them for its t_attn threads (the same parts, so the same sums,
     * even where OpenMP gave the team fewer threads), each thread a contiguous run of them */
    int a_nt = attention_par(1, pos, t_attn) ? (t_attn < nt ? t_attn : nt) : 1, parts, i0 = 0, i1 = 0;
    int items = decode_items(pos, t_attn, &parts);
    if (id < a_nt) share_of(items, id, a_nt, &i0, &i1);
    memcpy(x, e->x, KF_HIDDEN * sizeof *x);
    add_norm1(e, x, NULL, e->layer[0].attn_norm, h);
    for (int l = 0; l < KF_BLOCKS; l++) {
      const kf_layer *L = &e->layer[l];
#if KF_FUSE_QKV
      KF_TEAM_OP(id, QKV, team_qkv(e, l, L->qkv, 0, h, xs, id, nt, t_qkv, pos));
#else
      KF_TEAM_OP(id, QKV, team_qkv(e, l, L->q, 0, h, xs, id, nt, t_qkv, pos);
                 team_qkv(e, l, L->k, KF_QDIM, h, xs, id, nt, t_qkv, pos);
                 team_qkv(e, l, L->v, KF_QDIM + KF_KVDIM, h, xs, id, nt, t_qkv, pos));
#endif
#pragma omp barrier
      KF_TEAM_OP(id, ATTN, for (int i = i0; i < i1; i++) decode_item(e, l, pos, i, parts, sc));
#pragma omp barrier
      const float *a = e->att;
#if KF_ATTEND_GROUP   /* (split contexts only with attend_group: decode_items gives parts 0 without it) */
      if (parts > 1) {   /* every thread merges every head: its own copy of the attention's output */
        for (int hd = 0; hd < KF_HEADS; hd++) merge_parts(e, hd, parts, att + (size_t)hd * KF_HEAD_DIM);
        a = att;
      }
#else
      (void)att;
#endif
      int r0, r1;
      KF_TEAM_OP(id, O, team_matvec(L->o, a, e->h, xs, id, nt, t_o, &r0, &r1));
#pragma omp barrier
      KF_TEAM_OP(id, NORM, add_norm1(e, x, e->h, L->ffn_norm, h));
#if KF_FUSE_GATE_UP
      KF_TEAM_OP(id, GATE_UP, team_matvec(L->gate_up, h, e->gu, xs, id, nt, t_gu, &r0, &r1));
#else
      KF_TEAM_OP(id, GATE_UP, team_matvec(L->gate, h, e->gu, xs, id, nt, t_gu, &r0, &r1);
                 team_matvec(L->up, h, e->gu + KF_FFN, xs, id, nt, t_gu, &r0, &r1));
#endif
#pragma omp barrier
      KF_TEAM_OP(id, SILU, memcpy(g, e->gu, KF_FFN * sizeof *g); silu_mul(g, e->gu + KF_FFN, KF_FFN));
      KF_TEAM_OP(id, DOWN, team_matvec(L->down, g, e->h, xs, id, nt, t_down, &r0, &r1));
#pragma omp barrier
      KF_TEAM_OP(id, NORM, add_norm1(e, x, e->h, l + 1 < KF_BLOCKS ? e->layer[l + 1].attn_norm : e->out_norm, h));
    }
    int r0, r1;
    if (logits) KF_TEAM_OP(id, HEAD, team_matvec(e->embd, h, logits, xs, id, nt, t_head, &r0, &r1));
  }
  e->pos = pos + 1;
}
#endif
