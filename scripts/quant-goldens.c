// Quantize the golden source rows with llama.cpp's own ggml, for tests/golden/quants.
//
//   quant-goldens SOURCE.f32 ROWS N_PER_ROW OUT_DIR TYPE...
//
// For each TYPE (a ggml type name: q1_0, q2_k, iq2_xs, ...) writes OUT_DIR/<TYPE>.bin (the rows
// quantized by ggml_quantize_chunk, each row on its own, as llama-quantize does) and
// OUT_DIR/<TYPE>.f32 (those blocks decoded by the type's to_float, ggml's dequantizer), and
// prints one JSON line per type for index.json. Types that need an importance matrix get a
// uniform one (every column weight 1), which is stated in the JSON line.
//
// Built and run by scripts/quant-goldens.sh against a llama.cpp build.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <math.h>

#include "ggml.h"
#include "ggml-cpu.h"

static float *read_f32(const char *path, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    float *x = malloc(n * sizeof(float));
    if (fread(x, sizeof(float), n, f) != n) { fprintf(stderr, "%s: short read\n", path); exit(1); }
    fclose(f);
    return x;
}

static void write_file(const char *dir, const char *name, const char *ext, const void *data, size_t bytes) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.%s", dir, name, ext);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, bytes, f) != bytes) { perror(path); exit(1); }
    fclose(f);
}

static int type_by_name(const char *name) {
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const char *n = ggml_type_name((enum ggml_type) t);
        if (n && strcasecmp(n, name) == 0 && ggml_row_size((enum ggml_type) t, ggml_blck_size((enum ggml_type) t)) > 0) {
            return t;
        }
    }
    return -1;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s SOURCE.f32 ROWS N_PER_ROW OUT_DIR TYPE...\n", argv[0]);
        return 2;
    }
    const long rows = atol(argv[2]), n = atol(argv[3]);
    if (rows <= 0 || n <= 0 || rows > 1024 || n > (1 << 20)) {
        fprintf(stderr, "ROWS and N_PER_ROW must be small positive numbers\n");
        return 2;
    }
    float *src = read_f32(argv[1], (size_t) (rows * n));
    ggml_cpu_init();
    float *ones = malloc(n * sizeof(float));
    for (long i = 0; i < n; i++) ones[i] = 1.0f;
    for (int a = 5; a < argc; a++) {
        int t = type_by_name(argv[a]);
        if (t < 0) { fprintf(stderr, "unknown ggml type %s\n", argv[a]); return 2; }
        enum ggml_type type = (enum ggml_type) t;
        if (n % ggml_blck_size(type) != 0) { fprintf(stderr, "%s: N_PER_ROW not whole blocks\n", argv[a]); return 2; }
        const int needs_imatrix = ggml_quantize_requires_imatrix(type);
        size_t row_bytes = ggml_row_size(type, n);
        unsigned char *q = calloc(rows, row_bytes);
        ggml_quantize_init(type);
        size_t written = ggml_quantize_chunk(type, src, q, 0, rows, n, needs_imatrix ? ones : NULL);
        if (written != rows * row_bytes) { fprintf(stderr, "%s: wrote %zu bytes\n", argv[a], written); return 1; }
        float *y = malloc(rows * n * sizeof(float));
        const struct ggml_type_traits *tr = ggml_get_type_traits(type);
        for (long r = 0; r < rows; r++) tr->to_float(q + r * row_bytes, y + r * n, n);
        double se = 0;
        for (long i = 0; i < rows * n; i++) se += (double) (y[i] - src[i]) * (y[i] - src[i]);
        char upper[64];
        snprintf(upper, sizeof upper, "%s", ggml_type_name(type));
        for (char *c = upper; *c; c++) if (*c >= 'a' && *c <= 'z') *c -= 32;
        write_file(argv[4], upper, "bin", q, rows * row_bytes);
        write_file(argv[4], upper, "f32", y, rows * n * sizeof(float));
        printf("{\"type\": \"%s\", \"ggml_type_id\": %d, \"shape\": [%ld, %ld], \"block_size\": %ld, "
               "\"bytes_per_block\": %zu, \"bin\": \"%s.bin\", \"f32\": \"%s.f32\", \"bin_bytes\": %zu, "
               "\"rmse_vs_source\": %.17g, \"imatrix\": \"%s\"}\n",
               upper, t, rows, n, (long) ggml_blck_size(type), ggml_type_size(type), upper, upper,
               rows * row_bytes, sqrt(se / (double) (rows * n)), needs_imatrix ? "uniform" : "none");
        free(q);
        free(y);
    }
    free(ones);
    free(src);
    return 0;
}
