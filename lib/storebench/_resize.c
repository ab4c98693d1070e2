/* storebench._resize: a box of an 8-bit image resized with a bilinear filter and written,
 * optionally mirrored left to right, straight into the caller's buffer (a batch's slot).
 *
 * Two filter classes (storebench.loaders.train_transform):
 * - antialiased: the triangle filter widened by the downscale factor, so every source pixel
 *   under an output pixel counts. It computes what Pillow's Image.resize(BILINEAR, box=)
 *   computes, to the bit: the same weights in double precision, rounded to 22-bit fixed
 *   point, a horizontal pass clipped to 8 bits, then a vertical pass (a test compares them).
 * - plain: the triangle filter at its own width (two taps a direction), as
 *   tf.image.resize(antialias=False) and OpenCV's INTER_LINEAR sample.
 *
 * The whole resize runs without the GIL, so a thread pool's resizes run in parallel.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "_imagebox.h"

static PyObject *resize_into(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"src", "box", "out", "flip", "antialias", NULL};
    PyObject *src_obj, *out_obj;
    float box[4];
    int flip = 0, antialias = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O(ffff)O|pp", keywords, &src_obj, &box[0],
                                     &box[1], &box[2], &box[3], &out_obj, &flip, &antialias))
        return NULL;
    Py_buffer src, out;
    if (image_view(src_obj, &src, 0, "src") < 0) return NULL;
    if (image_view(out_obj, &out, 1, "out") < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    int status = 0;
    if (src.shape[2] != out.shape[2]) {
        PyErr_Format(PyExc_ValueError, "src has %zd channels, out %zd", src.shape[2],
                     out.shape[2]);
        status = -1;
    } else if (check_box(box, (int)src.shape[0], (int)src.shape[1]) < 0) {
        status = -1;
    } else {
        Py_BEGIN_ALLOW_THREADS
        status = resize_box(src.buf, src.strides[0], (int)src.shape[0], (int)src.shape[1],
                            (int)src.shape[2], box, out.buf, out.strides[0], (int)out.shape[0],
                            (int)out.shape[1], flip, antialias);
        Py_END_ALLOW_THREADS
        if (status < 0) PyErr_NoMemory();
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    if (status < 0) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"resize_into", (PyCFunction)(void (*)(void))resize_into, METH_VARARGS | METH_KEYWORDS,
     "resize_into(src, box, out, flip=False, antialias=True): box (left, top, right, bottom) "
     "of the uint8 (H, W, C) array src resized bilinearly to out's size, written into out, "
     "mirrored left to right when flip."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_resize", NULL, -1, methods};

PyMODINIT_FUNC PyInit__resize(void) { return PyModule_Create(&module); }
