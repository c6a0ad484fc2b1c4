/*
 * plan.c — the shard plan: which layers, heads, FFN columns and vocab rows a
 * rank (tp_rank, pp_stage) owns (Megatron splits, DESIGN.md "Sharding").
 *
 * Heads are split evenly (n_head % tp == 0). KV heads are split when
 * n_kv % tp == 0; when tp > n_kv and tp % n_kv == 0 each rank keeps the one KV
 * head its query heads read (GQA groups are contiguous, so a rank's n_head/tp
 * query heads all map to the same KV head). Layers go to stages in contiguous,
 * balanced ranges; the vocabulary in balanced, possibly uneven, row ranges.
 */
#include <stdio.h>
#include <string.h>

#include "model.h"

void model_vocab_range(int n_vocab, int tp, int r, int *v0, int *n) {
    // Balanced: the first n_vocab % tp ranks get one extra row.
    int base = n_vocab / tp, extra = n_vocab % tp;
    *v0 = r * base + TPI_MIN(r, extra);
    *n = base + (r < extra ? 1 : 0);
}

int model_plan_make(struct model_plan *p, const struct model_config *c, int tp, int pp,
                    int tp_rank, int pp_stage, const int *pp_layers, int n_pp_layers,
                    struct tpi_error *err) {
    memset(p, 0, sizeof *p);
    if (tp < 1 || pp < 1 || tp_rank < 0 || tp_rank >= tp || pp_stage < 0 || pp_stage >= pp)
        return tpi_err(err, TPI_ERR_INVALID, "shard plan: bad rank (tp_rank %d of %d, stage %d of %d)",
                       tp_rank, tp, pp_stage, pp);
    p->tp = tp;
    p->pp = pp;
    p->tp_rank = tp_rank;
    p->pp_stage = pp_stage;

    // ---- heads ----
    if (c->n_head % tp != 0)
        return tpi_err(err, TPI_ERR_INVALID,
                       "--tp %d does not divide the model's %d attention heads (%d KV heads): use a "
                       "tp that divides %d, or split layers across ranks with --pp instead",
                       tp, c->n_head, c->n_head_kv, c->n_head);
    p->n_head_local = c->n_head / tp;
    p->head0 = tp_rank * p->n_head_local;
    if (c->n_head_kv % tp == 0) {
        p->n_kv_local = c->n_head_kv / tp;
        p->kv_head0 = tp_rank * p->n_kv_local;
    } else if (tp > c->n_head_kv && tp % c->n_head_kv == 0) {
        // tp / n_kv consecutive ranks share one KV head; each holds a copy.
        p->n_kv_local = 1;
        p->kv_head0 = tp_rank / (tp / c->n_head_kv);
        p->kv_replicated = true;
    } else {
        return tpi_err(err, TPI_ERR_INVALID,
                       "--tp %d cannot split the model's %d KV heads (%d query heads): tp must "
                       "divide %d or be a multiple of it; use --pp to split layers instead",
                       tp, c->n_head_kv, c->n_head, c->n_head_kv);
    }

    // ---- FFN ----
    if (c->n_ff % tp != 0)
        return tpi_err(err, TPI_ERR_INVALID,
                       "--tp %d does not divide the FFN size %d; use --pp to split layers instead",
                       tp, c->n_ff);
    p->n_ff_local = c->n_ff / tp;
    p->ff0 = tp_rank * p->n_ff_local;

    // ---- vocab ----
    if (c->n_vocab < tp)
        return tpi_err(err, TPI_ERR_INVALID,
                       "--tp %d exceeds the model's vocabulary of %d tokens: every rank needs a "
                       "row of the output",
                       tp, c->n_vocab);
    model_vocab_range(c->n_vocab, tp, tp_rank, &p->vocab0, &p->n_vocab_local);
    p->n_vocab_pad = (c->n_vocab + tp - 1) / tp;

    // ---- layers ----
    if (pp > c->n_layer)
        return tpi_err(err, TPI_ERR_INVALID,
                       "--pp %d exceeds the model's %d layers: every stage needs at least one layer",
                       pp, c->n_layer);
    if (pp > MODEL_MAX_STAGES)
        return tpi_err(err, TPI_ERR_INVALID, "--pp %d exceeds the limit of %d stages", pp,
                       MODEL_MAX_STAGES);
    if (pp_layers) {
        if (n_pp_layers != pp)
            return tpi_err(err, TPI_ERR_INVALID, "--pp-layers lists %d stages but --pp is %d",
                           n_pp_layers, pp);
        int sum = 0;
        for (int s = 0; s < pp; s++) {
            if (pp_layers[s] < 1)
                return tpi_err(err, TPI_ERR_INVALID,
                               "--pp-layers: stage %d has %d layers (at least 1 needed)", s,
                               pp_layers[s]);
            p->stage_layer0[s] = sum;
            sum += pp_layers[s];
        }
        if (sum != c->n_layer)
            return tpi_err(err, TPI_ERR_INVALID,
                           "--pp-layers adds up to %d layers but the model has %d", sum,
                           c->n_layer);
        p->stage_layer0[pp] = sum;
    } else {
        // Balanced: the first n_layer % pp stages get one extra layer.
        int base = c->n_layer / pp, extra = c->n_layer % pp;
        for (int s = 0; s <= pp; s++) p->stage_layer0[s] = s * base + TPI_MIN(s, extra);
    }
    p->layer0 = p->stage_layer0[pp_stage];
    p->n_layer_stage = p->stage_layer0[pp_stage + 1] - p->layer0;
    p->is_first = pp_stage == 0;
    p->is_last = pp_stage == pp - 1;
    return TPI_OK;
}
