/* storebench._rows: a row gather that keeps several rows' copies in flight at once, and
 * the per-sample checksums of a batch of equal rows (crc32c_rows, below).
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
#include <Python.h> /* first: it defines _GNU_SOURCE, which RUSAGE_THREAD needs */
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>

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

/* Rows that must come from the device (a file map whose pages are not in the page cache, or
 * swapped memory) are copied one after the other, as np.take copies them: the kernel reads
 * around each faulting page, and eight rows faulting at once put eight such windows in
 * flight, which under a memory limit evicted pages before their rows were copied (the
 * out_of_core study's memmap rows read twice the bytes and more, once for a 32-sample epoch
 * 24 GB). The batch's first group is copied row by row and tells which case this is: a major
 * fault in it sends the rest row by row too. */
static long major_faults(void) {
#ifdef RUSAGE_THREAD
    struct rusage usage;
    if (getrusage(RUSAGE_THREAD, &usage) == 0)
        return usage.ru_majflt;
#endif
    return 0;
}

static void copy_rows_in_turn(const uint8_t *rows, const int64_t *indices, Py_ssize_t count,
                              size_t width, uint8_t *out) {
    for (Py_ssize_t k = 0; k < count; k++)
        memcpy(out + (size_t)k * width, rows + (size_t)indices[k] * width, width);
}

/* Returns 1 where the rows were copied one after the other (a major fault in the first
 * group), 0 where groups were interleaved. */
static int gather_rows(const uint8_t *rows, const int64_t *indices, Py_ssize_t count,
                       size_t width, uint8_t *out) {
    Py_ssize_t head = count < GROUP ? count : GROUP;
    long before = major_faults();
    copy_rows_in_turn(rows, indices, head, width, out);
    if (major_faults() != before) {
        copy_rows_in_turn(rows, indices + head, count - head, width, out + (size_t)head * width);
        return 1;
    }
    take_rows_impl(rows, indices + head, count - head, width, out + (size_t)head * width);
    return 0;
}

/* The entry points' epilogue: every view they got, released (one they did not get has no
 * obj). */
static void release_views(Py_buffer *first, Py_buffer *second, Py_buffer *third) {
    Py_buffer *views[] = {first, second, third};
    for (int k = 0; k < 3; k++)
        if (views[k]->obj)
            PyBuffer_Release(views[k]);
}

static int is_int64(const Py_buffer *view) {
    if (view->itemsize != 8 || view->format == NULL)
        return 0;
    const char *format = view->format;
    if (*format == '<' || *format == '=' || *format == '@')
        format++;
    return (format[0] == 'q' || (format[0] == 'l' && sizeof(long) == 8)) && format[1] == '\0';
}


/* CRC-32C (Castagnoli) of each row followed by its label as 8 little-endian bytes: what
 * storebench.formats.sample_checksums computes with the crc32c package one sample at a
 * time. Rows are independent, so four rows' CRC chains run interleaved: one chain waits on
 * the CRC instruction's latency, four keep it busy. */
#define CRC_GROUP 4
static uint32_t crc_table[256];

static void crc_table_init(void) {
    for (uint32_t byte = 0; byte < 256; byte++) {
        uint32_t crc = byte;
        for (int bit = 0; bit < 8; bit++)
            crc = crc & 1 ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
        crc_table[byte] = crc;
    }
}

static uint32_t crc_bytes_table(uint32_t crc, const uint8_t *data, size_t size) {
    for (size_t k = 0; k < size; k++)
        crc = crc_table[(crc ^ data[k]) & 0xFF] ^ (crc >> 8);
    return crc;
}

static void crc_rows_table(const uint8_t *rows, const int64_t *labels, Py_ssize_t count,
                           size_t width, uint32_t *out) {
    for (Py_ssize_t k = 0; k < count; k++) {
        uint8_t label[8];
        uint64_t value = (uint64_t)labels[k];
        for (int b = 0; b < 8; b++)
            label[b] = (uint8_t)(value >> (8 * b));
        uint32_t crc = crc_bytes_table(0xFFFFFFFFu, rows + (size_t)k * width, width);
        out[k] = ~crc_bytes_table(crc, label, 8);
    }
}

#if defined(__GNUC__) && defined(__x86_64__)
#include <nmmintrin.h>
#define HAVE_CRC_INSTRUCTION 1

__attribute__((target("sse4.2")))
static uint32_t crc_bytes_hw(uint32_t crc, const uint8_t *data, size_t size) {
    size_t k = 0;
    for (; k + 8 <= size; k += 8) {
        uint64_t word;
        memcpy(&word, data + k, 8);
        crc = (uint32_t)_mm_crc32_u64(crc, word);
    }
    for (; k < size; k++)
        crc = _mm_crc32_u8(crc, data[k]);
    return crc;
}

__attribute__((target("sse4.2")))
static void crc_rows_hw(const uint8_t *rows, const int64_t *labels, Py_ssize_t count,
                        size_t width, uint32_t *out) {
    Py_ssize_t first = 0;
    for (; first + CRC_GROUP <= count; first += CRC_GROUP) {
        const uint8_t *row[CRC_GROUP];
        uint64_t crc[CRC_GROUP];
        for (int j = 0; j < CRC_GROUP; j++) {
            row[j] = rows + (size_t)(first + j) * width;
            crc[j] = 0xFFFFFFFFu;
        }
        size_t offset = 0;
        for (; offset + 8 <= width; offset += 8) {
            for (int j = 0; j < CRC_GROUP; j++) {
                uint64_t word;
                memcpy(&word, row[j] + offset, 8);
                crc[j] = _mm_crc32_u64(crc[j], word);
            }
        }
        for (int j = 0; j < CRC_GROUP; j++) {
            uint32_t tail = crc_bytes_hw((uint32_t)crc[j], row[j] + offset, width - offset);
            out[first + j] = ~(uint32_t)_mm_crc32_u64(tail, (uint64_t)labels[first + j]);
        }
    }
    for (; first < count; first++) {
        uint32_t crc = crc_bytes_hw(0xFFFFFFFFu, rows + (size_t)first * width, width);
        out[first] = ~(uint32_t)_mm_crc32_u64(crc, (uint64_t)labels[first]);
    }
}
#endif

static void crc_rows(const uint8_t *rows, const int64_t *labels, Py_ssize_t count,
                     size_t width, uint32_t *out) {
#ifdef HAVE_CRC_INSTRUCTION
    if (__builtin_cpu_supports("sse4.2")) {
        crc_rows_hw(rows, labels, count, width, out);
        return;
    }
#endif
    crc_rows_table(rows, labels, count, width, out);
}

PyDoc_STRVAR(crc32c_rows_doc,
"crc32c_rows(rows, labels, out)\n"
"\n"
"out[k] = CRC-32C of rows[k]'s bytes followed by labels[k] as 8 little-endian bytes:\n"
"rows a C-contiguous buffer of N equal rows, labels a 1-D C-contiguous int64 buffer of\n"
"N values, out a writable 1-D C-contiguous uint32 buffer of N values. The GIL is released\n"
"while the CRCs run.");

typedef void (*crc_rows_fn)(const uint8_t *, const int64_t *, Py_ssize_t, size_t, uint32_t *);

static PyObject *crc32c_rows_with(PyObject *args, crc_rows_fn compute) {
    PyObject *rows_obj, *labels_obj, *out_obj;
    if (!PyArg_ParseTuple(args, "OOO:crc32c_rows", &rows_obj, &labels_obj, &out_obj))
        return NULL;
    Py_buffer rows = {0}, labels = {0}, out = {0};
    PyObject *result = NULL;
    if (PyObject_GetBuffer(rows_obj, &rows, PyBUF_C_CONTIGUOUS) < 0)
        goto done;
    if (PyObject_GetBuffer(labels_obj, &labels, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        goto done;
    if (PyObject_GetBuffer(out_obj, &out,
                           PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0)
        goto done;
    if (rows.ndim < 1) {
        PyErr_SetString(PyExc_ValueError, "crc32c_rows: rows must have at least one axis");
        goto done;
    }
    Py_ssize_t count = rows.shape[0];
    if (labels.ndim != 1 || !is_int64(&labels) || labels.shape[0] != count) {
        PyErr_Format(PyExc_ValueError,
                     "crc32c_rows: labels must be a 1-D int64 array of %zd values", count);
        goto done;
    }
    if (out.ndim != 1 || out.itemsize != 4 || out.shape[0] != count) {
        PyErr_Format(PyExc_ValueError,
                     "crc32c_rows: out must be a 1-D uint32 array of %zd values", count);
        goto done;
    }
    size_t width = count ? (size_t)(rows.len / count) : 0;
    Py_BEGIN_ALLOW_THREADS
    compute((const uint8_t *)rows.buf, (const int64_t *)labels.buf, count, width,
            (uint32_t *)out.buf);
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    release_views(&rows, &labels, &out);
    return result;
}

static PyObject *crc32c_rows(PyObject *module, PyObject *args) {
    return crc32c_rows_with(args, crc_rows);
}

/* The table-driven CRC that CPUs without the CRC instruction run, callable on any CPU so
 * that the tests check it too. */
static PyObject *crc32c_rows_portable(PyObject *module, PyObject *args) {
    return crc32c_rows_with(args, crc_rows_table);
}

PyDoc_STRVAR(take_rows_doc,
"take_rows(rows, indices, out)\n"
"\n"
"out[k] = rows[indices[k]] for every k, byte for byte: rows is a C-contiguous buffer of\n"
"N equal rows (its first axis), indices a 1-D C-contiguous int64 buffer of values in\n"
"[0, N), out a writable C-contiguous buffer of len(indices) such rows that does not\n"
"overlap rows. Every index is checked before any byte is written (IndexError). The GIL\n"
"is released while rows are copied. Returns True where the rows were copied one after\n"
"the other because the first of them faulted in from the device, False where groups of\n"
"rows were copied interleaved.");

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
    int in_turn;
    Py_BEGIN_ALLOW_THREADS
    in_turn = gather_rows(rows_start, index, count, width, out_start);
    Py_END_ALLOW_THREADS
    result = PyBool_FromLong(in_turn);
done:
    release_views(&rows, &indices, &out);
    return result;
}

static PyMethodDef methods[] = {
    {"take_rows", take_rows, METH_VARARGS, take_rows_doc},
    {"crc32c_rows", crc32c_rows, METH_VARARGS, crc32c_rows_doc},
    {"crc32c_rows_portable", crc32c_rows_portable, METH_VARARGS,
     "crc32c_rows without the CRC instruction (what CPUs without it run)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "storebench._rows",
    "A row gather that keeps several rows' copies in flight (see storebench.gather), and\n"
    "the CRC-32C checksums of a batch of equal rows.", -1,
    methods,
};

PyMODINIT_FUNC PyInit__rows(void) {
    crc_table_init();
    return PyModule_Create(&module);
}
