/* storebench._rows: a row gather that keeps several rows' copies in flight at once.
 *
 * Why it exists (storebench.gather has the measurements' commands): a shuffled gather of
 * 12 KiB rows copies each row from where no hardware prefetch stream runs yet, so a copy of
 * one row at a time (numpy's take: one memmove per row) waits on memory for much of each
 * row. Copying a group of rows chunk by chunk, interleaved, keeps a group's worth of misses
 * in flight instead of one.
 *
 * The copy loop is compiled for AVX-512, AVX2 and the x86-64 baseline; the loader picks the
 * best the CPU runs (GCC's target_clones). Other compilers and CPUs build the plain loop.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Rows copied together, and the bytes of each row copied before the next row's turn. Eight
 * rows in 64-byte turns ran fastest of 8 or 16 rows in 64- or 256-byte turns. */
#define GROUP 8
#define CHUNK 64

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define MULTIVERSIONED __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MULTIVERSIONED
#endif

MULTIVERSIONED
static void take_rows_impl(const uint8_t *rows, const int64_t *indices, Py_ssize_t count,
                           size_t width, uint8_t *out) {
    for (Py_ssize_t first = 0; first < count; first += GROUP) {
        Py_ssize_t group = count - first < GROUP ? count - first : GROUP;
        const uint8_t *src[GROUP];
        uint8_t *dst[GROUP];
        for (Py_ssize_t j = 0; j < group; j++) {
            src[j] = rows + (size_t)indices[first + j] * width;
            dst[j] = out + (size_t)(first + j) * width;
        }
        size_t offset = 0;
        if (group == GROUP) {
            for (; offset + CHUNK <= width; offset += CHUNK)
                for (int j = 0; j < GROUP; j++)
                    memcpy(dst[j] + offset, src[j] + offset, CHUNK);
        }
        for (Py_ssize_t j = 0; j < group; j++)
            memcpy(dst[j] + offset, src[j] + offset, width - offset);
    }
}

static int is_int64(const Py_buffer *view) {
    if (view->itemsize != 8 || view->format == NULL)
        return 0;
    const char *format = view->format;
    if (*format == '<' || *format == '=' || *format == '@')
        format++;
    return (format[0] == 'q' || (format[0] == 'l' && sizeof(long) == 8)) && format[1] == '\0';
}

PyDoc_STRVAR(take_rows_doc,
"take_rows(rows, indices, out)\n"
"\n"
"out[k] = rows[indices[k]] for every k, byte for byte: rows is a C-contiguous buffer of\n"
"N equal rows (its first axis), indices a 1-D C-contiguous int64 buffer of values in\n"
"[0, N), out a writable C-contiguous buffer of len(indices) such rows that does not\n"
"overlap rows. Every index is checked before any byte is written (IndexError). The GIL\n"
"is released while rows are copied.");

static PyObject *take_rows(PyObject *module, PyObject *args) {
    PyObject *rows_obj, *indices_obj, *out_obj;
    if (!PyArg_ParseTuple(args, "OOO:take_rows", &rows_obj, &indices_obj, &out_obj))
        return NULL;
    Py_buffer rows = {0}, indices = {0}, out = {0};
    PyObject *result = NULL;
    if (PyObject_GetBuffer(rows_obj, &rows, PyBUF_C_CONTIGUOUS) < 0)
        goto done;
    if (PyObject_GetBuffer(indices_obj, &indices, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        goto done;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        goto done;
    if (rows.ndim < 1) {
        PyErr_SetString(PyExc_ValueError, "take_rows: rows must have at least one axis");
        goto done;
    }
    if (indices.ndim != 1 || !is_int64(&indices)) {
        PyErr_Format(PyExc_TypeError,
                     "take_rows: indices must be a 1-D int64 array, got format '%s' with %d "
                     "axes", indices.format ? indices.format : "B", indices.ndim);
        goto done;
    }
    Py_ssize_t length = rows.shape[0];
    Py_ssize_t count = indices.shape[0];
    size_t width = length ? (size_t)(rows.len / length) : 0;
    if (length == 0 && count > 0) {
        PyErr_Format(PyExc_IndexError, "take_rows: row index %lld out of range for 0 rows",
                     (long long)((const int64_t *)indices.buf)[0]);
        goto done;
    }
    if ((size_t)out.len != (size_t)count * width) {
        PyErr_Format(PyExc_ValueError,
                     "take_rows: out holds %zd bytes, %zd rows of %zu bytes need %zu",
                     out.len, count, width, (size_t)count * width);
        goto done;
    }
    const int64_t *index = (const int64_t *)indices.buf;
    for (Py_ssize_t k = 0; k < count; k++) {
        if (index[k] < 0 || index[k] >= length) {
            PyErr_Format(PyExc_IndexError,
                         "take_rows: row index %lld (position %zd) out of range for %zd rows",
                         (long long)index[k], k, length);
            goto done;
        }
    }
    const uint8_t *rows_start = (const uint8_t *)rows.buf;
    uint8_t *out_start = (uint8_t *)out.buf;
    if (out.len && rows.len && out_start < rows_start + rows.len
            && rows_start < out_start + out.len) {
        PyErr_SetString(PyExc_ValueError, "take_rows: out overlaps rows");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    take_rows_impl(rows_start, index, count, width, out_start);
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    if (rows.obj)
        PyBuffer_Release(&rows);
    if (indices.obj)
        PyBuffer_Release(&indices);
    if (out.obj)
        PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"take_rows", take_rows, METH_VARARGS, take_rows_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "storebench._rows",
    "A row gather that keeps several rows' copies in flight (see storebench.gather).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__rows(void) {
    return PyModule_Create(&module);
}
