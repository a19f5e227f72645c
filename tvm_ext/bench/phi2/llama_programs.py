"""Small programs of ours against libllama, built with llama.cpp's tree (``llama_cpp.find_or_build`` adds each
as an example of the tree): their C++ sources.

``tvm-ext-greedy MODEL STEPS THREADS LOGITS_OUT ID [ID ...]`` evaluates the prompt's ids in one batch, then
takes the argmax of the last position's logits ``steps`` times (no sampler: the first of equal logits, as
``np.argmax``), printing each id on a line and writing every step's logits (float32, the vocabulary long) to
LOGITS_OUT (``llama_greedy.greedy`` runs it).
"""

GREEDY = "tvm-ext-greedy"
GREEDY_CPP = r"""// tvm-ext-greedy MODEL STEPS THREADS LOGITS_OUT ID [ID ...]: greedy ids, one a line; logits to a file
#include "llama.h"
#include <cstdio>
#include <cstdlib>
#include <vector>

static void quiet(enum ggml_log_level, const char *, void *) {}

int main(int argc, char ** argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s MODEL STEPS THREADS LOGITS_OUT ID [ID ...]\n", argv[0]);
        return 2;
    }
    const int steps = atoi(argv[2]), threads = atoi(argv[3]);
    std::vector<llama_token> cur;
    for (int i = 5; i < argc; i++) cur.push_back(atoi(argv[i]));
    llama_log_set(quiet, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (model == nullptr) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = cur.size() + steps;
    cp.n_batch = cur.size();
    cp.n_threads = cp.n_threads_batch = threads;
    llama_context * ctx = llama_init_from_model(model, cp);
    FILE * out = fopen(argv[4], "wb");
    if (ctx == nullptr || out == nullptr || n_vocab <= 0) {
        fprintf(stderr, "no context, output file or vocabulary\n");
        return 1;
    }
    for (int s = 0; s < steps; s++) {
        if (llama_decode(ctx, llama_batch_get_one(cur.data(), cur.size())) != 0) {
            fprintf(stderr, "llama_decode failed at step %d\n", s);
            return 1;
        }
        const float * logits = llama_get_logits_ith(ctx, -1);
        fwrite(logits, sizeof(float), n_vocab, out);
        int best = 0;
        for (int v = 1; v < n_vocab; v++) if (logits[v] > logits[best]) best = v;
        printf("%d\n", best);
        cur.assign(1, best);
    }
    fclose(out);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
"""
PROGRAMS = {GREEDY: GREEDY_CPP}
