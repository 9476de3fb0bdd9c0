// llama.cpp's own teacher-forced probabilities for one golden case, used by
// scripts/llama-spread.py to measure how far llama.cpp moves from its own goldens when only the
// batching of the same tokens changes.
//
// stdin:  n_prompt n_steps, then the n_prompt + n_steps - 1 ids (prompt + golden tokens but the
//         last), then the 10 golden ids of every step.
// argv:   model path, mode: "one-batch" (every id in one llama_decode, the way a teacher-forced
//         test feeds them), "server" (what llama-server did when it wrote the goldens: one id
//         per generated step, and for a sliding-window model the prompt cut 4 + n_ubatch and 4
//         ids before its end, where the server checkpoints the window) or "no-cut" (the same
//         without those cuts: the prompt in one decode, then one id per step).
// stdout: per step, llama.cpp's argmax, its probability, and the probabilities of the 10 golden ids.
#include "llama.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

int main(int argc, char ** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODEL one-batch|server|no-cut < case\n", argv[0]);
        return 2;
    }
    const bool server = strcmp(argv[2], "server") == 0;
    const bool no_cut = strcmp(argv[2], "no-cut") == 0;
    int np = 0, ns = 0;
    if (scanf("%d %d", &np, &ns) != 2 || np < 1 || ns < 1) {
        fprintf(stderr, "bad header\n");
        return 2;
    }
    const int n = np + ns - 1;
    std::vector<llama_token> ids(n);
    std::vector<int> gids(10 * ns);
    for (auto & x : ids) if (scanf("%d", &x) != 1) return 2;
    for (auto & x : gids) if (scanf("%d", &x) != 1) return 2;

    llama_log_set([](enum ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();
    llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) return 3;
    // The golden server's settings: -c 4096 -b 2048 -ub 512 -t 2 -fa off.
    auto cp = llama_context_default_params();
    cp.n_ctx = 4096;
    cp.n_batch = 2048;
    cp.n_ubatch = 512;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    llama_context * ctx = llama_init_from_model(model, cp);
    const int nv = llama_vocab_n_tokens(llama_model_get_vocab(model));

    // Pieces [start, end) decoded one llama_decode each; logits of every id from np - 1 on.
    std::vector<std::pair<int, int>> pieces;
    if (server || no_cut) {
        int start = 0;
        if (server && llama_model_n_swa(model) > 0) {
            for (int back : {4 + (int) cp.n_ubatch, 4}) {
                if (np - back > start) {
                    pieces.push_back({start, np - back});
                    start = np - back;
                }
            }
        }
        pieces.push_back({start, np});
        for (int i = np; i < n; i++) pieces.push_back({i, i + 1});
    } else {
        pieces.push_back({0, n});
    }
    llama_batch batch = llama_batch_init(n, 0, 1);
    std::vector<std::vector<float>> logits;
    for (auto [start, end] : pieces) {
        batch.n_tokens = 0;
        for (int i = start; i < end; i++) {
            const int k = batch.n_tokens++;
            batch.token[k] = ids[i];
            batch.pos[k] = i;
            batch.n_seq_id[k] = 1;
            batch.seq_id[k][0] = 0;
            batch.logits[k] = i >= np - 1;
        }
        if (llama_decode(ctx, batch) != 0) return 4;
        for (int i = start; i < end; i++) {
            if (i < np - 1) continue;
            const float * l = llama_get_logits_ith(ctx, i - start);
            logits.emplace_back(l, l + nv);
        }
    }
    for (int s = 0; s < ns; s++) {
        const auto & l = logits[s];
        int am = 0;
        for (int i = 1; i < nv; i++) if (l[i] > l[am]) am = i;
        double sum = 0;
        for (int i = 0; i < nv; i++) sum += exp((double) l[i] - l[am]);
        printf("%d %.9f", am, 1.0 / sum);
        for (int j = 0; j < 10; j++) printf(" %.9f", exp((double) l[gids[10 * s + j]] - l[am]) / sum);
        printf("\n");
    }
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
