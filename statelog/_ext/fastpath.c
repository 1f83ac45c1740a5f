/* Hot path of value-like state in C: ValueState.update() without the interpreter, the
 * columnar record buffer of narrow changelog streams, and the fold of add_many's int
 * reductions into a dict.
 *
 * RecordBuffer holds the narrow records (key bytes, key group, namespace bytes, op, value;
 * statelog/changelog/records.py) of one stream as typed columns: key and namespace bytes as
 * Arrow binary (int32 offsets + data), key group uint16, op uint8, and the value as int64
 * or float64 with a validity bitmap when the state's Arrow type allows it (values that do
 * not fit, e.g. an int above 2**63-1 in a uint64 state, go to an overflow list of
 * (index, value) and the converter falls back to pyarrow for that batch), else as a Python
 * list. take() hands the columns over as bytes objects that pyarrow wraps without
 * per-record work (records.narrow_columns). len() is in list items (records * 5), as for
 * the flat list buffer it replaces, so the limit checks of every appender stay the same.
 *
 * A record is appended whole or not at all: every step that may run Python code (only the
 * allocation of a container, which may start the cyclic GC and its finalizers) happens
 * before the first byte of the record is written, and nothing between the first write and
 * the record count increment releases the GIL, so a concurrent take() in the flusher never
 * sees a partial record.
 *
 * update(v): type check (fast for the declared primitive type, else the Python validator),
 * table[ctx.key] = v for the state's current namespace table, and with a changelog
 * stream: append the narrow record to the stream's buffer (a RecordBuffer, or a flat list:
 * five list appends), then call stream.on_buffer_full() when len(buffer) reaches the
 * stream's limit cell. ctx is the backend's key context (statelog/state/context.py): its
 * slots key and key_info (type, key bytes, key group) are the current key, located once
 * when the update is built (the offsets of KeyContext's slot descriptors, so each update
 * reads them without an attribute lookup; any other object is read with getattr). The
 * state shares its [table, namespace bytes] as a list (updated by set_namespace) and the
 * stream its limit as a one-element list (0 while throttled). The pure-Python closure in
 * statelog/state/kinds.py is the reference implementation and the fallback when this
 * module is not built.
 *
 * add_into(table, keys, partial, out, op, lo, hi): the read-modify-write of add_many's int
 * folds (statelog/state/batch_reductions.py fold_into_dict): for each of a batch's distinct
 * keys, table[key] = fold(table.get(key), partial[i]) (a sum with 0 for an absent entry, or
 * a min or max that an absent entry leaves at partial[i]) and out[i] = the new value, with
 * partial and out int64 buffers. Each key is looked up once and set right after, while its
 * dict entry is still in the cache (the Python path reads every key and then writes every
 * key, two cache misses per key when the table is large). All or nothing: a stored value
 * that is not an exact int in [lo, hi] (the declared type's range) or a result outside it
 * (int64 overflow included) puts back the entries it changed and returns False, and the
 * caller's Arrow path folds the batch, raising its own errors; the Arrow path is the
 * reference and the fallback when this module is not built.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <limits.h>
#include "bulkargs.h"
#include "keyenc.h"
#ifndef Py_T_OBJECT_EX /* before Python 3.12 the member types are in structmember.h */
#include "structmember.h"
#define Py_T_OBJECT_EX T_OBJECT_EX
#endif

static PyObject *s_key, *s_key_info, *s_on_buffer_full;

#define WIDTH 5 /* items per narrow record, as in the flat list layout */

enum { VK_OBJECT = 0, VK_INT64 = 1, VK_FLOAT64 = 2 };

/* ---------------------------------------------------------------------------------------- */
/* RecordBuffer                                                                             */

typedef struct {
    PyObject_HEAD
    Py_ssize_t n;          /* records */
    Py_ssize_t cap;        /* record capacity of kg, op, vals, valid; koff/noff hold cap+1 */
    int32_t *koff;         /* key offsets, koff[0] == 0 */
    char *kdata;
    Py_ssize_t kcap;
    int32_t *noff;         /* namespace offsets */
    char *ndata;
    Py_ssize_t ncap;
    uint16_t *kg;
    uint8_t *op;
    int vkind;
    int64_t *vals;         /* VK_INT64 / VK_FLOAT64: 8 bytes per record (0 for nulls) */
    uint8_t *valid;        /* validity bitmap (typed kinds) */
    Py_ssize_t nulls;      /* records with a cleared validity bit (None or overflow) */
    PyObject *values;      /* VK_OBJECT: list of values */
    PyObject *overflow;    /* typed kinds: list of (index, value), or NULL */
    long kg_min, kg_max;
} RecordBuffer;

static PyTypeObject RecordBufferType;

/* grow a byte buffer to hold need bytes (need <= INT32_MAX; capacity stays <= INT32_MAX) */
static int grow(void **p, Py_ssize_t *cap, Py_ssize_t need, size_t elem) {
    if (need <= *cap) return 0;
    Py_ssize_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    if (c > INT32_MAX) c = INT32_MAX;
    void *q = PyMem_Realloc(*p, (size_t)c * elem);
    if (q == NULL) { PyErr_NoMemory(); return -1; }
    *p = q;
    *cap = c;
    return 0;
}

#if defined(__GNUC__)
#define ALWAYS_INLINE static inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE static inline
#endif

/* o as a C long when it is an exact int in [0, 2**30) (the common key group and buffer
 * limit), read without a call where the int layout allows; -1 otherwise. */
ALWAYS_INLINE long small_nonneg(PyObject *o) {
#if PY_VERSION_HEX < 0x030C0000 && PYLONG_BITS_IN_DIGIT == 30
    if (PyLong_CheckExact(o)) {
        Py_ssize_t size = Py_SIZE(o);
        if (size == 0) return 0;
        if (size == 1) return (long)((PyLongObject *)o)->ob_digit[0];
    }
#elif PY_VERSION_HEX >= 0x030C0000
    if (PyLong_CheckExact(o) && PyUnstable_Long_IsCompact((PyLongObject *)o)) {
        Py_ssize_t v = PyUnstable_Long_CompactValue((PyLongObject *)o);
        if (v >= 0 && v < (1L << 30)) return (long)v;
    }
#endif
    return -1;
}

/* memcpy of a short key without a call (two overlapping word copies) */
ALWAYS_INLINE void copy_bytes(char *dst, const char *src, Py_ssize_t n) {
    if (n >= 8 && n <= 16) {
        uint64_t a, b;
        memcpy(&a, src, 8);
        memcpy(&b, src + n - 8, 8);
        memcpy(dst, &a, 8);
        memcpy(dst + n - 8, &b, 8);
    } else if (n >= 4 && n < 8) {
        uint32_t a, b;
        memcpy(&a, src, 4);
        memcpy(&b, src + n - 4, 4);
        memcpy(dst, &a, 4);
        memcpy(dst + n - 4, &b, 4);
    } else if (n > 16) {
        memcpy(dst, src, (size_t)n);
    } else {
        for (Py_ssize_t i = 0; i < n; i++) dst[i] = src[i];
    }
}

/* Room for one more record with ks key bytes and ns namespace bytes (no Python code).
 * Keeps kcap and ncap <= INT32_MAX, so that fitting in them means fitting the offsets. */
static int rb_grow(RecordBuffer *rb, Py_ssize_t ks, Py_ssize_t ns) {
    Py_ssize_t n = rb->n;
    if ((Py_ssize_t)rb->koff[n] + ks > INT32_MAX || (Py_ssize_t)rb->noff[n] + ns > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError,
                        "changelog buffer: more than 2 GiB of key or namespace bytes in one batch");
        return -1;
    }
    if (n + 1 > rb->cap) {
        Py_ssize_t c = rb->cap * 2;
        int32_t *ko = PyMem_Realloc(rb->koff, (size_t)(c + 1) * sizeof(int32_t));
        if (ko == NULL) { PyErr_NoMemory(); return -1; }
        rb->koff = ko;
        int32_t *no = PyMem_Realloc(rb->noff, (size_t)(c + 1) * sizeof(int32_t));
        if (no == NULL) { PyErr_NoMemory(); return -1; }
        rb->noff = no;
        uint16_t *kg = PyMem_Realloc(rb->kg, (size_t)c * sizeof(uint16_t));
        if (kg == NULL) { PyErr_NoMemory(); return -1; }
        rb->kg = kg;
        uint8_t *op = PyMem_Realloc(rb->op, (size_t)c);
        if (op == NULL) { PyErr_NoMemory(); return -1; }
        rb->op = op;
        if (rb->vkind != VK_OBJECT) {
            int64_t *v = PyMem_Realloc(rb->vals, (size_t)c * sizeof(int64_t));
            if (v == NULL) { PyErr_NoMemory(); return -1; }
            rb->vals = v;
            uint8_t *b = PyMem_Realloc(rb->valid, (size_t)(c + 7) / 8);
            if (b == NULL) { PyErr_NoMemory(); return -1; }
            rb->valid = b;
        }
        rb->cap = c;
    }
    if (grow((void **)&rb->kdata, &rb->kcap, rb->koff[n] + ks, 1) < 0) return -1;
    if (grow((void **)&rb->ndata, &rb->ncap, rb->noff[n] + ns, 1) < 0) return -1;
    return 0;
}

ALWAYS_INLINE int rb_reserve(RecordBuffer *rb, Py_ssize_t ks, Py_ssize_t ns) {
    Py_ssize_t n = rb->n;
    if (n < rb->cap && rb->koff[n] + ks <= rb->kcap && rb->noff[n] + ns <= rb->ncap) return 0;
    return rb_grow(rb, ks, ns);
}

/* Append one record. fast: x is the value, already known to be a valid int64 (VK_INT64).
 * On error nothing was appended. */
ALWAYS_INLINE int rb_append_key(RecordBuffer *rb, const char *kp, Py_ssize_t ks, PyObject *kgo,
                                PyObject *nsb, int op, PyObject *v, int fast, long long x) {
    if (!PyBytes_Check(nsb)) {
        PyErr_SetString(PyExc_TypeError, "changelog record: the namespace must be bytes");
        return -1;
    }
    long kg = small_nonneg(kgo);
    if (kg < 0) {
        kg = PyLong_AsLong(kgo);
        if (kg == -1 && PyErr_Occurred()) return -1;
    }
    if (kg < 0 || kg > 65535) {
        PyErr_Format(PyExc_ValueError, "changelog record: key group %ld out of range", kg);
        return -1;
    }
    /* classify the value (no Python code) */
    int vmode; /* 0: null, 1: typed bits, 2: Python object */
    int64_t bits = 0;
    if (rb->vkind == VK_OBJECT) vmode = 2;
    else if (v == Py_None) vmode = 0;
    else if (fast) { vmode = 1; bits = (int64_t)x; }
    else if (rb->vkind == VK_INT64 && PyLong_CheckExact(v)) {
        int of = 0;
        long long y = PyLong_AsLongLongAndOverflow(v, &of);
        if (y == -1 && PyErr_Occurred()) return -1;
        if (of) vmode = 2;
        else { vmode = 1; bits = (int64_t)y; }
    } else if (rb->vkind == VK_FLOAT64 && PyFloat_CheckExact(v)) {
        double d = PyFloat_AS_DOUBLE(v);
        memcpy(&bits, &d, sizeof bits);
        vmode = 1;
    } else vmode = 2;

    /* phase 1: allocations that may start the GC (and so run Python code) */
    PyObject *item = NULL;
    if (vmode == 2 && rb->vkind != VK_OBJECT) {
        if (rb->overflow == NULL && (rb->overflow = PyList_New(0)) == NULL) return -1;
        if ((item = PyTuple_New(2)) == NULL) return -1;
        Py_INCREF(Py_None);
        PyTuple_SET_ITEM(item, 0, Py_None);
        Py_INCREF(v);
        PyTuple_SET_ITEM(item, 1, v);
    }
    /* phase 2: no Python code runs from here on */
    Py_ssize_t ns = PyBytes_GET_SIZE(nsb);
    if (rb_reserve(rb, ks, ns) < 0) { Py_XDECREF(item); return -1; }
    Py_ssize_t n = rb->n;
    if (vmode == 2) {
        if (rb->vkind == VK_OBJECT) {
            if (PyList_Append(rb->values, v) < 0) return -1;
        } else {
            PyObject *idx = PyLong_FromSsize_t(n);
            if (idx == NULL) { Py_DECREF(item); return -1; }
            if (PyList_Append(rb->overflow, item) < 0) { Py_DECREF(idx); Py_DECREF(item); return -1; }
            PyTuple_SET_ITEM(item, 0, idx); /* replaces the None placeholder */
            Py_DECREF(Py_None);
            Py_DECREF(item);
        }
    }
    int32_t ko = rb->koff[n], no = rb->noff[n];
    copy_bytes(rb->kdata + ko, kp, ks);
    rb->koff[n + 1] = ko + (int32_t)ks;
    copy_bytes(rb->ndata + no, PyBytes_AS_STRING(nsb), ns);
    rb->noff[n + 1] = no + (int32_t)ns;
    rb->kg[n] = (uint16_t)kg;
    rb->op[n] = (uint8_t)op;
    if (rb->vkind != VK_OBJECT) {
        rb->vals[n] = bits;
        uint8_t m = (uint8_t)(1u << (n & 7));
        if (vmode == 1) rb->valid[n >> 3] |= m;
        else { rb->valid[n >> 3] &= (uint8_t)~m; rb->nulls++; }
    }
    if (kg < rb->kg_min) rb->kg_min = kg;
    if (kg > rb->kg_max) rb->kg_max = kg;
    rb->n = n + 1;
    return 0;
}

/* Append one record whose serialized key is the bytes object kb. */
ALWAYS_INLINE int rb_append(RecordBuffer *rb, PyObject *kb, PyObject *kgo, PyObject *nsb, int op,
                            PyObject *v, int fast, long long x) {
    if (!PyBytes_Check(kb)) {
        PyErr_SetString(PyExc_TypeError, "changelog record: the key must be bytes");
        return -1;
    }
    return rb_append_key(rb, PyBytes_AS_STRING(kb), PyBytes_GET_SIZE(kb), kgo, nsb, op, v, fast, x);
}

/* encode_key_fast (keyenc.h): the update fast path uses it so that it need not read the
 * cached key bytes object of the current key, a cache miss per record when the keys are
 * many: the key object itself was just hashed. It returns 0 for a bool or an integral float
 * (equal to an int key, key encoding 2), and the cached bytes (the int's, normalized by
 * keys/encoding.py) are written; the caller only uses it when the cached type is the key's type. */

static PyObject *rb_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    int vkind = VK_OBJECT;
    static char *kwlist[] = {"value_kind", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|i:RecordBuffer", kwlist, &vkind)) return NULL;
    if (vkind < VK_OBJECT || vkind > VK_FLOAT64) {
        PyErr_Format(PyExc_ValueError, "RecordBuffer: unknown value kind %d", vkind);
        return NULL;
    }
    RecordBuffer *rb = (RecordBuffer *)type->tp_alloc(type, 0);
    if (rb == NULL) return NULL;
    rb->vkind = vkind;
    rb->kg_min = 65536;
    rb->kg_max = -1;
    rb->cap = 64;
    rb->koff = PyMem_Calloc((size_t)rb->cap + 1, sizeof(int32_t));
    rb->noff = PyMem_Calloc((size_t)rb->cap + 1, sizeof(int32_t));
    rb->kg = PyMem_Malloc((size_t)rb->cap * sizeof(uint16_t));
    rb->op = PyMem_Malloc((size_t)rb->cap);
    int ok = rb->koff && rb->noff && rb->kg && rb->op;
    if (vkind == VK_OBJECT) {
        rb->values = PyList_New(0);
        ok = ok && rb->values;
    } else {
        rb->vals = PyMem_Malloc((size_t)rb->cap * sizeof(int64_t));
        rb->valid = PyMem_Calloc((size_t)(rb->cap + 7) / 8, 1);
        ok = ok && rb->vals && rb->valid;
    }
    if (!ok) {
        Py_DECREF(rb);
        return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    }
    return (PyObject *)rb;
}

static int rb_traverse(RecordBuffer *rb, visitproc visit, void *arg) {
    Py_VISIT(rb->values);
    Py_VISIT(rb->overflow);
    return 0;
}

static int rb_clear(RecordBuffer *rb) {
    Py_CLEAR(rb->values);
    Py_CLEAR(rb->overflow);
    return 0;
}

static void rb_dealloc(RecordBuffer *rb) {
    PyObject_GC_UnTrack(rb);
    rb_clear(rb);
    PyMem_Free(rb->koff); PyMem_Free(rb->kdata); PyMem_Free(rb->noff); PyMem_Free(rb->ndata);
    PyMem_Free(rb->kg); PyMem_Free(rb->op); PyMem_Free(rb->vals); PyMem_Free(rb->valid);
    Py_TYPE(rb)->tp_free((PyObject *)rb);
}

static Py_ssize_t rb_len(RecordBuffer *rb) { return rb->n * WIDTH; }

static PyObject *rb_extend(RecordBuffer *rb, PyObject *rec) {
    if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) != WIDTH) {
        PyErr_SetString(PyExc_TypeError, "RecordBuffer.extend: expected a narrow record (5-tuple)");
        return NULL;
    }
    long op = PyLong_AsLong(PyTuple_GET_ITEM(rec, 3));
    if (op == -1 && PyErr_Occurred()) return NULL;
    if (op < 0 || op > 255) {
        PyErr_Format(PyExc_ValueError, "changelog record: op %ld out of range", op);
        return NULL;
    }
    /* hold the fields: the GC may run while the record is appended */
    Py_INCREF(rec);
    int rc = rb_append(rb, PyTuple_GET_ITEM(rec, 0), PyTuple_GET_ITEM(rec, 1),
                       PyTuple_GET_ITEM(rec, 2), (int)op, PyTuple_GET_ITEM(rec, 4), 0, 0);
    Py_DECREF(rec);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

/* After a take of n records from an empty buffer: give back memory when the buffer held
 * far more than this batch (e.g. after a burst while the flusher was behind). Shrinking
 * realloc failures just keep the larger block. No Python code runs. */
#define SHRINK_MIN_RECORDS 16384
#define SHRINK_MIN_BYTES (1 << 20)
static void shrink_bytes(char **p, Py_ssize_t *cap, Py_ssize_t used) {
    if (*cap <= SHRINK_MIN_BYTES || used * 4 >= *cap) return;
    Py_ssize_t c = *cap;
    while (c > SHRINK_MIN_BYTES && used * 4 < c) c /= 2;
    char *q = PyMem_Realloc(*p, (size_t)c);
    if (q != NULL) { *p = q; *cap = c; }
}

static void rb_shrink(RecordBuffer *rb, Py_ssize_t n, Py_ssize_t kused, Py_ssize_t nused) {
    Py_ssize_t c = rb->cap;
    while (c > SHRINK_MIN_RECORDS && n * 4 < c) c /= 2;
    if (c < rb->cap) {
        /* every array keeps at least c (+1) entries: each realloc either succeeds or leaves a
         * larger block, so cap = c stays true for all of them */
        int32_t *ko = PyMem_Realloc(rb->koff, (size_t)(c + 1) * sizeof(int32_t));
        if (ko != NULL) rb->koff = ko;
        int32_t *no = PyMem_Realloc(rb->noff, (size_t)(c + 1) * sizeof(int32_t));
        if (no != NULL) rb->noff = no;
        uint16_t *kg = PyMem_Realloc(rb->kg, (size_t)c * sizeof(uint16_t));
        if (kg != NULL) rb->kg = kg;
        uint8_t *op = PyMem_Realloc(rb->op, (size_t)c);
        if (op != NULL) rb->op = op;
        if (rb->vkind != VK_OBJECT) {
            int64_t *v = PyMem_Realloc(rb->vals, (size_t)c * sizeof(int64_t));
            if (v != NULL) rb->vals = v;
            uint8_t *b = PyMem_Realloc(rb->valid, (size_t)(c + 7) / 8);
            if (b != NULL) rb->valid = b;
        }
        rb->cap = c;
    }
    shrink_bytes(&rb->kdata, &rb->kcap, kused);
    shrink_bytes(&rb->ndata, &rb->ncap, nused);
}

/* take() -> (n, key_offsets, key_data, key_groups, ns_offsets, ns_data, ops, values,
 *            validity, null_count, overflow, kg_min, kg_max)
 * Removes every record. Typed columns are bytes (little-endian native layout, Arrow's);
 * values is bytes (typed kinds) or a list; validity is None without nulls; overflow is a
 * list of (index, value) or None. kg_min > kg_max when n == 0. */
static PyObject *rb_take(RecordBuffer *rb, PyObject *Py_UNUSED(ignored)) {
    /* allocations of containers first: they may start the GC, which may run Python code */
    PyObject *fresh = NULL;
    if (rb->vkind == VK_OBJECT && (fresh = PyList_New(0)) == NULL) return NULL;
    PyObject *res = PyTuple_New(13);
    if (res == NULL) { Py_XDECREF(fresh); return NULL; }
    /* no Python code from here on */
    Py_ssize_t n = rb->n;
    PyObject *items[13] = {NULL};
    items[0] = PyLong_FromSsize_t(n);
    items[1] = PyBytes_FromStringAndSize((const char *)rb->koff, (n + 1) * (Py_ssize_t)sizeof(int32_t));
    items[2] = PyBytes_FromStringAndSize(rb->kdata ? rb->kdata : "", rb->koff[n]);
    items[3] = PyBytes_FromStringAndSize((const char *)rb->kg, n * (Py_ssize_t)sizeof(uint16_t));
    items[4] = PyBytes_FromStringAndSize((const char *)rb->noff, (n + 1) * (Py_ssize_t)sizeof(int32_t));
    items[5] = PyBytes_FromStringAndSize(rb->ndata ? rb->ndata : "", rb->noff[n]);
    items[6] = PyBytes_FromStringAndSize((const char *)rb->op, n);
    if (rb->vkind == VK_OBJECT) {
        items[7] = rb->values; /* swapped below */
        Py_INCREF(items[7]);
    } else {
        items[7] = PyBytes_FromStringAndSize((const char *)rb->vals, n * (Py_ssize_t)sizeof(int64_t));
    }
    if (rb->vkind != VK_OBJECT && rb->nulls > 0) {
        Py_ssize_t nb = (n + 7) / 8;
        items[8] = PyBytes_FromStringAndSize(NULL, nb);
        if (items[8] != NULL) {
            char *p = PyBytes_AS_STRING(items[8]);
            memcpy(p, rb->valid, (size_t)nb);
            if (n & 7) p[nb - 1] &= (char)((1u << (n & 7)) - 1); /* bits past the end are 0 */
        }
    } else {
        items[8] = Py_None;
        Py_INCREF(Py_None);
    }
    items[9] = PyLong_FromSsize_t(rb->nulls);
    items[10] = rb->overflow ? rb->overflow : Py_None;
    Py_INCREF(items[10]);
    items[11] = PyLong_FromLong(rb->kg_min);
    items[12] = PyLong_FromLong(rb->kg_max);
    for (int i = 0; i < 13; i++) {
        if (items[i] == NULL) {
            for (int j = 0; j < 13; j++) Py_XDECREF(items[j]);
            Py_DECREF(res);
            Py_XDECREF(fresh);
            return NULL;
        }
    }
    /* commit: the buffer is empty */
    if (rb->vkind == VK_OBJECT) {
        Py_DECREF(rb->values); /* items[7] holds it */
        rb->values = fresh;
    }
    if (rb->overflow != NULL) {
        Py_DECREF(rb->overflow); /* items[10] holds it */
        rb->overflow = NULL;
    }
    Py_ssize_t kused = rb->koff[n], nused = rb->noff[n];
    rb->n = 0;
    rb->nulls = 0;
    rb->kg_min = 65536;
    rb->kg_max = -1;
    rb_shrink(rb, n, kused, nused);
    for (int i = 0; i < 13; i++) PyTuple_SET_ITEM(res, i, items[i]);
    return res;
}

static PyObject *rb_get_value_kind(RecordBuffer *rb, void *closure) { return PyLong_FromLong(rb->vkind); }
static PyObject *rb_get_records(RecordBuffer *rb, void *closure) { return PyLong_FromSsize_t(rb->n); }

static PyMethodDef rb_methods[] = {
    {"extend", (PyCFunction)rb_extend, METH_O, "Append one narrow record (a 5-tuple)."},
    {"take", (PyCFunction)rb_take, METH_NOARGS, "Remove and return every record as columns."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef rb_getset[] = {
    {"value_kind", (getter)rb_get_value_kind, NULL, "0: Python objects, 1: int64, 2: float64", NULL},
    {"records", (getter)rb_get_records, NULL, "number of records", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods rb_as_sequence = {.sq_length = (lenfunc)rb_len};

static PyTypeObject RecordBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "statelog._ext.fastpath.RecordBuffer",
    .tp_basicsize = sizeof(RecordBuffer),
    .tp_dealloc = (destructor)rb_dealloc,
    .tp_as_sequence = &rb_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)rb_traverse,
    .tp_clear = (inquiry)rb_clear,
    .tp_methods = rb_methods,
    .tp_getset = rb_getset,
    .tp_new = rb_new,
    .tp_doc = "RecordBuffer(value_kind=0): the narrow records of one changelog stream, as columns.",
};

/* ---------------------------------------------------------------------------------------- */
/* ValueUpdate                                                                              */

typedef struct {
    PyObject_HEAD
    PyObject *nsctx;    /* the state's [current table, current namespace bytes] */
    PyObject *cell;     /* the stream's [buffer limit], or NULL */
    PyObject *ctx;      /* the backend's key context */
    PyTypeObject *ctx_type; /* type(ctx) when its key and key_info are slots, else NULL */
    Py_ssize_t key_off, info_off; /* offsets of those slots in ctx_type's instances */
    PyObject *buf;      /* RecordBuffer or list, or NULL without changelog */
    RecordBuffer *rb;   /* buf when it is a RecordBuffer, else NULL */
    PyObject *stream;   /* stream, or NULL */
    PyObject *pytype;   /* the Python type that passes without calling check */
    int is_int;
    int opc;
    long long lo, hi;
    PyObject *check;
    PyObject *clear;
    PyObject *op;
    vectorcallfunc vectorcall;
} Update;

static void update_dealloc(Update *self) {
    PyObject_GC_UnTrack(self);
    Py_CLEAR(self->nsctx); Py_CLEAR(self->cell); Py_CLEAR(self->ctx); Py_CLEAR(self->ctx_type);
    Py_CLEAR(self->buf);
    Py_CLEAR(self->stream);
    Py_CLEAR(self->pytype); Py_CLEAR(self->check); Py_CLEAR(self->clear); Py_CLEAR(self->op);
    PyObject_GC_Del(self);
}

static int update_traverse(Update *self, visitproc visit, void *arg) {
    Py_VISIT(self->nsctx); Py_VISIT(self->cell); Py_VISIT(self->ctx); Py_VISIT(self->ctx_type);
    Py_VISIT(self->buf);
    Py_VISIT(self->stream);
    Py_VISIT(self->pytype); Py_VISIT(self->check); Py_VISIT(self->clear); Py_VISIT(self->op);
    return 0;
}

/* A new reference to the key context's attribute name (slot at off), or NULL with an error. */
ALWAYS_INLINE PyObject *ctx_get(Update *self, Py_ssize_t off, PyObject *name) {
    if (Py_TYPE(self->ctx) == self->ctx_type) {
        PyObject *v = *(PyObject **)((char *)self->ctx + off);
        if (v == NULL) {
            PyErr_Format(PyExc_AttributeError, "key context has no %R (not set)", name);
            return NULL;
        }
        Py_INCREF(v);
        return v;
    }
    return PyObject_GetAttr(self->ctx, name);
}

static PyObject *update_call(Update *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)) {
        PyErr_SetString(PyExc_TypeError, "update() takes exactly one positional argument");
        return NULL;
    }
    PyObject *v = args[0];
    int ok = 0;
    long long x = 0;
    if ((PyObject *)Py_TYPE(v) == self->pytype) {
        if (self->is_int) {
            int overflow = 0;
            x = PyLong_AsLongLongAndOverflow(v, &overflow);
            if (x == -1 && PyErr_Occurred()) return NULL;
            ok = !overflow && x >= self->lo && x <= self->hi;
        } else {
            ok = 1;
        }
    }
    if (!ok) {
        if (v == Py_None) return PyObject_CallNoArgs(self->clear);
        PyObject *r = PyObject_CallOneArg(self->check, v);
        if (r == NULL) return NULL;
        Py_DECREF(r);
    }
    PyObject *cur = PyList_GET_ITEM(self->nsctx, 0);
    PyObject *key = ctx_get(self, self->key_off, s_key);
    if (key == NULL) return NULL;
    Py_INCREF(cur);
    int rc = PyObject_SetItem(cur, key, v); /* may run Python code (__hash__, __eq__) */
    Py_DECREF(cur);
    if (rc < 0 || self->buf == NULL) {
        Py_DECREF(key);
        if (rc < 0) return NULL;
        Py_RETURN_NONE;
    }

    PyObject *kinfo = ctx_get(self, self->info_off, s_key_info);
    if (kinfo == NULL) { Py_DECREF(key); return NULL; }
    if (!PyTuple_CheckExact(kinfo) || PyTuple_GET_SIZE(kinfo) != 3) {
        Py_DECREF(kinfo);
        Py_DECREF(key);
        PyErr_SetString(PyExc_TypeError, "fast path: the key context's key_info must be a 3-tuple");
        return NULL;
    }
    /* kinfo is (type, key bytes, key group) of the current key: the key bytes may be
     * encoded from the key object instead when kinfo describes a key of its exact type */
    int key_fast_ok = PyTuple_GET_ITEM(kinfo, 0) == (PyObject *)Py_TYPE(key);
    PyObject *lim = PyList_GET_ITEM(self->cell, 0);
    Py_ssize_t limit = small_nonneg(lim);
    if (limit < 0) {
        limit = PyLong_AsSsize_t(lim);
        if (limit == -1 && PyErr_Occurred()) { Py_DECREF(kinfo); Py_DECREF(key); return NULL; }
    }
    Py_ssize_t len;
    if (self->rb != NULL) {
        PyObject *nsb = PyList_GET_ITEM(self->nsctx, 1);
        Py_INCREF(nsb);
        int fast = ok && self->is_int && self->rb->vkind == VK_INT64;
        char kbuf[KEY_FAST_MAX];
        Py_ssize_t ks = key_fast_ok ? encode_key_fast(key, kbuf) : 0;
        if (ks > 0)
            rc = rb_append_key(self->rb, kbuf, ks, PyTuple_GET_ITEM(kinfo, 2), nsb, self->opc, v, fast, x);
        else
            rc = rb_append(self->rb, PyTuple_GET_ITEM(kinfo, 1), PyTuple_GET_ITEM(kinfo, 2), nsb,
                           self->opc, v, fast, x);
        Py_DECREF(nsb);
        Py_DECREF(kinfo);
        Py_DECREF(key);
        if (rc < 0) return NULL;
        len = self->rb->n * WIDTH;
    } else {
        Py_DECREF(key);
        /* one whole record; no Python code runs between these appends */
        if (PyList_Append(self->buf, PyTuple_GET_ITEM(kinfo, 1)) < 0 ||
            PyList_Append(self->buf, PyTuple_GET_ITEM(kinfo, 2)) < 0 ||
            PyList_Append(self->buf, PyList_GET_ITEM(self->nsctx, 1)) < 0 ||
            PyList_Append(self->buf, self->op) < 0 || PyList_Append(self->buf, v) < 0) {
            Py_DECREF(kinfo);
            return NULL;
        }
        Py_DECREF(kinfo);
        len = PyList_GET_SIZE(self->buf);
    }
    if (len >= limit) {
        PyObject *r = PyObject_CallMethodNoArgs(self->stream, s_on_buffer_full);
        if (r == NULL) return NULL;
        Py_DECREF(r);
    }
    Py_RETURN_NONE;
}

static PyTypeObject UpdateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "statelog._ext.fastpath.ValueUpdate",
    .tp_basicsize = sizeof(Update),
    .tp_dealloc = (destructor)update_dealloc,
    .tp_vectorcall_offset = offsetof(Update, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_traverse = (traverseproc)update_traverse,
    .tp_doc = "Fast update() of a value-like state (see statelog/state/kinds.py).",
};

/* The offset of the object slot name in the instances of tp, or -1 when name is not such a
 * slot of tp (no error set). */
static Py_ssize_t slot_offset(PyTypeObject *tp, PyObject *name) {
    PyObject *d = PyObject_GetAttr((PyObject *)tp, name); /* a slot gives its descriptor */
    if (d == NULL) { PyErr_Clear(); return -1; }
    Py_ssize_t off = -1;
    if (Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type == Py_T_OBJECT_EX && m->offset > 0 && PyType_IsSubtype(tp, PyDescr_TYPE(d)))
            off = m->offset;
    }
    Py_DECREF(d);
    return off;
}

/* make_update(ctx, buf, stream, pytype, lo, hi, check, clear, op, nsctx, cell) */
static PyObject *make_update(PyObject *module, PyObject *args) {
    PyObject *ctx, *buf, *stream, *pytype, *lo, *hi, *check, *clear, *op, *nsctx, *cell;
    if (!PyArg_UnpackTuple(args, "make_update", 11, 11, &ctx, &buf, &stream, &pytype, &lo,
                           &hi, &check, &clear, &op, &nsctx, &cell))
        return NULL;
    int is_rb = Py_IS_TYPE(buf, &RecordBufferType);
    if ((buf != Py_None && ((!is_rb && !PyList_CheckExact(buf)) || !PyList_CheckExact(cell) ||
                            PyList_GET_SIZE(cell) != 1)) ||
        !PyList_CheckExact(nsctx) || PyList_GET_SIZE(nsctx) != 2) {
        PyErr_SetString(PyExc_TypeError, "make_update: bad buffer, limit cell or namespace context");
        return NULL;
    }
    long opc = PyLong_AsLong(op);
    if (opc == -1 && PyErr_Occurred()) return NULL;
    if (opc < 0 || opc > 255) {
        PyErr_SetString(PyExc_ValueError, "make_update: op out of range");
        return NULL;
    }
    Update *self = PyObject_GC_New(Update, &UpdateType);
    if (self == NULL) return NULL;
    self->opc = (int)opc;
    self->is_int = (pytype == (PyObject *)&PyLong_Type);
    self->lo = LLONG_MIN;
    self->hi = LLONG_MAX;
    if (self->is_int) {
        int of = 0;
        long long l = PyLong_AsLongLongAndOverflow(lo, &of);
        if (l == -1 && PyErr_Occurred()) { PyObject_GC_Del(self); return NULL; }
        self->lo = of < 0 ? LLONG_MIN : (of > 0 ? LLONG_MAX : l);
        long long h = PyLong_AsLongLongAndOverflow(hi, &of);
        if (h == -1 && PyErr_Occurred()) { PyObject_GC_Del(self); return NULL; }
        self->hi = of > 0 ? LLONG_MAX : (of < 0 ? LLONG_MIN : h);
    }
    Py_INCREF(ctx); self->ctx = ctx;
    self->key_off = slot_offset(Py_TYPE(ctx), s_key);
    self->info_off = slot_offset(Py_TYPE(ctx), s_key_info);
    if (self->key_off > 0 && self->info_off > 0) {
        self->ctx_type = Py_TYPE(ctx);
        Py_INCREF(self->ctx_type);
    } else {
        self->ctx_type = NULL;
    }
    Py_INCREF(nsctx); self->nsctx = nsctx;
    if (buf == Py_None) { self->buf = NULL; self->rb = NULL; self->stream = NULL; self->cell = NULL; }
    else {
        Py_INCREF(buf); self->buf = buf;
        self->rb = is_rb ? (RecordBuffer *)buf : NULL;
        Py_INCREF(stream); self->stream = stream;
        Py_INCREF(cell); self->cell = cell;
    }
    Py_INCREF(pytype); self->pytype = pytype;
    Py_INCREF(check); self->check = check;
    Py_INCREF(clear); self->clear = clear;
    Py_INCREF(op); self->op = op;
    self->vectorcall = (vectorcallfunc)update_call;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

/* ---------------------------------------------------------------------------------------- */
/* add_into: the read-modify-write of a batch reduction                                     */

#define HAD 1     /* the key had an entry before the call (its value in old[]) */
#define WROTE 2   /* the call set the key's entry */

/* Whether a buffer (got with PyBUF_FORMAT) holds native int64s. */
static int int64_format(const Py_buffer *view) {
    const char *f = view->format ? view->format : "B";
    if (*f == '@' || *f == '=') f++; /* native byte order */
    return view->itemsize == 8 && (f[0] == 'l' || f[0] == 'q') && f[1] == '\0';
}

/* Whether a buffer holds uint16s (numpy's to_numpy() of a key-group column). */
static int uint16_format(const Py_buffer *view) {
    const char *f = view->format ? view->format : "B";
    if (*f == '@' || *f == '=' || *f == '<') f++;
    return view->itemsize == 2 && f[0] == 'H' && f[1] == '\0';
}

/* obj's buffer as n native int64s in C order (writable when asked), or -1 with an error. */
static int int64_view(PyObject *obj, Py_buffer *view, Py_ssize_t n, int writable, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if (!int64_format(view) || view->len != n * 8) {
        PyErr_Format(PyExc_TypeError, "add_into: %s must be %zd int64s", what, n);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* keys[j] of add_into's keys (a list, or int64s ikeys), a new reference; NULL with an error
 * (no memory), or NULL without one when the list no longer holds it. */
static inline PyObject *key_at(PyObject *keys, const int64_t *ikeys, Py_ssize_t j) {
    if (ikeys != NULL) return PyLong_FromLongLong(ikeys[j]);
    if (j >= PyList_GET_SIZE(keys)) return NULL; /* only if Python code (a key's __eq__) shrank it */
    PyObject *k = PyList_GET_ITEM(keys, j);
    Py_INCREF(k);
    return k;
}

/* Put back the entries of keys[0:upto] that the call changed (newest first): the value it
 * held, or no entry. Keeps the pending exception, if any; an error of the undo itself (no
 * memory) is dropped, and that entry keeps the call's value. */
static void add_into_undo(PyObject *table, PyObject *keys, const int64_t *ikeys, const int64_t *old,
                          const uint8_t *flags, Py_ssize_t upto) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    for (Py_ssize_t j = upto - 1; j >= 0; j--) {
        if (!(flags[j] & WROTE)) continue;
        PyObject *key = key_at(keys, ikeys, j);
        if (key == NULL) {
            PyErr_Clear();
            continue;
        }
        int rc;
        if (flags[j] & HAD) {
            PyObject *v = PyLong_FromLongLong(old[j]);
            rc = v == NULL ? -1 : PyDict_SetItem(table, key, v);
            Py_XDECREF(v);
        } else {
            rc = PyDict_DelItem(table, key);
        }
        Py_DECREF(key);
        if (rc < 0) PyErr_Clear();
    }
    PyErr_Restore(et, ev, tb);
}

/* Prefetching a dict's lookups ahead of a loop over a batch of keys (add_into).
 *
 * A lookup in a dict of millions of entries misses the cache three times in a row: the
 * index slot, the entry, then the stored key and value objects. A loop over a batch knows
 * its next keys, so it asks for those lines ahead (__builtin_prefetch), a stage per miss:
 * the index slot of key i + PF_INDEX, the entry of key i + PF_ENTRY (its slot is cached by
 * then), the key and value objects of key i + PF_OBJECTS; the lookups themselves are the
 * API's (PyDict_GetItemWithError and PyDict_SetItem), which then find every line in the
 * cache. The stages read the dict's table in CPython's layout (Objects/dictobject.c,
 * 3.11 and 3.12), which is not a public API: only for prefetch addresses, every index
 * bounds-checked, and only after a self-check at import found the layout where it is
 * expected (dict_layout_ok); otherwise, and for keys other than exact ints and strs (whose
 * hash runs no Python code), nothing is prefetched and only the speed differs. */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030D0000 && !defined(Py_GIL_DISABLED)
#define HAVE_DICT_PREFETCH 1
typedef struct {
    Py_ssize_t dk_refcnt;
    uint8_t dk_log2_size;
    uint8_t dk_log2_index_bytes;
    uint8_t dk_kind; /* 0: general entries (hash, key, value); 1: str keys (key, value); 2: split */
    uint32_t dk_version;
    Py_ssize_t dk_usable;
    Py_ssize_t dk_nentries;
    char dk_indices[];
} DictKeys;
typedef struct { Py_hash_t hash; PyObject *key; PyObject *value; } DictEntry;
typedef struct { PyObject *key; PyObject *value; } DictStrEntry;
#endif

#define PF_INDEX 24
#define PF_ENTRY 12
#define PF_OBJECTS 4
#define PF_RING 32 /* > PF_INDEX, a power of 2 */

static int dict_layout_ok = 0;

typedef struct {
    Py_hash_t hash[PF_RING];
    Py_ssize_t ix[PF_RING];
} Prefetch;

#ifdef HAVE_DICT_PREFETCH
/* The entry index the first slot of hash h holds, or -1 (empty, deleted, out of range). */
static inline Py_ssize_t dk_slot(const DictKeys *dk, Py_hash_t h) {
    size_t slot = (size_t)h & (((size_t)1 << dk->dk_log2_size) - 1);
    Py_ssize_t ix;
    switch (dk->dk_log2_index_bytes - dk->dk_log2_size) {
    case 0: ix = ((const int8_t *)dk->dk_indices)[slot]; break;
    case 1: ix = ((const int16_t *)dk->dk_indices)[slot]; break;
    case 2: ix = ((const int32_t *)dk->dk_indices)[slot]; break;
    case 3: ix = (Py_ssize_t)((const int64_t *)dk->dk_indices)[slot]; break;
    default: return -1;
    }
    return ix >= 0 && ix < dk->dk_nentries ? ix : -1;
}

static inline const DictKeys *dict_keys(PyObject *table) {
    const PyDictObject *d = (const PyDictObject *)table;
    if (d->ma_values != NULL) return NULL; /* a split table (instance dicts) */
    const DictKeys *dk = (const DictKeys *)d->ma_keys;
    return dk->dk_kind <= 1 ? dk : NULL;
}

static inline const char *dk_entries(const DictKeys *dk) {
    return dk->dk_indices + ((size_t)1 << dk->dk_log2_index_bytes);
}

/* Both entry kinds: the key and value of entry ix. */
static inline void dk_entry(const DictKeys *dk, Py_ssize_t ix, PyObject **key, PyObject **value) {
    if (dk->dk_kind == 0) {
        const DictEntry *e = (const DictEntry *)dk_entries(dk) + ix;
        *key = e->key;
        *value = e->value;
    } else {
        const DictStrEntry *e = (const DictStrEntry *)dk_entries(dk) + ix;
        *key = e->key;
        *value = e->value;
    }
}
#endif

/* The first prefetch stage, for key j of the batch (its object k): its hash and index slot.
 * Only exact ints and strs are hashed here (their hash runs no Python code). */
static inline void prefetch_slot(PyObject *table, PyObject *k, Py_ssize_t j, Prefetch *pf) {
    pf->hash[j & (PF_RING - 1)] = -1;
#ifdef HAVE_DICT_PREFETCH
    if (!dict_layout_ok || k == NULL || !(PyLong_CheckExact(k) || PyUnicode_CheckExact(k))) return;
    const DictKeys *dk = dict_keys(table);
    if (dk == NULL) return;
    Py_hash_t h = PyObject_Hash(k);
    if (h == -1) {
        PyErr_Clear();
        return;
    }
    pf->hash[j & (PF_RING - 1)] = h;
    size_t slot = (size_t)h & (((size_t)1 << dk->dk_log2_size) - 1);
    __builtin_prefetch(dk->dk_indices + (slot << (dk->dk_log2_index_bytes - dk->dk_log2_size)));
#else
    (void)table; (void)k;
#endif
}

/* The later stages before the lookup of key i (i may start at -PF_INDEX to fill the
 * pipeline): the entry of key i + PF_ENTRY, the key and value objects of key i + PF_OBJECTS.
 * The dict may have been resized since a stage ran: a stale index then only prefetches a
 * useless line (every read is bounds-checked against the current table). */
static inline void prefetch_entries(PyObject *table, Py_ssize_t i, Py_ssize_t n, Prefetch *pf) {
#ifdef HAVE_DICT_PREFETCH
    if (!dict_layout_ok) return;
    const DictKeys *dk = dict_keys(table);
    if (dk == NULL) return;
    Py_ssize_t j = i + PF_ENTRY;
    if (j >= 0 && j < n) {
        Py_hash_t h = pf->hash[j & (PF_RING - 1)];
        Py_ssize_t ix = h == -1 ? -1 : dk_slot(dk, h);
        pf->ix[j & (PF_RING - 1)] = ix;
        if (ix >= 0)
            __builtin_prefetch(dk_entries(dk) + (size_t)ix * (dk->dk_kind == 0 ? sizeof(DictEntry) : sizeof(DictStrEntry)));
    }
    j = i + PF_OBJECTS;
    if (j >= 0 && j < n) {
        Py_ssize_t ix = pf->ix[j & (PF_RING - 1)];
        if (ix >= 0 && ix < dk->dk_nentries) {
            PyObject *key, *value;
            dk_entry(dk, ix, &key, &value);
            if (key != NULL) __builtin_prefetch(key);
            if (value != NULL) __builtin_prefetch(value);
        }
    }
#else
    (void)table; (void)i; (void)n; (void)pf;
#endif
}

/* Whether dicts are laid out as the prefetch stages read them: every key of a dict of ints and of
 * a dict of strs found through its first slot or a later probe, with its value (checked
 * once, at import). */
static int check_dict_layout(void) {
#ifdef HAVE_DICT_PREFETCH
    int ok = 1;
    for (int kind = 0; kind < 2 && ok; kind++) {
        PyObject *d = PyDict_New();
        if (d == NULL) return -1;
        int found = 0;
        for (long k = 0; k < 1000 && ok; k++) {
            PyObject *key = kind == 0 ? PyLong_FromLong(k * 7919) : PyUnicode_FromFormat("k%ld", k);
            PyObject *v = PyLong_FromLong(k);
            if (key == NULL || v == NULL || PyDict_SetItem(d, key, v) < 0) {
                Py_XDECREF(key); Py_XDECREF(v); Py_DECREF(d);
                return -1;
            }
            Py_DECREF(v);
            Py_DECREF(key);
        }
        const DictKeys *dk = dict_keys(d);
        if (dk == NULL || dk->dk_nentries != 1000 || dk->dk_kind != kind ||
            dk->dk_log2_size < 10 || dk->dk_log2_size > 16 ||
            dk->dk_log2_index_bytes - dk->dk_log2_size != 1) {
            ok = 0;
        } else {
            Py_ssize_t pos = 0;
            PyObject *key, *value;
            while (PyDict_Next(d, &pos, &key, &value)) {
                Py_hash_t h = PyObject_Hash(key);
                Py_ssize_t ix = dk_slot(dk, h);
                PyObject *k2 = NULL, *v2 = NULL;
                if (ix >= 0) dk_entry(dk, ix, &k2, &v2);
                if (k2 == key && v2 == value) found++;
                PyObject *k3, *v3;
                dk_entry(dk, pos - 1, &k3, &v3); /* entries in insertion order, no deletions */
                if (k3 != key || v3 != value) ok = 0;
            }
            if (found < 500) ok = 0; /* most keys sit in their first slot */
        }
        Py_DECREF(d);
    }
    dict_layout_ok = ok;
#endif
    return 0;
}

/* add_into(table, keys, partial, out, op, lo, hi) -> bool
 *
 * For each i: table[keys[i]] = fold(table.get(keys[i]), partial[i]) and out[i] = that value,
 * each key looked up once and set while its entry is still in the cache (the keys are
 * distinct). keys: a list, or a buffer of int64s (each key the int of that value, made here a
 * few keys ahead of its lookup: no list of them). op: FOLD_SUM (an absent entry counts as 0),
 * FOLD_MIN or FOLD_MAX (an absent entry takes partial[i]). An entry whose value the fold
 * leaves unchanged is not written.
 *
 * All or nothing: returns True when every key was folded. When a stored value is not an
 * exact int in [lo, hi] or a result is not in [lo, hi] (int64 overflow included), the
 * entries changed so far are put back and it returns False: the caller folds the batch its
 * own way, which raises its own errors. Raises only for a failure of the dict itself (no
 * memory, a key's __hash__ or __eq__), after putting back the same way. */
static PyObject *add_into(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "add_into(table, keys, partial, out, op, lo, hi)");
        return NULL;
    }
    PyObject *table = args[0], *keys = args[1];
    if (!PyDict_CheckExact(table)) {
        PyErr_SetString(PyExc_TypeError, "add_into: table must be a dict");
        return NULL;
    }
    long op;
    long long lo, hi;
    if (fold_args(args, &op, &lo, &hi) < 0) return NULL;
    Py_buffer kv = {0}, pv, ov;
    const int64_t *ikeys = NULL;
    Py_ssize_t n;
    if (PyList_CheckExact(keys)) {
        n = PyList_GET_SIZE(keys);
    } else {
        int ok = PyObject_GetBuffer(keys, &kv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) == 0;
        if (ok && !int64_format(&kv)) {
            PyBuffer_Release(&kv);
            ok = 0;
        }
        if (!ok) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "add_into: keys must be a list or a buffer of int64s");
            return NULL;
        }
        n = kv.len / 8;
        ikeys = (const int64_t *)kv.buf;
    }
    if (int64_view(args[2], &pv, n, 0, "partial") < 0) {
        if (ikeys) PyBuffer_Release(&kv);
        return NULL;
    }
    if (int64_view(args[3], &ov, n, 1, "out") < 0) {
        PyBuffer_Release(&pv);
        if (ikeys) PyBuffer_Release(&kv);
        return NULL;
    }
    const int64_t *partial = (const int64_t *)pv.buf;
    int64_t *out = (int64_t *)ov.buf;
    /* what to put back: the old value and the flags of each key */
    int64_t *old = PyMem_Malloc((size_t)(n ? n : 1) * (sizeof(int64_t) + 1));
    if (old == NULL) {
        PyBuffer_Release(&pv);
        PyBuffer_Release(&ov);
        if (ikeys) PyBuffer_Release(&kv);
        return PyErr_NoMemory();
    }
    uint8_t *flags = (uint8_t *)(old + n);
    int declined = 0;
    Prefetch pf;
    PyObject *ring[PF_RING] = {NULL}; /* the keys from index i to i + PF_INDEX, owned */
    Py_ssize_t i;
    for (i = -PF_INDEX; i < n; i++) {
        Py_ssize_t j = i + PF_INDEX; /* the key whose object and slot come now */
        if (j < n) {
            PyObject *k = key_at(keys, ikeys, j);
            if (k == NULL && PyErr_Occurred()) break;
            ring[j & (PF_RING - 1)] = k;
            prefetch_slot(table, k, j, &pf);
        }
        prefetch_entries(table, i, n, &pf);
        if (i < 0) continue;
        PyObject *key = ring[i & (PF_RING - 1)]; /* (owned) */
        ring[i & (PF_RING - 1)] = NULL;
        if (key == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "add_into: the key list changed");
            break;
        }
        PyObject *cur = PyDict_GetItemWithError(table, key); /* borrowed: read before any call */
        int64_t p = partial[i], o = 0, x = p;
        uint8_t f = 0;
        if (cur == NULL) {
            if (PyErr_Occurred()) { Py_DECREF(key); break; }
        } else {
            int of = 0;
            long long y = PyLong_CheckExact(cur) ? PyLong_AsLongLongAndOverflow(cur, &of) : 0;
            if (!PyLong_CheckExact(cur) || of || y < lo || y > hi) { Py_DECREF(key); declined = 1; break; }
            o = (int64_t)y;
            f = HAD;
            if (op == FOLD_SUM) {
                if ((p > 0 && o > INT64_MAX - p) || (p < 0 && o < INT64_MIN - p)) {
                    Py_DECREF(key);
                    declined = 1;
                    break;
                }
                x = o + p;
            } else if (op == FOLD_MIN) x = o < p ? o : p;
            else x = o > p ? o : p;
        }
        if (x < lo || x > hi) { Py_DECREF(key); declined = 1; break; }
        out[i] = x;
        old[i] = o;
        flags[i] = f;
        if (f && x == o) { Py_DECREF(key); continue; }
        PyObject *v = PyLong_FromLongLong(x);
        int rc = v == NULL ? -1 : PyDict_SetItem(table, key, v);
        Py_XDECREF(v);
        Py_DECREF(key);
        if (rc < 0) break;
        flags[i] = f | WROTE;
    }
    for (int r = 0; r < PF_RING; r++) Py_XDECREF(ring[r]); /* the keys made ahead of a stop */
    if (i < 0) i = 0; /* (stopped while filling the pipeline: nothing changed) */
    if (i < n) add_into_undo(table, keys, ikeys, old, flags, i);
    PyMem_Free(old);
    PyBuffer_Release(&pv);
    PyBuffer_Release(&ov);
    if (ikeys) PyBuffer_Release(&kv);
    if (i == n) Py_RETURN_TRUE;
    if (declined) Py_RETURN_FALSE;
    return NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* put_items: a restore's bulk load                                                         */

/* put_items(table, keys, values, start, stop): table[keys[i]] = values[i] for i in
 * [start, stop), in order (as dict.update(zip(keys[start:stop], values[start:stop])) does),
 * with the dict's lines prefetched a few keys ahead as add_into does: a restore installs a
 * key group's (or a piece's) keys in key-group order, which is random in the dict's index,
 * so each key's slot would otherwise be a cache miss of its own. */
static PyObject *put_items(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t start, stop;
    if (bulk_range(args, nargs, nargs == 5 && PyDict_CheckExact(args[0]),
                   "put_items(table: dict, keys: list, values: list, start, stop)", &start, &stop) < 0)
        return NULL;
    PyObject *table = args[0], *keys = args[1], *values = args[2];
    Prefetch pf;
    Py_ssize_t n = stop - start;
    for (Py_ssize_t i = -PF_INDEX; i < n; i++) {
        Py_ssize_t j = i + PF_INDEX;
        /* (the lists cannot shrink meanwhile: only a key's __hash__ or __eq__ runs Python code,
         * and those of exact ints and strs, the only keys prefetched, do not) */
        if (j < n && start + j < PyList_GET_SIZE(keys)) prefetch_slot(table, PyList_GET_ITEM(keys, start + j), j, &pf);
        else if (j < n) pf.hash[j & (PF_RING - 1)] = -1;
        prefetch_entries(table, i, n, &pf);
        if (i < 0) continue;
        if (start + i >= PyList_GET_SIZE(keys) || start + i >= PyList_GET_SIZE(values)) {
            PyErr_SetString(PyExc_RuntimeError, "put_items: the lists changed");
            return NULL;
        }
        PyObject *key = PyList_GET_ITEM(keys, start + i), *value = PyList_GET_ITEM(values, start + i);
        Py_INCREF(key);
        Py_INCREF(value);
        int rc = PyDict_SetItem(table, key, value);
        Py_DECREF(key);
        Py_DECREF(value);
        if (rc < 0) return NULL;
    }
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------- */
/* radix_sort: the sort of a batch's int64 keys                                             */

/* radix_sort(values, bits): sort a C-contiguous buffer of int64s in [0, 2**bits) in place,
 * ascending (an LSD radix sort in passes of at most 11 bits, skipping a pass whose digit
 * every value shares), without the GIL. add_many's grouping sorts a batch's keys (or keys
 * and values packed into one int64) with it: about 4x faster than numpy's sort here. A value
 * outside the range raises ValueError (nothing sorted). */
static PyObject *radix_sort(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "radix_sort(values, bits)");
        return NULL;
    }
    long bits = PyLong_AsLong(args[1]);
    if (bits == -1 && PyErr_Occurred()) return NULL;
    if (bits < 0 || bits > 63) {
        PyErr_SetString(PyExc_ValueError, "radix_sort: bits must be in [0, 63]");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) return NULL;
    if (!int64_format(&view)) {
        PyErr_SetString(PyExc_TypeError, "radix_sort: values must be int64s");
        PyBuffer_Release(&view);
        return NULL;
    }
    Py_ssize_t n = view.len / 8;
    uint64_t *a = (uint64_t *)view.buf;
    uint64_t limit = bits == 63 ? (uint64_t)INT64_MAX : ((uint64_t)1 << bits) - 1;
    int bad = 0;
    uint64_t *tmp = NULL;
    if (n > 1 && bits > 0) tmp = PyMem_RawMalloc((size_t)n * sizeof(uint64_t));
    if (n > 1 && bits > 0 && tmp == NULL) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        if (a[i] > limit) { bad = 1; break; }
    if (!bad && tmp != NULL) {
        int passes = (int)((bits + 10) / 11);
        int width = (int)((bits + passes - 1) / passes);
        size_t buckets = (size_t)1 << width;
        Py_ssize_t *count = PyMem_RawCalloc(buckets, sizeof(Py_ssize_t));
        if (count == NULL) bad = 2;
        uint64_t *src = a, *dst = tmp;
        for (int p = 0; p < passes && !bad; p++) {
            int shift = p * width;
            uint64_t mask = buckets - 1;
            memset(count, 0, buckets * sizeof(Py_ssize_t));
            for (Py_ssize_t i = 0; i < n; i++) count[(src[i] >> shift) & mask]++;
            if (count[(src[0] >> shift) & mask] == n) continue; /* one digit: nothing to move */
            Py_ssize_t sum = 0;
            for (size_t b = 0; b < buckets; b++) {
                Py_ssize_t c = count[b];
                count[b] = sum;
                sum += c;
            }
            for (Py_ssize_t i = 0; i < n; i++) dst[count[(src[i] >> shift) & mask]++] = src[i];
            uint64_t *t = src;
            src = dst;
            dst = t;
        }
        if (!bad && src != a) memcpy(a, src, (size_t)n * sizeof(uint64_t));
        PyMem_RawFree(count);
    }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(tmp);
    PyBuffer_Release(&view);
    if (bad == 1) {
        PyErr_Format(PyExc_ValueError, "radix_sort: a value is negative or not below 2**%ld", bits);
        return NULL;
    }
    if (bad == 2) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------- */
/* crc32_ranges                                                                             */
/* ---------------------------------------------------------------------------------------- */

/* CRC-32 (zlib's: reflected polynomial 0xEDB88320), slice-by-8. A changelog segment's blocks
 * are written in one Arrow IPC call and checksummed here in one call without the GIL: the
 * flusher then takes the GIL back a few times per segment instead of once per block, each
 * of which can wait for a task thread's long C call (statelog/changelog/encoder.py). */
static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = crc_table[0][i];
        for (int t = 1; t < 8; t++) {
            c = crc_table[0][c & 0xff] ^ (c >> 8);
            crc_table[t][i] = c;
        }
    }
}

static uint32_t crc32_update(uint32_t crc, const unsigned char *p, size_t n) {
    crc = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
        n--;
    }
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
#if PY_BIG_ENDIAN
        v = __builtin_bswap64(v);
#endif
        v ^= crc;
        crc = crc_table[7][v & 0xff] ^ crc_table[6][(v >> 8) & 0xff] ^ crc_table[5][(v >> 16) & 0xff] ^
              crc_table[4][(v >> 24) & 0xff] ^ crc_table[3][(v >> 32) & 0xff] ^ crc_table[2][(v >> 40) & 0xff] ^
              crc_table[1][(v >> 48) & 0xff] ^ crc_table[0][v >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

/* crc32_ranges(data, bounds, init, tail): for each i, the CRC-32 of data[bounds[i]:bounds[i+1]]
 * followed by tail, continuing from init (zlib.crc32(tail, zlib.crc32(range, init))). */
static PyObject *crc32_ranges(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "crc32_ranges(data, bounds, init, tail)");
        return NULL;
    }
    unsigned long init = PyLong_AsUnsignedLong(args[2]);
    if (init == (unsigned long)-1 && PyErr_Occurred()) return NULL;
    if (init > 0xFFFFFFFFul) {
        PyErr_SetString(PyExc_ValueError, "crc32_ranges: init must be a CRC-32 (below 2**32)");
        return NULL;
    }
    Py_buffer data, bounds, tail;
    if (PyObject_GetBuffer(args[0], &data, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(args[1], &bounds, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    if (PyObject_GetBuffer(args[3], &tail, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&bounds);
        return NULL;
    }
    PyObject *result = NULL;
    uint32_t *crcs = NULL;
    Py_ssize_t n = bounds.len / 8 - 1;
    const int64_t *b = (const int64_t *)bounds.buf;
    if (!int64_format(&bounds) || n < 0) {
        PyErr_SetString(PyExc_TypeError, "crc32_ranges: bounds must be at least one int64");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (b[i] < 0 || b[i] > b[i + 1] || b[i + 1] > data.len) {
            PyErr_SetString(PyExc_ValueError, "crc32_ranges: bounds must ascend within the data");
            goto done;
        }
    }
    crcs = PyMem_RawMalloc((size_t)(n > 0 ? n : 1) * sizeof(uint32_t));
    if (crcs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t c = crc32_update((uint32_t)init, (const unsigned char *)data.buf + b[i], (size_t)(b[i + 1] - b[i]));
        crcs[i] = crc32_update(c, (const unsigned char *)tail.buf, (size_t)tail.len);
    }
    Py_END_ALLOW_THREADS
    result = PyList_New(n);
    if (result == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLong(crcs[i]);
        if (v == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, i, v);
    }
done:
    PyMem_RawFree(crcs);
    PyBuffer_Release(&data);
    PyBuffer_Release(&bounds);
    PyBuffer_Release(&tail);
    return result;
}

/* kg_blocks(key_groups, target) -> (order, blocks) or None: the split of a changelog stream's
 * records into blocks of key-group ranges (statelog/changelog/encoder.py split_by_key_group,
 * whose numpy code is the reference): greedily in key-group order, a block ends once it holds
 * target rows, and a key group with that many rows is a block of its own. order (bytes of
 * int64s) lists the rows block by block, each block's in their given order; blocks are
 * (first row in order, rows, first key group, last key group). None: one block. One call
 * without the GIL instead of a dozen numpy calls, each of which releases it. */
static PyObject *kg_blocks(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "kg_blocks(key_groups, target)");
        return NULL;
    }
    double target = PyFloat_AsDouble(args[1]);
    if (target == -1.0 && PyErr_Occurred()) return NULL;
    if (!(target > 0)) {
        PyErr_SetString(PyExc_ValueError, "kg_blocks: target must be positive");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    if (!uint16_format(&view)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "kg_blocks: key groups must be uint16s");
        return NULL;
    }
    const uint16_t *kg = (const uint16_t *)view.buf;
    Py_ssize_t n = view.len / 2;
    PyObject *order = PyBytes_FromStringAndSize(NULL, (n > 0 ? n : 1) * 8);
    Py_ssize_t *counts = PyMem_RawCalloc(65536, sizeof(Py_ssize_t));
    Py_ssize_t *pos = PyMem_RawCalloc(65537, sizeof(Py_ssize_t));
    uint16_t *lut = PyMem_RawMalloc(65536 * sizeof(uint16_t));
    uint16_t *bmin = PyMem_RawMalloc(65536 * sizeof(uint16_t)), *bmax = PyMem_RawMalloc(65536 * sizeof(uint16_t));
    PyObject *result = NULL;
    if (order == NULL || counts == NULL || pos == NULL || lut == NULL || bmin == NULL || bmax == NULL) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    int64_t *ord = (int64_t *)PyBytes_AS_STRING(order);
    Py_ssize_t nblocks = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) counts[kg[i]]++;
    double acc = 0;
    Py_ssize_t b = -1;
    for (Py_ssize_t g = 0; g < 65536; g++) {
        Py_ssize_t c = counts[g];
        if (c == 0) continue;
        if (b < 0 || (acc > 0 && (acc >= target || (double)c >= target))) {
            b++;
            bmin[b] = (uint16_t)g;
            acc = 0;
        }
        lut[g] = (uint16_t)b;
        bmax[b] = (uint16_t)g;
        pos[b + 1] += c;
        acc += (double)c;
    }
    nblocks = b + 1;
    if (nblocks > 1) {
        for (Py_ssize_t k = 0; k < nblocks; k++) pos[k + 1] += pos[k];
        Py_ssize_t *next = counts; /* reused: each block's next slot */
        for (Py_ssize_t k = 0; k < nblocks; k++) next[k] = pos[k];
        for (Py_ssize_t i = 0; i < n; i++) ord[next[lut[kg[i]]]++] = i;
    }
    Py_END_ALLOW_THREADS
    if (nblocks <= 1) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    PyObject *blocks = PyList_New(nblocks);
    if (blocks == NULL) goto done;
    for (Py_ssize_t k = 0; k < nblocks; k++) {
        PyObject *t = Py_BuildValue("(nnii)", pos[k], pos[k + 1] - pos[k], (int)bmin[k], (int)bmax[k]);
        if (t == NULL) {
            Py_DECREF(blocks);
            goto done;
        }
        PyList_SET_ITEM(blocks, k, t);
    }
    result = PyTuple_Pack(2, order, blocks);
    Py_DECREF(blocks);
done:
    Py_XDECREF(order);
    PyMem_RawFree(counts);
    PyMem_RawFree(pos);
    PyMem_RawFree(lut);
    PyMem_RawFree(bmin);
    PyMem_RawFree(bmax);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"make_update", make_update, METH_VARARGS, "Build the fast update() of a value-like state."},
    {"put_items", (PyCFunction)(void (*)(void))put_items, METH_FASTCALL,
     "put_items(table, keys, values, start, stop): table[keys[i]] = values[i], prefetched."},
    {"radix_sort", (PyCFunction)(void (*)(void))radix_sort, METH_FASTCALL,
     "radix_sort(values, bits): sort int64s in [0, 2**bits) in place."},
    {"kg_blocks", (PyCFunction)(void (*)(void))kg_blocks, METH_FASTCALL,
     "kg_blocks(key_groups, target): a changelog stream's key-group blocks, as (order, blocks) or None."},
    {"crc32_ranges", (PyCFunction)(void (*)(void))crc32_ranges, METH_FASTCALL,
     "crc32_ranges(data, bounds, init, tail): zlib.crc32(tail, zlib.crc32(data[a:b], init)) per range."},
    {"add_into", (PyCFunction)(void (*)(void))add_into, METH_FASTCALL,
     "add_into(table, keys, partial, out, op, lo, hi): fold a batch into a dict of ints."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "fastpath", NULL, -1, methods};

PyMODINIT_FUNC PyInit_fastpath(void) {
    if (PyType_Ready(&UpdateType) < 0) return NULL;
    if (PyType_Ready(&RecordBufferType) < 0) return NULL;
    if (check_dict_layout() < 0) return NULL;
    crc_init();
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL;
    INTERN(s_key, "key") INTERN(s_key_info, "key_info") INTERN(s_on_buffer_full, "on_buffer_full")
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL) return NULL;
    Py_INCREF(&RecordBufferType);
    if (PyModule_AddObject(m, "RecordBuffer", (PyObject *)&RecordBufferType) < 0 ||
        PyModule_AddIntConstant(m, "VALUE_OBJECT", VK_OBJECT) < 0 ||
        PyModule_AddIntConstant(m, "VALUE_INT64", VK_INT64) < 0 ||
        PyModule_AddIntConstant(m, "VALUE_FLOAT64", VK_FLOAT64) < 0 ||
        PyModule_AddIntConstant(m, "WIDTH", WIDTH) < 0 ||
        PyModule_AddIntConstant(m, "FOLD_SUM", FOLD_SUM) < 0 ||
        PyModule_AddIntConstant(m, "FOLD_MIN", FOLD_MIN) < 0 ||
        PyModule_AddIntConstant(m, "FOLD_MAX", FOLD_MAX) < 0 ||
        PyModule_AddIntConstant(m, "DICT_PREFETCH", dict_layout_ok) < 0) {
        Py_DECREF(&RecordBufferType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
