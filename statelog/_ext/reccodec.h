/* The values of the disk-backed working set's database (docs/format.md section 10): a key's
 * record ({state id: entry}) and a namespaced entry. A value made of plain types only (None,
 * bool, int of int64, float, str, bytes, and lists, tuples and dicts of them, nested at most
 * REC_MAX_DEPTH deep; exact types, not subclasses) is written in a plain form that starts
 * with REC_MAGIC; any other is a pickle (protocol 2 or later, so its first byte is 0x80).
 * rec_dumps and rec_loads here are the C versions of rec_dumps_py and rec_loads_py in
 * statelog/state/tables/disk/codec.py; tests compare them.
 *
 * plain form: REC_MAGIC | value
 * value:  R_NONE | R_FALSE | R_TRUE
 *       | R_INT   zigzag LEB128 of the int64
 *       | R_FLOAT 8 bytes, IEEE 754 binary64, little-endian
 *       | R_STR   LEB128 length | UTF-8 bytes
 *       | R_BYTES LEB128 length | bytes
 *       | R_LIST / R_TUPLE  LEB128 count | values
 *       | R_DICT  LEB128 count | (key value) pairs, in the dict's order
 * Reading checks every tag, length and count against the bytes left, and that nothing follows
 * the value: a value that does not parse raises ValueError. */
#ifndef STATELOG_RECCODEC_H
#define STATELOG_RECCODEC_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

#define REC_MAGIC 0x01
#define REC_PICKLE 0x80
#define REC_MAX_DEPTH 32
enum { R_NONE = 0, R_FALSE = 1, R_TRUE = 2, R_INT = 3, R_FLOAT = 4, R_STR = 5, R_BYTES = 6,
       R_LIST = 7, R_TUPLE = 8, R_DICT = 9 };

typedef struct {
    unsigned char *p;
    Py_ssize_t n, cap;
    unsigned char stack[256];
} rec_buf;

static int rec_grow(rec_buf *b, Py_ssize_t more) {
    if (b->n + more <= b->cap) return 0;
    Py_ssize_t cap = b->cap * 2;
    while (cap < b->n + more) cap *= 2;
    unsigned char *q;
    if (b->p == b->stack) {
        q = PyMem_Malloc((size_t)cap);
        if (q != NULL) memcpy(q, b->p, (size_t)b->n);
    } else {
        q = PyMem_Realloc(b->p, (size_t)cap);
    }
    if (q == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = q;
    b->cap = cap;
    return 0;
}

static int rec_put_uv(rec_buf *b, uint64_t v) {
    if (rec_grow(b, 10) < 0) return -1;
    while (v >= 0x80) {
        b->p[b->n++] = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    b->p[b->n++] = (unsigned char)v;
    return 0;
}

static int rec_put_bytes(rec_buf *b, int tag, const char *s, Py_ssize_t len) {
    if (rec_grow(b, 1) < 0) return -1;
    b->p[b->n++] = (unsigned char)tag;
    if (rec_put_uv(b, (uint64_t)len) < 0 || rec_grow(b, len) < 0) return -1;
    memcpy(b->p + b->n, s, (size_t)len);
    b->n += len;
    return 0;
}

/* 1: written; 0: not of the plain form's types (nothing set, the buffer may hold part of
 * it); -1: an error is set. */
static int rec_enc(rec_buf *b, PyObject *o, int depth) {
    PyTypeObject *t = Py_TYPE(o);
    if (o == Py_None || t == &PyBool_Type) {
        if (rec_grow(b, 1) < 0) return -1;
        b->p[b->n++] = o == Py_None ? R_NONE : o == Py_True ? R_TRUE : R_FALSE;
        return 1;
    }
    if (t == &PyLong_Type) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (overflow) return 0;
        if (v == -1 && PyErr_Occurred()) return -1;
        if (rec_grow(b, 1) < 0) return -1;
        b->p[b->n++] = R_INT;
        uint64_t u = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
        return rec_put_uv(b, u) < 0 ? -1 : 1;
    }
    if (t == &PyFloat_Type) {
        if (rec_grow(b, 9) < 0) return -1;
        b->p[b->n++] = R_FLOAT;
        if (PyFloat_Pack8(PyFloat_AS_DOUBLE(o), (char *)b->p + b->n, 1) < 0) return -1;
        b->n += 8;
        return 1;
    }
    if (t == &PyUnicode_Type) {
        if (PyUnicode_IS_COMPACT_ASCII(o))
            return rec_put_bytes(b, R_STR, (const char *)PyUnicode_DATA(o), PyUnicode_GET_LENGTH(o)) < 0 ? -1 : 1;
        /* a new bytes object: PyUnicode_AsUTF8AndSize would keep a UTF-8 copy in the str */
        PyObject *u = PyUnicode_AsUTF8String(o);
        if (u == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) return -1;
            PyErr_Clear(); /* lone surrogates: pickle keeps them */
            return 0;
        }
        int r = rec_put_bytes(b, R_STR, PyBytes_AS_STRING(u), PyBytes_GET_SIZE(u));
        Py_DECREF(u);
        return r < 0 ? -1 : 1;
    }
    if (t == &PyBytes_Type)
        return rec_put_bytes(b, R_BYTES, PyBytes_AS_STRING(o), PyBytes_GET_SIZE(o)) < 0 ? -1 : 1;
    if (depth >= REC_MAX_DEPTH) return 0;
    if (t == &PyList_Type || t == &PyTuple_Type) {
        int list = t == &PyList_Type;
        Py_ssize_t n = list ? PyList_GET_SIZE(o) : PyTuple_GET_SIZE(o);
        if (rec_grow(b, 1) < 0) return -1;
        b->p[b->n++] = list ? R_LIST : R_TUPLE;
        if (rec_put_uv(b, (uint64_t)n) < 0) return -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            /* no Python code runs while encoding (exact types only), so the list keeps its size */
            int r = rec_enc(b, list ? PyList_GET_ITEM(o, i) : PyTuple_GET_ITEM(o, i), depth + 1);
            if (r <= 0) return r;
        }
        return 1;
    }
    if (t == &PyDict_Type) {
        if (rec_grow(b, 1) < 0) return -1;
        b->p[b->n++] = R_DICT;
        if (rec_put_uv(b, (uint64_t)PyDict_GET_SIZE(o)) < 0) return -1;
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(o, &pos, &k, &v)) {
            int r = rec_enc(b, k, depth + 1);
            if (r <= 0) return r;
            r = rec_enc(b, v, depth + 1);
            if (r <= 0) return r;
        }
        return 1;
    }
    return 0;
}

/* the plain form of o as a new bytes object; Py_None (a new reference) when o is not of
 * its types; NULL with an error set */
static PyObject *rec_plain(PyObject *o) {
    rec_buf b;
    b.p = b.stack;
    b.n = 0;
    b.cap = (Py_ssize_t)sizeof(b.stack);
    b.p[b.n++] = REC_MAGIC;
    int r = rec_enc(&b, o, 0);
    PyObject *out = r < 0 ? NULL : r == 0 ? Py_NewRef(Py_None) : PyBytes_FromStringAndSize((const char *)b.p, b.n);
    if (b.p != b.stack) PyMem_Free(b.p);
    return out;
}

static PyObject *rec_corrupt(const char *what) {
    PyErr_Format(PyExc_ValueError, "a working-set value does not parse: %s", what);
    return NULL;
}

static int rec_get_uv(const unsigned char **pp, const unsigned char *end, uint64_t *out) {
    const unsigned char *p = *pp;
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (p >= end) break;
        unsigned char c = *p++;
        if (shift == 63 && c > 1) break;
        v |= (uint64_t)(c & 0x7F) << shift;
        if (!(c & 0x80)) {
            *pp = p;
            *out = v;
            return 0;
        }
    }
    rec_corrupt("a bad length or int");
    return -1;
}

static PyObject *rec_dec(const unsigned char **pp, const unsigned char *end, int depth) {
    if (*pp >= end) return rec_corrupt("it ends inside a value");
    int tag = *(*pp)++;
    uint64_t u;
    switch (tag) {
    case R_NONE: return Py_NewRef(Py_None);
    case R_FALSE: return Py_NewRef(Py_False);
    case R_TRUE: return Py_NewRef(Py_True);
    case R_INT:
        if (rec_get_uv(pp, end, &u) < 0) return NULL;
        return PyLong_FromLongLong((long long)(u >> 1) ^ -(long long)(u & 1));
    case R_FLOAT: {
        if (end - *pp < 8) return rec_corrupt("it ends inside a float");
        double d = PyFloat_Unpack8((const char *)*pp, 1);
        if (d == -1.0 && PyErr_Occurred()) return NULL;
        *pp += 8;
        return PyFloat_FromDouble(d);
    }
    case R_STR:
    case R_BYTES: {
        if (rec_get_uv(pp, end, &u) < 0) return NULL;
        if (u > (uint64_t)(end - *pp)) return rec_corrupt("a length beyond its end");
        const char *s = (const char *)*pp;
        *pp += u;
        return tag == R_STR ? PyUnicode_DecodeUTF8(s, (Py_ssize_t)u, "strict")
                            : PyBytes_FromStringAndSize(s, (Py_ssize_t)u);
    }
    case R_LIST:
    case R_TUPLE:
    case R_DICT: {
        if (depth >= REC_MAX_DEPTH) return rec_corrupt("nested too deep");
        if (rec_get_uv(pp, end, &u) < 0) return NULL;
        if (u > (uint64_t)(end - *pp) / (tag == R_DICT ? 2 : 1)) return rec_corrupt("a count beyond its end");
        Py_ssize_t n = (Py_ssize_t)u;
        PyObject *c = tag == R_LIST ? PyList_New(n) : tag == R_TUPLE ? PyTuple_New(n) : PyDict_New();
        if (c == NULL) return NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *k = rec_dec(pp, end, depth + 1);
            if (k == NULL) goto fail;
            if (tag == R_LIST) {
                PyList_SET_ITEM(c, i, k);
            } else if (tag == R_TUPLE) {
                PyTuple_SET_ITEM(c, i, k);
            } else {
                PyObject *v = rec_dec(pp, end, depth + 1);
                int r = v == NULL ? -1 : PyDict_SetItem(c, k, v);
                Py_DECREF(k);
                Py_XDECREF(v);
                if (r < 0) goto fail;
            }
        }
        return c;
    fail:
        Py_DECREF(c);
        return NULL;
    }
    default:
        return rec_corrupt("an unknown tag");
    }
}

/* a value of the plain form (its first byte REC_MAGIC) */
static PyObject *rec_parse(const unsigned char *p, Py_ssize_t n) {
    const unsigned char *end = p + n;
    p++;
    PyObject *v = rec_dec(&p, end, 0);
    if (v != NULL && p != end) {
        Py_DECREF(v);
        return rec_corrupt("bytes follow the value");
    }
    return v;
}

#endif
