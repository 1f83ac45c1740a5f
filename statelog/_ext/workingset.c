/* The miss path of the disk-backed working set in C (statelog/state/disk.py).
 *
 * A key that is set current and not resident costs a database read and, once the resident
 * keys are over budget, the write-back of an evicted key: per miss, a few microseconds of
 * interpreter work around RocksDB's own (a key group, a database key, moving a key's entries
 * between its record and the states' dicts). These functions do that work in C; each has a
 * pure-Python reference in statelog/keys.py or statelog/state/disk.py, which is also the
 * fallback when this module is not built (STATELOG_PURE_PYTHON=1 forces it), and tests
 * compare the two on the same inputs.
 *
 * key_group(key_bytes, max_parallelism): murmur3's fmix32 of the CRC-32 (zlib's: reflected
 *     polynomial 0xEDB88320) of the key bytes, modulo max_parallelism.
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
 *     entry left that is in `present` is deleted, delete(prefix). With drop, the entries,
 *     extra[key] and resident[key] are removed and the key leaves `present`; without, a key
 *     written becomes present. Returns the number of puts and deletes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

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
    if (found) {
        if (PySet_Add(args[4], key) < 0) { Py_DECREF(raw); return NULL; }
        argv[0] = raw;
        PyObject *rec = PyObject_Vectorcall(args[3], argv, 1, NULL);
        Py_DECREF(raw);
        if (rec == NULL) return NULL;
        if (!PyDict_Check(rec)) {
            Py_DECREF(rec);
            PyErr_SetString(PyExc_TypeError, "admit: a key's record is not a dict");
            return NULL;
        }
        PyObject *iargs[5] = {key, rec, args[5], args[6], args[7]};
        PyObject *r = install(module, iargs, 5);
        Py_DECREF(rec);
        if (r == NULL) return NULL;
        Py_DECREF(r);
    } else {
        Py_DECREF(raw);
    }
    if (PyDict_SetItem(args[8], key, info) < 0) return NULL;
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
    Py_ssize_t ntables = PyList_GET_SIZE(primary), written = 0;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(keys); k++) {
        PyObject *key = PyList_GET_ITEM(keys, k);
        Py_INCREF(key);
        PyObject *info = PyDict_GetItemWithError(res, key);
        PyObject *rec = NULL, *prefix = NULL, *data = NULL, *r = NULL, *more = NULL;
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
            r = call2(put, prefix, data);
            if (r == NULL) goto fail;
            written++;
            if (!drop && PySet_Add(present, key) < 0) goto fail;
        } else {
            int in = PySet_Contains(present, key);
            if (in < 0) goto fail;
            if (in) {
                PyObject *argv[1] = {prefix};
                r = PyObject_Vectorcall(del, argv, 1, NULL);
                if (r == NULL) goto fail;
                written++;
                if (PySet_Discard(present, key) < 0) goto fail;
            }
        }
        if (drop) {
            if (PySet_Discard(present, key) < 0) goto fail;
            if (PyDict_DelItem(res, key) < 0) goto fail;
        }
        Py_XDECREF(r);
        Py_XDECREF(data);
        Py_XDECREF(more);
        Py_DECREF(rec);
        Py_DECREF(prefix);
        Py_DECREF(key);
        continue;
    fail:
        Py_XDECREF(r);
        Py_XDECREF(data);
        Py_XDECREF(more);
        Py_XDECREF(rec);
        Py_XDECREF(prefix);
        Py_DECREF(key);
        return NULL;
    }
    return PyLong_FromSsize_t(written);
}

static PyMethodDef methods[] = {
    {"key_group", (PyCFunction)(void (*)(void))key_group, METH_FASTCALL,
     "key_group(key_bytes, max_parallelism): fmix32(crc32(key_bytes)) % max_parallelism"},
    {"key_prefix", (PyCFunction)(void (*)(void))key_prefix, METH_FASTCALL,
     "key_prefix(key_group, key_bytes): the database key of a key's record"},
    {"install", (PyCFunction)(void (*)(void))install, METH_FASTCALL,
     "install(key, record, index, primary, extra): a key's record into the states' dicts"},
    {"admit", (PyCFunction)(void (*)(void))admit, METH_FASTCALL,
     "admit(key, info, get, loads, present, index, primary, extra, resident): read a key's record into the dicts"},
    {"write_back", (PyCFunction)(void (*)(void))write_back, METH_FASTCALL,
     "write_back(keys, resident, drop, primary, sids, extra, present, put, delete, dumps, protocol)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "workingset", NULL, -1, methods};

PyMODINIT_FUNC PyInit_workingset(void) {
    crc_init();
    return PyModule_Create(&moduledef);
}
