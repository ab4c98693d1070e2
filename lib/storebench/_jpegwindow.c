/* storebench._jpegwindow: decode only the part of a JPEG a training crop keeps, then resize
 * it into the caller's buffer, all without the GIL.
 *
 * libjpeg-turbo (the system's, 2.1 or later) skips the rows above the window
 * (jpeg_skip_scanlines: still entropy-decoded, but not dequantised, transformed or colour
 * converted), decodes only the iMCU columns the window touches (jpeg_crop_scanline), and
 * stops after the window's last row. A DCT scale of 1/2, 1/4 or 1/8 may be asked for too.
 *
 * Untrusted input: the header's size is checked against the caller's pixel cap before
 * anything is allocated for it, libjpeg's warnings (corrupt data it would paper over) are
 * errors, a progressive file's scans are capped, and every error is a ValueError with
 * libjpeg's message.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#include "_imagebox.h"

/* More scans than any encoder writes (libjpeg-turbo's own tools cap at 500): a file with
 * thousands of tiny scans is a known way to make a decoder spin. */
#define MAX_SCANS 500
/* Pillow's default decompression-bomb threshold, where the caller gives no cap. */
#define DEFAULT_MAX_PIXELS 89478485LL

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX + 64];
} ErrorManager;

static void on_error(j_common_ptr cinfo) {
    ErrorManager *err = (ErrorManager *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void on_message(j_common_ptr cinfo, int level) {
    if (level < 0) { /* a warning: data libjpeg would decode wrongly and go on */
        ErrorManager *err = (ErrorManager *)cinfo->err;
        (*cinfo->err->format_message)(cinfo, err->message);
        longjmp(err->jump, 1);
    }
}

static void on_progress(j_common_ptr cinfo) {
    j_decompress_ptr dinfo = (j_decompress_ptr)cinfo;
    if (dinfo->input_scan_number > MAX_SCANS) {
        ErrorManager *err = (ErrorManager *)cinfo->err;
        snprintf(err->message, sizeof err->message, "more than %d scans", MAX_SCANS);
        longjmp(err->jump, 1);
    }
}

/* One decode: the window [y0, y1) x [x0, x1) of the image scaled by 1/denom. */
typedef struct {
    const uint8_t *data;
    size_t size;
    int y0, x0, y1, x1, denom, gray;
    long long max_pixels;
    /* out: the window's pixels, row_stride bytes apart (malloc'd unless given) */
    uint8_t *pixels;
    Py_ssize_t row_stride;
    int channels;
} Window;

/* Fills w->pixels (allocating it when NULL). Returns 0, or -1 with err->message set. */
static int decode_window(Window *w, ErrorManager *err) {
    struct jpeg_decompress_struct cinfo;
    struct jpeg_progress_mgr progress;
    JSAMPLE *volatile row = NULL;
    int allocated = w->pixels == NULL;
    cinfo.err = jpeg_std_error(&err->pub);
    err->pub.error_exit = on_error;
    err->pub.emit_message = on_message;
    err->message[0] = '\0';
    jpeg_create_decompress(&cinfo);
    progress.progress_monitor = on_progress;
    cinfo.progress = &progress;
    if (setjmp(err->jump)) {
        jpeg_destroy_decompress(&cinfo);
        free(row);
        if (allocated) {
            free(w->pixels);
            w->pixels = NULL;
        }
        return -1;
    }
    jpeg_mem_src(&cinfo, w->data, (unsigned long)w->size);
    jpeg_read_header(&cinfo, TRUE);
    if ((long long)cinfo.image_width * cinfo.image_height > w->max_pixels) {
        snprintf(err->message, sizeof err->message,
                 "the header claims %u x %u pixels, over the cap of %lld", cinfo.image_width,
                 cinfo.image_height, w->max_pixels);
        longjmp(err->jump, 1);
    }
    if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
        snprintf(err->message, sizeof err->message, "CMYK and YCCK JPEGs are not decoded here");
        longjmp(err->jump, 1);
    }
    cinfo.out_color_space = w->gray ? JCS_GRAYSCALE : JCS_RGB;
    cinfo.scale_num = 1;
    cinfo.scale_denom = (unsigned int)w->denom;
    jpeg_start_decompress(&cinfo);
    if (w->x0 < 0 || w->y0 < 0 || w->x1 > (int)cinfo.output_width ||
        w->y1 > (int)cinfo.output_height || w->x0 >= w->x1 || w->y0 >= w->y1) {
        snprintf(err->message, sizeof err->message,
                 "window [%d, %d) x [%d, %d) is not inside the %u x %u decoded image", w->y0,
                 w->y1, w->x0, w->x1, cinfo.output_height, cinfo.output_width);
        longjmp(err->jump, 1);
    }
    int channels = cinfo.output_components;
    w->channels = channels;
    /* Ask libjpeg for a column more on each side where the image has one: it crops at iMCU
     * edges and upsamples chroma at the cropped edge as at an image edge, so the columns
     * we keep are then never that edge. */
    JDIMENSION left = (JDIMENSION)(w->x0 > 0 ? w->x0 - 1 : 0);
    JDIMENSION right = (JDIMENSION)(w->x1 < (int)cinfo.output_width ? w->x1 + 1 : w->x1);
    JDIMENSION width = right - left;
    jpeg_crop_scanline(&cinfo, &left, &width);
    size_t skip_columns = (size_t)(w->x0 - (int)left);
    size_t row_bytes = (size_t)(w->x1 - w->x0) * channels;
    if (allocated) {
        w->row_stride = (Py_ssize_t)row_bytes;
        w->pixels = malloc(row_bytes * (size_t)(w->y1 - w->y0));
    }
    row = malloc((size_t)width * channels);
    if (!w->pixels || !row) {
        snprintf(err->message, sizeof err->message, "out of memory");
        longjmp(err->jump, 1);
    }
    if (w->y0 > 0 && jpeg_skip_scanlines(&cinfo, (JDIMENSION)w->y0) != (JDIMENSION)w->y0) {
        snprintf(err->message, sizeof err->message, "the data ended before the window");
        longjmp(err->jump, 1);
    }
    JSAMPLE *line = row;
    for (int y = w->y0; y < w->y1; y++) {
        if (jpeg_read_scanlines(&cinfo, &line, 1) != 1) {
            snprintf(err->message, sizeof err->message, "the data ended inside the window");
            longjmp(err->jump, 1);
        }
        memcpy(w->pixels + (size_t)(y - w->y0) * w->row_stride, row + skip_columns * channels,
               row_bytes);
    }
    /* The rows below the window are left undecoded: abort, not finish. */
    jpeg_abort_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    free(row);
    return 0;
}

static int parse_window(PyObject *data_obj, Py_buffer *data, Window *w) {
    if (PyObject_GetBuffer(data_obj, data, PyBUF_SIMPLE) < 0) return -1;
    if (w->denom != 1 && w->denom != 2 && w->denom != 4 && w->denom != 8) {
        PyBuffer_Release(data);
        PyErr_Format(PyExc_ValueError, "scale_denom must be 1, 2, 4 or 8, got %d", w->denom);
        return -1;
    }
    w->data = data->buf;
    w->size = (size_t)data->len;
    if (w->max_pixels <= 0) w->max_pixels = DEFAULT_MAX_PIXELS;
    return 0;
}

static PyObject *decode_error(ErrorManager *err) {
    PyErr_SetString(PyExc_ValueError, err->message[0] ? err->message : "cannot decode");
    return NULL;
}

static PyObject *decode_window_into(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"data", "window", "out", "scale_denom", "max_pixels", NULL};
    PyObject *data_obj, *out_obj;
    Window w = {0};
    w.denom = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O(iiii)O|iL", keywords, &data_obj, &w.y0,
                                     &w.x0, &w.y1, &w.x1, &out_obj, &w.denom, &w.max_pixels))
        return NULL;
    Py_buffer data, out;
    if (parse_window(data_obj, &data, &w) < 0) return NULL;
    if (image_view(out_obj, &out, 1, "out") < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    PyObject *result = NULL;
    if (out.shape[0] != w.y1 - w.y0 || out.shape[1] != w.x1 - w.x0 ||
        (out.shape[2] != 1 && out.shape[2] != 3)) {
        PyErr_Format(PyExc_ValueError, "out must be (%d, %d, 1 or 3), got (%zd, %zd, %zd)",
                     w.y1 - w.y0, w.x1 - w.x0, out.shape[0], out.shape[1], out.shape[2]);
    } else {
        ErrorManager err;
        int status;
        w.gray = out.shape[2] == 1;
        w.pixels = out.buf;
        w.row_stride = out.strides[0];
        Py_BEGIN_ALLOW_THREADS
        status = decode_window(&w, &err);
        Py_END_ALLOW_THREADS
        if (status < 0)
            decode_error(&err);
        else
            result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    return result;
}

static PyObject *decode_crop_resize(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"data", "window", "box", "out", "flip", "antialias",
                               "scale_denom", "max_pixels", NULL};
    PyObject *data_obj, *out_obj;
    Window w = {0};
    float box[4];
    int flip = 0, antialias = 1;
    w.denom = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O(iiii)(ffff)O|ppiL", keywords, &data_obj,
                                     &w.y0, &w.x0, &w.y1, &w.x1, &box[0], &box[1], &box[2],
                                     &box[3], &out_obj, &flip, &antialias, &w.denom,
                                     &w.max_pixels))
        return NULL;
    Py_buffer data, out;
    if (parse_window(data_obj, &data, &w) < 0) return NULL;
    if (image_view(out_obj, &out, 1, "out") < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    PyObject *result = NULL;
    if (out.shape[2] != 1 && out.shape[2] != 3) {
        PyErr_Format(PyExc_ValueError, "out must have 1 or 3 channels, got %zd", out.shape[2]);
    } else if (w.y0 >= w.y1 || w.x0 >= w.x1) {
        PyErr_Format(PyExc_ValueError, "window [%d, %d) x [%d, %d) is empty", w.y0, w.y1, w.x0,
                     w.x1);
    } else if (check_box(box, w.y1 - w.y0, w.x1 - w.x0) == 0) {
        ErrorManager err;
        int status;
        w.gray = out.shape[2] == 1;
        Py_BEGIN_ALLOW_THREADS
        status = decode_window(&w, &err);
        if (status == 0) {
            if (resize_box(w.pixels, w.row_stride, w.y1 - w.y0, w.x1 - w.x0, w.channels, box,
                           out.buf, out.strides[0], (int)out.shape[0], (int)out.shape[1], flip,
                           antialias) < 0) {
                status = -1;
                snprintf(err.message, sizeof err.message, "out of memory");
            }
            free(w.pixels);
        }
        Py_END_ALLOW_THREADS
        if (status < 0)
            decode_error(&err);
        else
            result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    return result;
}

static PyObject *header(PyObject *self, PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data)) return NULL;
    struct jpeg_decompress_struct cinfo;
    ErrorManager err;
    PyObject *result = NULL;
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.emit_message = on_message;
    err.message[0] = '\0';
    jpeg_create_decompress(&cinfo);
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&cinfo);
        PyBuffer_Release(&data);
        return decode_error(&err);
    }
    jpeg_mem_src(&cinfo, data.buf, (unsigned long)data.len);
    jpeg_read_header(&cinfo, TRUE);
    static const char *spaces[] = {"UNKNOWN", "GRAY", "RGB", "YCbCr", "CMYK", "YCCK"};
    int space = cinfo.jpeg_color_space;
    result = Py_BuildValue("(iisO)", (int)cinfo.image_height, (int)cinfo.image_width,
                           space >= 0 && space <= 5 ? spaces[space] : "UNKNOWN",
                           jpeg_has_multiple_scans(&cinfo) ? Py_True : Py_False);
    jpeg_destroy_decompress(&cinfo);
    PyBuffer_Release(&data);
    return result;
}

static PyMethodDef methods[] = {
    {"header", header, METH_VARARGS,
     "header(data) -> (height, width, colour space, progressive) of a JPEG's header."},
    {"decode_window_into", (PyCFunction)(void (*)(void))decode_window_into,
     METH_VARARGS | METH_KEYWORDS,
     "decode_window_into(data, (top, left, bottom, right), out, scale_denom=1, "
     "max_pixels=...): that window of the JPEG (scaled by 1/scale_denom) decoded into the "
     "uint8 (bottom - top, right - left, 1 or 3) array out."},
    {"decode_crop_resize", (PyCFunction)(void (*)(void))decode_crop_resize,
     METH_VARARGS | METH_KEYWORDS,
     "decode_crop_resize(data, window, box, out, flip=False, antialias=True, scale_denom=1, "
     "max_pixels=...): the window decoded, its box (left, top, right, bottom; in the "
     "window's pixels) resized bilinearly into out, mirrored when flip."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpegwindow", NULL, -1, methods};

PyMODINIT_FUNC PyInit__jpegwindow(void) {
    return PyModule_Create(&module);
}
