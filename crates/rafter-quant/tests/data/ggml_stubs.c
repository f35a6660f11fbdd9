// The four symbols ggml-quants.c takes from ggml.c, for the throwaway reference harness
// built by gen_reference.py. Only ggml_row_size/ggml_type_size are reached (by the
// quantize_* wrappers, which the harness does not call); the rest abort.
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <stdint.h>

void ggml_abort(const char *file, int line, const char *fmt, ...) {
    fprintf(stderr, "ggml_abort at %s:%d (%s)\n", file, line, fmt);
    abort();
}
size_t ggml_type_size(int type) { (void)type; abort(); }
size_t ggml_row_size(int type, int64_t ne) { (void)type; (void)ne; abort(); }
const char *ggml_type_name(int type) { (void)type; return "?"; }
