/* The box resize shared by storebench's image extensions (_imagebox.c). */
#ifndef STOREBENCH_IMAGEBOX_H
#define STOREBENCH_IMAGEBOX_H
#include <Python.h>
#include <stdint.h>

/* Box (left, top, right, bottom) of src resized to dst's size, bilinear (antialiased or
 * plain), mirrored left to right when flip. Needs no GIL; returns -1 when out of memory. */
int resize_box(const uint8_t *src, Py_ssize_t src_row_stride, int src_height, int src_width,
               int channels, const float box[4], uint8_t *dst, Py_ssize_t dst_row_stride,
               int dst_height, int dst_width, int flip, int antialias);
/* A (H, W, C) uint8 buffer of 1 to 4 channels with packed pixels (rows may be strided). */
int image_view(PyObject *obj, Py_buffer *view, int writable, const char *what);
/* ValueError unless box is non-empty and inside a height x width image. */
int check_box(const float box[4], int height, int width);
#endif
