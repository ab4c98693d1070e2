/* The bilinear box resize both image extensions share (storebench._resize and
 * storebench._jpegwindow): see _resize.c for what it computes. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "_imagebox.h"

#define FIXED_BITS 22 /* 8 bits of result and 2 of headroom in a 32-bit sum */

static double triangle(double x) {
    if (x < 0.0) x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* Taps of each output position along one axis: where its source run starts (first[i]),
 * how long it is (count[i]) and its fixed-point weights (weights[i * taps ...]). Returns
 * the taps per position, or 0 when out of memory. */
static int axis_taps(int in_size, float in0, float in1, int out_size, int antialias,
                     int **first_out, int **count_out, int32_t **weights_out) {
    double scale = (double)(in1 - in0) / out_size;
    double filter_scale = (antialias && scale > 1.0) ? scale : 1.0;
    double support = filter_scale; /* the triangle's support is 1 */
    int taps = (int)ceil(support) * 2 + 1;
    int *first = malloc(sizeof(int) * (size_t)out_size);
    int *count = malloc(sizeof(int) * (size_t)out_size);
    int32_t *weights = malloc(sizeof(int32_t) * (size_t)out_size * (size_t)taps);
    double *w = malloc(sizeof(double) * (size_t)taps);
    if (!first || !count || !weights || !w) {
        free(first);
        free(count);
        free(weights);
        free(w);
        return 0;
    }
    for (int i = 0; i < out_size; i++) {
        double center = in0 + (i + 0.5) * scale;
        int lo = (int)(center - support + 0.5);
        int hi = (int)(center + support + 0.5);
        if (lo < 0) lo = 0;
        if (hi > in_size) hi = in_size;
        int n = hi - lo;
        double total = 0.0;
        for (int k = 0; k < n; k++) {
            w[k] = triangle((k + lo - center + 0.5) / filter_scale);
            total += w[k];
        }
        for (int k = 0; k < taps; k++) {
            double v = k < n ? (total != 0.0 ? w[k] / total : w[k]) : 0.0;
            weights[(size_t)i * taps + k] =
                (int32_t)(v < 0 ? -0.5 + v * (1 << FIXED_BITS) : 0.5 + v * (1 << FIXED_BITS));
        }
        first[i] = lo;
        count[i] = n;
    }
    free(w);
    *first_out = first;
    *count_out = count;
    *weights_out = weights;
    return taps;
}

static inline uint8_t clip8(int32_t sum) {
    int32_t v = sum >> FIXED_BITS;
    return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v;
}

/* The pixels of a packed run written `stride` bytes apart; each channel count is its own
 * loop, so that every copy is a fixed-size move the compiler inlines. */
static inline void scatter(uint8_t *to, Py_ssize_t stride, const uint8_t *from, int pixels,
                           int channels) {
#define SCATTER(C)                                                                         \
    for (int i = 0; i < pixels; i++) memcpy(to + (size_t)i * stride, from + (size_t)i * (C), (C));
    switch (channels) {
        case 1: SCATTER(1) break;
        case 2: SCATTER(2) break;
        case 3: SCATTER(3) break;
        default: SCATTER(4) break;
    }
#undef SCATTER
}

/* Compiled for AVX2 and the x86-64 baseline; the loader picks what the CPU runs (the
 * vertical pass's 32-bit multiplies have no SSE2 form, so the baseline loop is scalar). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
__attribute__((target_clones("avx2", "default")))
#endif
int resize_box(const uint8_t *src, Py_ssize_t src_row_stride, int src_height, int src_width,
               int channels, const float box[4], uint8_t *dst, Py_ssize_t dst_row_stride,
               int dst_height, int dst_width, int flip, int antialias) {
    int *xfirst = NULL, *xcount = NULL, *yfirst = NULL, *ycount = NULL;
    int32_t *xweights = NULL, *yweights = NULL, *acc = NULL;
    uint8_t *rows = NULL, *line = NULL;
    int status = -1;
    int ytaps = axis_taps(src_height, box[1], box[3], dst_height, antialias, &yfirst, &ycount,
                          &yweights);
    if (!ytaps) return -1;
    int xtaps = axis_taps(src_width, box[0], box[2], dst_width, antialias, &xfirst, &xcount,
                          &xweights);
    if (!xtaps) goto done;
    /* The vertical pass first, over only the source columns the horizontal pass reads,
     * along whole rows (vectorised); it stores its result transposed, column by column, so
     * that the horizontal pass also runs along contiguous memory: each output column sums
     * whole source columns. Only the stores at the end of each pass are strided. */
    int col0 = xfirst[0];
    int columns = xfirst[dst_width - 1] + xcount[dst_width - 1] - col0;
    size_t row_len = (size_t)columns * channels;
    size_t column_len = (size_t)dst_height * channels;
    uint8_t *restrict transposed = malloc(row_len * (size_t)dst_height);
    rows = transposed;
    size_t longest = row_len > column_len ? row_len : column_len;
    acc = malloc(sizeof(int32_t) * longest);
    line = malloc(longest);
    if (!rows || !acc || !line) goto done;
    int32_t *restrict sums = acc;
    for (int y = 0; y < dst_height; y++) {
        const int32_t *k = yweights + (size_t)y * ytaps;
        for (size_t i = 0; i < row_len; i++) sums[i] = 1 << (FIXED_BITS - 1);
        for (int t = 0; t < ycount[y]; t++) {
            const uint8_t *restrict in = src + (size_t)(yfirst[y] + t) * src_row_stride +
                                         (size_t)col0 * channels;
            int32_t weight = k[t];
            for (size_t i = 0; i < row_len; i++) sums[i] += in[i] * weight;
        }
        for (size_t i = 0; i < row_len; i++) line[i] = clip8(sums[i]);
        scatter(transposed + (size_t)y * channels, (Py_ssize_t)column_len, line, columns,
                channels);
    }
    for (int x = 0; x < dst_width; x++) {
        const int32_t *k = xweights + (size_t)x * xtaps;
        for (size_t i = 0; i < column_len; i++) sums[i] = 1 << (FIXED_BITS - 1);
        for (int t = 0; t < xcount[x]; t++) {
            const uint8_t *restrict in = transposed + (size_t)(xfirst[x] - col0 + t) * column_len;
            int32_t weight = k[t];
            for (size_t i = 0; i < column_len; i++) sums[i] += in[i] * weight;
        }
        uint8_t *out = dst + (size_t)(flip ? dst_width - 1 - x : x) * channels;
        for (size_t i = 0; i < column_len; i++) line[i] = clip8(sums[i]);
        scatter(out, dst_row_stride, line, dst_height, channels);
    }
    status = 0;
done:
    free(line);
    free(acc);
    free(rows);
    free(xfirst);
    free(xcount);
    free(xweights);
    free(yfirst);
    free(ycount);
    free(yweights);
    return status;
}

/* A (H, W, C) uint8 view whose rows may be strided but whose pixels are packed. */
int image_view(PyObject *obj, Py_buffer *view, int writable, const char *what) {
    int flags = PyBUF_STRIDES | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
    if (view->ndim != 3 || view->itemsize != 1 ||
        (view->format && strcmp(view->format, "B") != 0)) {
        PyErr_Format(PyExc_ValueError, "%s must be a uint8 (height, width, channels) array",
                     what);
        goto fail;
    }
    if (view->strides[2] != 1 || view->strides[1] != view->shape[2] || view->strides[0] <= 0) {
        PyErr_Format(PyExc_ValueError, "%s must hold each row's pixels packed", what);
        goto fail;
    }
    if (view->shape[2] < 1 || view->shape[2] > 4 || view->shape[0] < 1 || view->shape[1] < 1 ||
        view->shape[0] > INT32_MAX || view->shape[1] > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s must be a non-empty image of 1 to 4 channels",
                     what);
        goto fail;
    }
    return 0;
fail:
    PyBuffer_Release(view);
    return -1;
}

int check_box(const float box[4], int height, int width) {
    if (!(box[0] >= 0 && box[1] >= 0 && box[2] <= width && box[3] <= height &&
          box[0] < box[2] && box[1] < box[3])) {
        char message[160]; /* PyErr_Format has no %g */
        snprintf(message, sizeof message,
                 "box (%g, %g, %g, %g) must lie inside the %d x %d image and be non-empty",
                 box[0], box[1], box[2], box[3], width, height);
        PyErr_SetString(PyExc_ValueError, message);
        return -1;
    }
    return 0;
}

