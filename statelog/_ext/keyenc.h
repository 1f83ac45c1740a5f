/* The canonical key bytes of the two common key types, shared by the C modules
 * (statelog/keys/encoding.py encode_key is the reference; docs/format.md "Key encoding").
 *
 * encode_key_fast(key, out): the serialized key of an exact int in the int64 range or an
 * exact ASCII str of at most 127 characters, written to out (at least KEY_FAST_MAX bytes);
 * returns its length, or 0 for any other key. Keys equal in Python have one encoding (key
 * encoding 2): a bool or an integral float is not an exact int, so it returns 0 here and
 * the caller takes encode_key's bytes. */
#ifndef STATELOG_KEYENC_H
#define STATELOG_KEYENC_H
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define KEY_FAST_MAX 129
#define TAG_INT64 0x03
#define TAG_STR 0x06

static inline Py_ssize_t encode_key_fast(PyObject *key, char *out) {
    if (PyLong_CheckExact(key)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(key, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
        uint64_t u = (uint64_t)v ^ ((uint64_t)1 << 63); /* v + 2**63, big-endian */
        out[0] = TAG_INT64;
        for (int i = 8; i >= 1; i--) {
            out[i] = (char)(u & 0xFF);
            u >>= 8;
        }
        return 9;
    }
    if (PyUnicode_CheckExact(key) && PyUnicode_IS_COMPACT_ASCII(key)) {
        Py_ssize_t n = PyUnicode_GET_LENGTH(key);
        if (n > 127) return 0;
        out[0] = TAG_STR;
        out[1] = (char)n; /* varint of n < 128: one byte */
        memcpy(out + 2, PyUnicode_DATA(key), (size_t)n);
        return n + 2;
    }
    return 0;
}
#endif
