/* The miss path of the disk-backed working set in C (statelog/state/tables/disk/).
 *
 * A key that is set current and not resident costs a database read and, once the resident
 * keys are over budget, the write-back of an evicted key: per miss, a few microseconds of
 * interpreter work around RocksDB's own (a key group, a database key, moving a key's entries
 * between its record and the states' dicts). These functions do that work in C; each has a
 * pure-Python reference in statelog/keys/groups.py or statelog/state/tables/disk/ (miss_path.py,
 * codec.py), which is also the fallback when this module is not built
 * (STATELOG_PURE_PYTHON=1 forces it), and tests compare the two on the same inputs.
 *
 * key_group(key_bytes, max_parallelism): murmur3's fmix32 of the CRC-32 (zlib's: reflected
 *     polynomial 0xEDB88320) of the key bytes, modulo max_parallelism.
 * key_groups(offsets, data, max_parallelism, out): key_group of each value of a binary Arrow
 *     array given by its buffers (offsets: n + 1 int32s, from the array's offset; data: its
 *     value bytes), written to out (n uint16s): the batch calls' and the router's key groups.
 * key_prefix(key_group, key_bytes): the database key of a key's record: key group (2 bytes,
 *     big-endian), length of the key bytes (4 bytes, big-endian), the key bytes.
 * install(key, record, index, primary, extra): put a key's record ({state id: entry}) into
 *     the states' dicts: primary[index[sid]][key] = entry, or extra[key][sid] = entry for a
 *     state id that is not registered.
 * admit(key, info, get, loads, present, index, primary, extra, resident): make a key resident:
 *     its record get(key_prefix(info[2], info[1])), when there is one, joins `present` and is
 *     installed from loads(record); resident[key] = info. Returns whether there was one.
 * write_back(keys, resident, drop, primary, sids, extra, present, put, delete, dumps,
 *     protocol): for each key, its entries of every state (primary[i][key] as sids[i], plus
 *     extra[key]) become one record, put(prefix, dumps(record, protocol)); a key with no
 *     entry left that is in `present` is deleted, delete(prefix). The puts and deletes are
 *     made in the order of their database keys, after every key is done. With drop, the
 *     entries, extra[key] and resident[key] are removed and the key leaves `present`;
 *     without, a key written becomes present. Returns the number of puts and deletes.
 * plan(keys, resident, lo, hi, max_parallelism, encode): the keys of a prefetch to read, in
 *     their order: each key of the iterable once, not in `resident`, hashable and encodable
 *     (exact ints of int64 and ASCII str of < 128 characters in C, others by encode(key);
 *     a key that fails either is skipped), of a key group in lo..hi. Returns
 *     (keys, infos, prefixes): lists of the keys, their (type, key bytes, key group) and
 *     their records' database keys.
 * install_many(keys, infos, raws, loads, present, index, primary, extra, resident): admit
 *     for each key with its record already read (raws[i], None when there is none).
 * rec_dumps(value, protocol), rec_loads(raw): a value of the database (a key's record or a
 *     namespaced entry) to bytes and back: the plain form for plain types, or a pickle of
 *     the given protocol (2 or later) for the others (reccodec.h).
 * clock_victims(resident, n, touched, current, missing): the resident keys an eviction
 *     writes back, oldest first (CLOCK): of the oldest 3n, a key in `touched` leaves it and
 *     moves to the back (a second chance), any other key but the current one is a victim,
 *     up to n; if fewer than n were found, the oldest keys not chosen (touched or not, but
 *     not the current one) fill up to n. `current` is the current key, or `missing`.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include "keyenc.h"
#include "reccodec.h"

static PyObject *pickle_dumps, *pickle_loads;

static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

static uint32_t crc32_of(const unsigned char *p, Py_ssize_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (Py_ssize_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

static uint32_t fmix32(uint32_t h) {
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    return h;
}

static PyObject *key_group(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "key_group(key_bytes: bytes, max_parallelism: int)");
        return NULL;
    }
    long maxp = PyLong_AsLong(args[1]);
    if (maxp == -1 && PyErr_Occurred()) return NULL;
    if (maxp <= 0) {
        PyErr_SetString(PyExc_ValueError, "key_group: max_parallelism must be positive");
        return NULL;
    }
    uint32_t h = fmix32(crc32_of((const unsigned char *)PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0])));
    return PyLong_FromUnsignedLong(h % (unsigned long)maxp);
}

/* A C-contiguous buffer of n items of itemsize bytes (writable when asked), or -1 with an error. */
static int items_view(PyObject *obj, Py_buffer *view, Py_ssize_t n, Py_ssize_t itemsize, int writable, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) return -1;
    if (view->len != n * itemsize) {
        PyErr_Format(PyExc_ValueError, "key_groups: %s must hold %zd items of %zd bytes", what, n, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *key_groups(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "key_groups(offsets, data, max_parallelism, out)");
        return NULL;
    }
    long maxp = PyLong_AsLong(args[2]);
    if (maxp == -1 && PyErr_Occurred()) return NULL;
    if (maxp <= 0 || maxp > 0x10000) {
        PyErr_SetString(PyExc_ValueError, "key_groups: max_parallelism must be in [1, 65536]");
        return NULL;
    }
    Py_buffer ov, dv, kv;
    if (PyObject_GetBuffer(args[3], &kv, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) return NULL;
    Py_ssize_t n = kv.len / 2;
    if (kv.len % 2) {
        PyErr_SetString(PyExc_ValueError, "key_groups: out must hold uint16s");
        PyBuffer_Release(&kv);
        return NULL;
    }
    if (items_view(args[0], &ov, n + 1, 4, 0, "offsets") < 0) { PyBuffer_Release(&kv); return NULL; }
    if (PyObject_GetBuffer(args[1], &dv, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&ov);
        PyBuffer_Release(&kv);
        return NULL;
    }
    const int32_t *off = (const int32_t *)ov.buf;
    const unsigned char *data = (const unsigned char *)dv.buf;
    uint16_t *out = (uint16_t *)kv.buf;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS /* (buffers held by the views) */
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t a = off[i], b = off[i + 1];
        if (a < 0 || b < a || b > dv.len) { bad = 1; break; }
        out[i] = (uint16_t)(fmix32(crc32_of(data + a, b - a)) % (uint32_t)maxp);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&ov);
    PyBuffer_Release(&dv);
    PyBuffer_Release(&kv);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "key_groups: offsets out of order or past the data");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* new reference to the prefix bytes, or NULL */
static PyObject *prefix_of(PyObject *kgo, PyObject *kb) {
    if (!PyBytes_Check(kb)) {
        PyErr_SetString(PyExc_TypeError, "key_prefix: key bytes must be bytes");
        return NULL;
    }
    long kg = PyLong_AsLong(kgo);
    if (kg == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t n = PyBytes_GET_SIZE(kb);
    if (kg < 0 || kg > 0xFFFF || n > 0xFFFFFFFFLL) {
        PyErr_SetString(PyExc_OverflowError, "key_prefix: key group or key length out of range");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, 6 + n);
    if (out == NULL) return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    uint64_t head = ((uint64_t)kg << 32) | (uint64_t)n;
    for (int i = 0; i < 6; i++) p[i] = (unsigned char)(head >> (8 * (5 - i)));
    memcpy(p + 6, PyBytes_AS_STRING(kb), n);
    return out;
}

static PyObject *key_prefix(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "key_prefix(key_group: int, key_bytes: bytes)");
        return NULL;
    }
    return prefix_of(args[0], args[1]);
}

static PyObject *install(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyDict_Check(args[1]) || !PyDict_Check(args[2]) || !PyList_Check(args[3]) ||
        !PyDict_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "install(key, record: dict, index: dict, primary: list, extra: dict)");
        return NULL;
    }
    PyObject *key = args[0], *rec = args[1], *index = args[2], *primary = args[3], *extra = args[4];
    PyObject *sid, *entry;
    Py_ssize_t pos = 0;
    while (PyDict_Next(rec, &pos, &sid, &entry)) {
        PyObject *i = PyDict_GetItemWithError(index, sid); /* borrowed */
        if (i == NULL) {
            if (PyErr_Occurred()) return NULL;
            /* a state restored but not registered yet: kept with the key */
            PyObject *mine = PyDict_GetItemWithError(extra, key);
            if (mine == NULL) {
                if (PyErr_Occurred()) return NULL;
                mine = PyDict_New();
                if (mine == NULL) return NULL;
                int rc = PyDict_SetItem(extra, key, mine);
                Py_DECREF(mine); /* extra holds it */
                if (rc < 0) return NULL;
            }
            if (PyDict_SetItem(mine, sid, entry) < 0) return NULL;
            continue;
        }
        Py_ssize_t j = PyLong_AsSsize_t(i);
        if (j == -1 && PyErr_Occurred()) return NULL;
        if (j < 0 || j >= PyList_GET_SIZE(primary) || !PyDict_Check(PyList_GET_ITEM(primary, j))) {
            PyErr_SetString(PyExc_IndexError, "install: a state index out of range");
            return NULL;
        }
        if (PyDict_SetItem(PyList_GET_ITEM(primary, j), key, entry) < 0) return NULL;
    }
    Py_RETURN_NONE;
}

/* make key resident with its record raw (borrowed; None: it has none): raw joins `present`
 * and is installed from loads(raw); resident[key] = info. 0, or -1 with an error set. */
static int install_raw(PyObject *module, PyObject *key, PyObject *info, PyObject *raw, PyObject *loads,
                       PyObject *present, PyObject *index, PyObject *primary, PyObject *extra, PyObject *res) {
    if (raw != Py_None) {
        if (PySet_Add(present, key) < 0) return -1;
        PyObject *argv[1] = {raw};
        PyObject *rec = PyObject_Vectorcall(loads, argv, 1, NULL);
        if (rec == NULL) return -1;
        if (!PyDict_Check(rec)) {
            Py_DECREF(rec);
            PyErr_SetString(PyExc_TypeError, "a key's record is not a dict");
            return -1;
        }
        PyObject *iargs[5] = {key, rec, index, primary, extra};
        PyObject *r = install(module, iargs, 5);
        Py_DECREF(rec);
        if (r == NULL) return -1;
        Py_DECREF(r);
    }
    return PyDict_SetItem(res, key, info);
}

/* admit(key, info, get, loads, present, index, primary, extra, resident) */
static PyObject *admit(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9 || !PyTuple_Check(args[1]) || PyTuple_GET_SIZE(args[1]) != 3 || !PySet_Check(args[4]) ||
        !PyDict_Check(args[8])) {
        PyErr_SetString(PyExc_TypeError,
                        "admit(key, info: (type, bytes, key group), get, loads, present: set, index, primary, "
                        "extra, resident: dict)");
        return NULL;
    }
    PyObject *key = args[0], *info = args[1];
    PyObject *prefix = prefix_of(PyTuple_GET_ITEM(info, 2), PyTuple_GET_ITEM(info, 1));
    if (prefix == NULL) return NULL;
    PyObject *argv[1] = {prefix};
    PyObject *raw = PyObject_Vectorcall(args[2], argv, 1, NULL);
    Py_DECREF(prefix);
    if (raw == NULL) return NULL;
    int found = raw != Py_None;
    int rc = install_raw(module, key, info, raw, args[3], args[4], args[5], args[6], args[7], args[8]);
    Py_DECREF(raw);
    if (rc < 0) return NULL;
    return PyBool_FromLong(found);
}

/* remove d[key] and return it (new reference), or NULL with no error when absent */
static PyObject *dict_take(PyObject *d, PyObject *key) {
    PyObject *v = PyDict_GetItemWithError(d, key);
    if (v == NULL) return NULL;
    Py_INCREF(v);
    if (PyDict_DelItem(d, key) < 0) {
        Py_DECREF(v);
        return NULL;
    }
    return v;
}

static PyObject *call2(PyObject *f, PyObject *a, PyObject *b) {
    PyObject *argv[2] = {a, b};
    return PyObject_Vectorcall(f, argv, 2, NULL);
}

typedef struct {
    PyObject *prefix; /* the record's database key (bytes) */
    PyObject *data;   /* the record's value, or NULL: delete the record */
} wb_op;

static int wb_op_cmp(const void *a, const void *b) {
    PyObject *x = ((const wb_op *)a)->prefix, *y = ((const wb_op *)b)->prefix;
    Py_ssize_t nx = PyBytes_GET_SIZE(x), ny = PyBytes_GET_SIZE(y);
    int c = memcmp(PyBytes_AS_STRING(x), PyBytes_AS_STRING(y), (size_t)(nx < ny ? nx : ny));
    return c != 0 ? c : (nx > ny) - (nx < ny);
}

static void wb_ops_free(wb_op *ops, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_DECREF(ops[i].prefix);
        Py_XDECREF(ops[i].data);
    }
    PyMem_Free(ops);
}

static PyObject *write_back(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11 || !PyList_Check(args[0]) || !PyDict_Check(args[1]) || !PyList_Check(args[3]) ||
        !PyList_Check(args[4]) || !PyDict_Check(args[5]) || !PySet_Check(args[6]) ||
        PyList_GET_SIZE(args[3]) != PyList_GET_SIZE(args[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "write_back(keys: list, resident: dict, drop: bool, primary: list, sids: list, "
                        "extra: dict, present: set, put, delete, dumps, protocol)");
        return NULL;
    }
    PyObject *keys = args[0], *res = args[1], *primary = args[3], *sids = args[4], *extra = args[5];
    PyObject *present = args[6], *put = args[7], *del = args[8], *dumps = args[9], *proto = args[10];
    int drop = PyObject_IsTrue(args[2]);
    if (drop < 0) return NULL;
    Py_ssize_t ntables = PyList_GET_SIZE(primary), nkeys = PyList_GET_SIZE(keys), nops = 0;
    /* the puts and deletes, issued in database-key order once every key is done: RocksDB's
     * memtable (a skip list) starts each insert from where the last one went, so a sorted
     * batch misses the CPU caches far less (an eviction's 55,000 records: 2.6x faster to
     * write; docs/performance.md) */
    wb_op *ops = PyMem_Malloc(sizeof(wb_op) * (size_t)(nkeys ? nkeys : 1));
    if (ops == NULL) return PyErr_NoMemory();
    for (Py_ssize_t k = 0; k < nkeys; k++) {
        PyObject *key = PyList_GET_ITEM(keys, k);
        Py_INCREF(key);
        PyObject *info = PyDict_GetItemWithError(res, key);
        PyObject *rec = NULL, *prefix = NULL, *data = NULL, *more = NULL;
        if (info == NULL) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
            goto fail;
        }
        if (!PyTuple_Check(info) || PyTuple_GET_SIZE(info) != 3) {
            PyErr_SetString(PyExc_TypeError, "write_back: a resident key's info is not (type, bytes, key group)");
            goto fail;
        }
        prefix = prefix_of(PyTuple_GET_ITEM(info, 2), PyTuple_GET_ITEM(info, 1));
        if (prefix == NULL) goto fail;
        rec = PyDict_New();
        if (rec == NULL) goto fail;
        for (Py_ssize_t i = 0; i < ntables; i++) {
            PyObject *table = PyList_GET_ITEM(primary, i), *v;
            if (!PyDict_Check(table)) {
                PyErr_SetString(PyExc_TypeError, "write_back: a state's table is not a dict");
                goto fail;
            }
            if (drop) {
                v = dict_take(table, key);
            } else {
                v = PyDict_GetItemWithError(table, key);
                Py_XINCREF(v);
            }
            if (v == NULL) {
                if (PyErr_Occurred()) goto fail;
                continue;
            }
            int rc = PyDict_SetItem(rec, PyList_GET_ITEM(sids, i), v);
            Py_DECREF(v);
            if (rc < 0) goto fail;
        }
        if (drop) {
            more = dict_take(extra, key);
        } else {
            more = PyDict_GetItemWithError(extra, key);
            Py_XINCREF(more);
        }
        if (more == NULL && PyErr_Occurred()) goto fail;
        if (more != NULL && PyDict_Update(rec, more) < 0) goto fail;
        if (PyDict_GET_SIZE(rec) > 0) {
            data = call2(dumps, rec, proto);
            if (data == NULL) goto fail;
            if (!PyBytes_Check(data)) {
                PyErr_SetString(PyExc_TypeError, "write_back: dumps did not return bytes");
                goto fail;
            }
            ops[nops].prefix = Py_NewRef(prefix);
            ops[nops++].data = Py_NewRef(data);
            if (!drop && PySet_Add(present, key) < 0) goto fail;
        } else {
            int in = PySet_Contains(present, key);
            if (in < 0) goto fail;
            if (in) {
                ops[nops].prefix = Py_NewRef(prefix);
                ops[nops++].data = NULL;
                if (PySet_Discard(present, key) < 0) goto fail;
            }
        }
        if (drop) {
            if (PySet_Discard(present, key) < 0) goto fail;
            if (PyDict_DelItem(res, key) < 0) goto fail;
        }
        Py_XDECREF(data);
        Py_XDECREF(more);
        Py_DECREF(rec);
        Py_DECREF(prefix);
        Py_DECREF(key);
        continue;
    fail:
        Py_XDECREF(data);
        Py_XDECREF(more);
        Py_XDECREF(rec);
        Py_XDECREF(prefix);
        Py_DECREF(key);
        wb_ops_free(ops, nops);
        return NULL;
    }
    qsort(ops, (size_t)nops, sizeof(wb_op), wb_op_cmp);
    for (Py_ssize_t i = 0; i < nops; i++) {
        PyObject *r = ops[i].data != NULL ? call2(put, ops[i].prefix, ops[i].data)
                                          : PyObject_Vectorcall(del, &ops[i].prefix, 1, NULL);
        if (r == NULL) {
            wb_ops_free(ops, nops);
            return NULL;
        }
        Py_DECREF(r);
    }
    wb_ops_free(ops, nops);
    return PyLong_FromSsize_t(nops);
}

/* a failure of one key (unhashable, unencodable) skips it; other errors (KeyboardInterrupt,
 * MemoryError) propagate: returns -1 for those */
static int skip_key_error(void) {
    if (PyErr_ExceptionMatches(PyExc_MemoryError) || !PyErr_ExceptionMatches(PyExc_Exception)) return -1;
    PyErr_Clear();
    return 0;
}

static PyObject *plan(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "plan(keys, resident: dict, lo, hi, max_parallelism, encode)");
        return NULL;
    }
    PyObject *res = args[1], *encode = args[5];
    long lo = PyLong_AsLong(args[2]), hi, maxp;
    if (lo == -1 && PyErr_Occurred()) return NULL;
    hi = PyLong_AsLong(args[3]);
    if (hi == -1 && PyErr_Occurred()) return NULL;
    maxp = PyLong_AsLong(args[4]);
    if (maxp == -1 && PyErr_Occurred()) return NULL;
    if (maxp <= 0 || maxp > 0x10000) {
        PyErr_SetString(PyExc_ValueError, "plan: max_parallelism out of range");
        return NULL;
    }
    PyObject *it = PyObject_GetIter(args[0]);
    if (it == NULL) return NULL;
    PyObject *seen = PySet_New(NULL), *keys = PyList_New(0), *infos = PyList_New(0), *prefixes = PyList_New(0);
    PyObject *key = NULL, *kb = NULL, *kgo = NULL, *info = NULL, *prefix = NULL;
    if (seen == NULL || keys == NULL || infos == NULL || prefixes == NULL) goto fail;
    char buf[KEY_FAST_MAX];
    while ((key = PyIter_Next(it)) != NULL) {
        int in = PyDict_Contains(res, key);
        if (in == 0) in = PySet_Contains(seen, key);
        if (in < 0) {
            if (skip_key_error() < 0) goto fail;
            Py_CLEAR(key);
            continue;
        }
        if (in) {
            Py_CLEAR(key);
            continue;
        }
        Py_ssize_t n = encode_key_fast(key, buf);
        const unsigned char *kp;
        if (n > 0) {
            kp = (const unsigned char *)buf;
        } else {
            PyObject *argv[1] = {key};
            kb = PyObject_Vectorcall(encode, argv, 1, NULL);
            if (kb == NULL) {
                if (skip_key_error() < 0) goto fail;
                Py_CLEAR(key);
                continue;
            }
            if (!PyBytes_Check(kb)) {
                PyErr_SetString(PyExc_TypeError, "plan: encode returned no bytes");
                goto fail;
            }
            kp = (const unsigned char *)PyBytes_AS_STRING(kb);
            n = PyBytes_GET_SIZE(kb);
            if (n > 0xFFFFFFFFLL) {
                PyErr_SetString(PyExc_OverflowError, "plan: key bytes too long");
                goto fail;
            }
        }
        long kg = (long)(fmix32(crc32_of(kp, n)) % (uint32_t)maxp);
        if (kg < lo || kg > hi) {
            Py_CLEAR(kb);
            Py_CLEAR(key);
            continue;
        }
        if (kb == NULL && (kb = PyBytes_FromStringAndSize((const char *)kp, n)) == NULL) goto fail;
        prefix = PyBytes_FromStringAndSize(NULL, 6 + n);
        if (prefix == NULL) goto fail;
        unsigned char *p = (unsigned char *)PyBytes_AS_STRING(prefix);
        uint64_t head = ((uint64_t)kg << 32) | (uint64_t)n;
        for (int i = 0; i < 6; i++) p[i] = (unsigned char)(head >> (8 * (5 - i)));
        memcpy(p + 6, PyBytes_AS_STRING(kb), n);
        kgo = PyLong_FromLong(kg);
        if (kgo == NULL) goto fail;
        info = PyTuple_Pack(3, (PyObject *)Py_TYPE(key), kb, kgo);
        if (info == NULL) goto fail;
        if (PySet_Add(seen, key) < 0 || PyList_Append(keys, key) < 0 || PyList_Append(infos, info) < 0 ||
            PyList_Append(prefixes, prefix) < 0)
            goto fail;
        Py_CLEAR(info);
        Py_CLEAR(kgo);
        Py_CLEAR(prefix);
        Py_CLEAR(kb);
        Py_CLEAR(key);
    }
    if (PyErr_Occurred()) goto fail;
    Py_DECREF(it);
    Py_DECREF(seen);
    PyObject *out = PyTuple_Pack(3, keys, infos, prefixes);
    Py_DECREF(keys);
    Py_DECREF(infos);
    Py_DECREF(prefixes);
    return out;
fail:
    Py_XDECREF(info);
    Py_XDECREF(kgo);
    Py_XDECREF(prefix);
    Py_XDECREF(kb);
    Py_XDECREF(key);
    Py_DECREF(it);
    Py_XDECREF(seen);
    Py_XDECREF(keys);
    Py_XDECREF(infos);
    Py_XDECREF(prefixes);
    return NULL;
}

/* install_many(keys, infos, raws, loads, present, index, primary, extra, resident) */
static PyObject *install_many(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9 || !PyList_Check(args[0]) || !PyList_Check(args[1]) || !PyList_Check(args[2]) ||
        !PySet_Check(args[4]) || !PyDict_Check(args[8]) || PyList_GET_SIZE(args[0]) != PyList_GET_SIZE(args[1]) ||
        PyList_GET_SIZE(args[0]) != PyList_GET_SIZE(args[2])) {
        PyErr_SetString(PyExc_TypeError,
                        "install_many(keys: list, infos: list, raws: list (of one length), loads, present: set, "
                        "index, primary, extra, resident: dict)");
        return NULL;
    }
    PyObject *keys = args[0], *infos = args[1], *raws = args[2], *loads = args[3], *present = args[4];
    PyObject *res = args[8];
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(keys); k++) {
        if (install_raw(module, PyList_GET_ITEM(keys, k), PyList_GET_ITEM(infos, k), PyList_GET_ITEM(raws, k),
                        loads, present, args[5], args[6], args[7], res) < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}

/* the first (oldest) m keys of d, a new list */
static PyObject *first_keys(PyObject *d, Py_ssize_t m) {
    PyObject *out = PyList_New(0), *k, *v;
    Py_ssize_t pos = 0;
    if (out == NULL) return NULL;
    while (PyList_GET_SIZE(out) < m && PyDict_Next(d, &pos, &k, &v)) {
        if (PyList_Append(out, k) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

static int is_current(PyObject *key, PyObject *cur, PyObject *missing) {
    if (key == cur) return 1;
    if (cur == missing) return 0;
    return PyObject_RichCompareBool(key, cur, Py_EQ);
}

/* clock_victims(resident, n, touched, current, missing) */
static PyObject *clock_victims(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyDict_Check(args[0]) || !PySet_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "clock_victims(resident: dict, n: int, touched: set, current, missing)");
        return NULL;
    }
    PyObject *res = args[0], *touched = args[2], *cur = args[3], *missing = args[4];
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0) n = 0;
    PyObject *victims = PyList_New(0), *oldest = NULL, *chosen = NULL;
    if (victims == NULL) return NULL;
    oldest = first_keys(res, n > PY_SSIZE_T_MAX / 3 ? PY_SSIZE_T_MAX : 3 * n);
    if (oldest == NULL) goto fail;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(oldest) && PyList_GET_SIZE(victims) < n; i++) {
        PyObject *key = PyList_GET_ITEM(oldest, i);
        int t = PySet_Contains(touched, key);
        if (t < 0) goto fail;
        if (t) { /* a second chance: to the back */
            if (PySet_Discard(touched, key) < 0) goto fail;
            PyObject *v = dict_take(res, key);
            if (v == NULL) {
                if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
                goto fail;
            }
            int rc = PyDict_SetItem(res, key, v);
            Py_DECREF(v);
            if (rc < 0) goto fail;
            continue;
        }
        int c = is_current(key, cur, missing);
        if (c < 0) goto fail;
        if (!c && PyList_Append(victims, key) < 0) goto fail;
    }
    if (PyList_GET_SIZE(victims) < n) { /* mostly touched keys: the oldest go anyway */
        Py_CLEAR(oldest);
        chosen = PySet_New(victims);
        if (chosen == NULL) goto fail;
        oldest = first_keys(res, n > (PY_SSIZE_T_MAX - 1) / 2 ? PY_SSIZE_T_MAX : 2 * n + 1);
        if (oldest == NULL) goto fail;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(oldest) && PyList_GET_SIZE(victims) < n; i++) {
            PyObject *key = PyList_GET_ITEM(oldest, i);
            int in = PySet_Contains(chosen, key);
            if (in < 0) goto fail;
            if (in) continue;
            int c = is_current(key, cur, missing);
            if (c < 0) goto fail;
            if (c) continue;
            if (PyList_Append(victims, key) < 0 || PySet_Discard(touched, key) < 0) goto fail;
        }
    }
    Py_XDECREF(chosen);
    Py_XDECREF(oldest);
    return victims;
fail:
    Py_XDECREF(chosen);
    Py_XDECREF(oldest);
    Py_DECREF(victims);
    return NULL;
}

/* rec_dumps(value, protocol) */
static PyObject *rec_dumps(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "rec_dumps(value, protocol)");
        return NULL;
    }
    PyObject *out = rec_plain(args[0]);
    if (out != Py_None) return out;
    Py_DECREF(out);
    long proto = PyLong_AsLong(args[1]);
    if (proto == -1 && PyErr_Occurred()) return NULL;
    if (proto < 2) { /* a pickle must start with 0x80 (PROTO) to be told from the plain form */
        PyErr_SetString(PyExc_ValueError, "rec_dumps: the pickle protocol must be 2 or later");
        return NULL;
    }
    PyObject *argv[2] = {args[0], args[1]};
    return PyObject_Vectorcall(pickle_dumps, argv, 2, NULL);
}

/* rec_loads(raw) */
static PyObject *rec_loads(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "rec_loads(raw: bytes)");
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t n = PyBytes_GET_SIZE(args[0]);
    if (n > 0 && p[0] == REC_MAGIC) return rec_parse(p, n);
    if (n > 0 && p[0] == REC_PICKLE) return PyObject_Vectorcall(pickle_loads, args, 1, NULL);
    return rec_corrupt(n ? "an unknown first byte" : "it is empty");
}

static PyMethodDef methods[] = {
    {"key_group", (PyCFunction)(void (*)(void))key_group, METH_FASTCALL,
     "key_group(key_bytes, max_parallelism): fmix32(crc32(key_bytes)) % max_parallelism"},
    {"key_groups", (PyCFunction)(void (*)(void))key_groups, METH_FASTCALL,
     "key_groups(offsets, data, max_parallelism, out): key_group of each value of a binary array"},
    {"key_prefix", (PyCFunction)(void (*)(void))key_prefix, METH_FASTCALL,
     "key_prefix(key_group, key_bytes): the database key of a key's record"},
    {"install", (PyCFunction)(void (*)(void))install, METH_FASTCALL,
     "install(key, record, index, primary, extra): a key's record into the states' dicts"},
    {"admit", (PyCFunction)(void (*)(void))admit, METH_FASTCALL,
     "admit(key, info, get, loads, present, index, primary, extra, resident): read a key's record into the dicts"},
    {"write_back", (PyCFunction)(void (*)(void))write_back, METH_FASTCALL,
     "write_back(keys, resident, drop, primary, sids, extra, present, put, delete, dumps, protocol)"},
    {"plan", (PyCFunction)(void (*)(void))plan, METH_FASTCALL,
     "plan(keys, resident, lo, hi, max_parallelism, encode): (keys, infos, prefixes) of a prefetch"},
    {"install_many", (PyCFunction)(void (*)(void))install_many, METH_FASTCALL,
     "install_many(keys, infos, raws, loads, present, index, primary, extra, resident): admit keys read"},
    {"rec_dumps", (PyCFunction)(void (*)(void))rec_dumps, METH_FASTCALL,
     "rec_dumps(value, protocol): a value of the database as bytes (plain form or pickle)"},
    {"rec_loads", (PyCFunction)(void (*)(void))rec_loads, METH_FASTCALL,
     "rec_loads(raw): the value of rec_dumps' bytes"},
    {"clock_victims", (PyCFunction)(void (*)(void))clock_victims, METH_FASTCALL,
     "clock_victims(resident, n, touched, current, missing): the keys an eviction writes back"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "workingset", NULL, -1, methods};

PyMODINIT_FUNC PyInit_workingset(void) {
    crc_init();
    PyObject *pickle = PyImport_ImportModule("pickle");
    if (pickle == NULL) return NULL;
    pickle_dumps = PyObject_GetAttrString(pickle, "dumps");
    pickle_loads = PyObject_GetAttrString(pickle, "loads");
    Py_DECREF(pickle);
    if (pickle_dumps == NULL || pickle_loads == NULL) return NULL;
    return PyModule_Create(&moduledef);
}
