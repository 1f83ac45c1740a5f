/* IntTable: a state's table {key: entry} for int keys, in one flat array.
 *
 * The in-memory store (statelog/state/tables/memory.py) gives each state and namespace a
 * table. A dict of millions of int keys costs three cache misses per lookup (its index
 * slot, its entry, the stored key object to compare) and a key object of 32 bytes per entry.
 * An IntTable keeps each entry as one 16-byte slot {int64 key, value object} in an open
 * addressing array (linear probing, a hash of the key mixed with the table's seed, at most
 * 2/3 full), so a lookup misses the cache once, a slot's address is known from the key
 * alone (a batch's folds prefetch it a few keys ahead), and no key object is kept.
 *
 * A value that is an exact int within 62 bits is kept in the slot itself, not as an object
 * (see INLINE below): reading it makes a new int object, equal to the one stored but not the
 * same object (ints are compared by value; `table[k] is v` may be False for an int v, as it
 * may for an int that went through any arithmetic).
 *
 * It behaves as a dict does for every key: while every key it was given is an exact int
 * within int64 (bool is not), it is in int mode; the first other key (a str, a float, True,
 * a larger int, for any operation) moves every entry into a dict it keeps from then on
 * (dict mode), whose semantics (1 == 1.0 == True) are then exactly a dict's. Iteration
 * order in int mode is the array's, not insertion order; changing the set of keys during an
 * iteration raises RuntimeError, as a dict does when its size changes.
 *
 * The table does not take part in the cyclic GC (as a dict of ints and other untracked
 * values would not): entries hold values, and a cycle through the table is never collected.
 *
 * add_into(table, keys, partial, out, op, lo, hi) and put_items(table, keys, values, start,
 * stop) are the table's counterparts of the dict functions of fastpath.c (the batch fold of
 * int reductions and a restore's bulk load), with the same contracts; they return None when
 * the table is in dict mode (the caller then uses its dict, IntTable.dict()).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include "bulkargs.h"

typedef struct {
    int64_t key;
    PyObject *value; /* NULL: empty; DELETED: a deleted entry */
} Slot;

static PyObject deleted_marker; /* only its address is used */
#define DELETED (&deleted_marker)
#define LIVE(v) ((v) != NULL && (v) != DELETED)

/* A slot's value is a reference to the value object, or, for an exact int within 62 bits, the
 * int itself, inline: (x << 1) | 1 (an object's address is even). Inline ints cost no object:
 * a bulk load of 10^7 int values allocates nothing for them, and a fold of ints writes its
 * results in place. Reading one makes a new int object (an int equal to the one stored, not
 * the same object: ints are compared by value). */
#define INLINE(v) (((uintptr_t)(v)) & 1)
#define INLINE_MIN (-((int64_t)1 << 62))
#define INLINE_MAX (((int64_t)1 << 62) - 1)

static inline PyObject *tag_int(int64_t x) { return (PyObject *)(uintptr_t)(((uint64_t)x << 1) | 1); }
static inline int64_t untag(PyObject *v) { return ((int64_t)(intptr_t)v) >> 1; }

/* What a slot keeps for value: the int inline, else a new reference. Never fails. */
static inline PyObject *store_of(PyObject *value) {
    if (PyLong_CheckExact(value)) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (x == -1 && PyErr_Occurred()) PyErr_Clear();
        else if (!overflow && x >= INLINE_MIN && x <= INLINE_MAX) return tag_int(x);
    }
    Py_INCREF(value);
    return value;
}

/* What a slot keeps for the int x: x inline, else a new int object (NULL with MemoryError). */
static inline PyObject *stored_int(int64_t x) {
    return x >= INLINE_MIN && x <= INLINE_MAX ? tag_int(x) : PyLong_FromLongLong(x);
}

/* The value object of what a slot keeps: a new reference (NULL with MemoryError). */
static inline PyObject *load(PyObject *stored) {
    if (INLINE(stored)) return PyLong_FromLongLong(untag(stored));
    Py_INCREF(stored);
    return stored;
}

static inline void release(PyObject *stored) {
    if (!INLINE(stored)) Py_DECREF(stored);
}

static inline void retain(PyObject *stored) {
    if (!INLINE(stored)) Py_INCREF(stored);
}
#define MIN_LOG2 3
#define RS_AHEAD 16 /* a resize's prefetch distance, in old slots */

typedef struct {
    PyObject_HEAD
    Slot *slots;
    int log2;          /* capacity 1 << log2 */
    Py_ssize_t used;   /* live entries */
    Py_ssize_t fill;   /* live and deleted slots */
    uint64_t version;  /* bumped when the set of keys changes (iterators check it) */
    uint64_t seed;     /* mixed into each key's hash (home_of) */
    PyObject *dict;    /* dict mode: every entry here, slots freed */
} IntTable;

static PyTypeObject IntTableType;

/* Slot arrays. A large one (HUGE_MIN bytes and more) is its own mapping, aligned to 2 MiB and
 * advised to use huge pages where the kernel offers them: a restore or a batch of 10^7 keys
 * touches slots at random all over hundreds of MiB, and with 4 KiB pages nearly every touch
 * is a TLB miss as well as a cache miss. Small arrays come from Python's allocator. */
#define HUGE_ALIGN ((size_t)2 << 20)
#define HUGE_MIN ((size_t)4 << 20)
#define TRACE_DOMAIN 0x1A7AB1Eu /* the mappings' tracemalloc domain (Python's allocator traces the rest) */

static size_t slots_bytes(int log2) { return ((size_t)1 << log2) * sizeof(Slot); }

static Slot *slots_new(int log2) {
    size_t bytes = slots_bytes(log2);
    if (bytes < HUGE_MIN) return PyMem_Calloc((size_t)1 << log2, sizeof(Slot));
    /* (bytes is a multiple of 2 MiB: a power of two of at least 4 MiB) */
    char *raw = mmap(NULL, bytes + HUGE_ALIGN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    char *p = (char *)(((uintptr_t)raw + HUGE_ALIGN - 1) & ~(uintptr_t)(HUGE_ALIGN - 1));
    if (p > raw) munmap(raw, (size_t)(p - raw));
    if (raw + HUGE_ALIGN > p) munmap(p + bytes, (size_t)(raw + HUGE_ALIGN - p));
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE); /* (advice: ignored where huge pages are off) */
#endif
    PyTraceMalloc_Track(TRACE_DOMAIN, (uintptr_t)p, bytes); /* (tracemalloc counts it: -2 when off) */
    return (Slot *)p; /* anonymous pages read as zeros: every slot empty */
}

static void slots_free(Slot *slots, int log2) {
    if (slots == NULL) return;
    if (slots_bytes(log2) < HUGE_MIN)
        PyMem_Free(slots);
    else {
        PyTraceMalloc_Untrack(TRACE_DOMAIN, (uintptr_t)slots);
        munmap(slots, slots_bytes(log2));
    }
}

/* A key's first slot: the top log2 bits of a strong mix (splitmix64's finalizer) of the key
 * and the table's own seed. Without the seed, one table's iteration order (its slot order)
 * would be another table's home order, and copying one into another while it grows would
 * pile every key onto the first slots (quadratic probing); with it, the orders of two
 * tables are unrelated. */
static inline size_t home_of(uint64_t seed, int64_t key, int log2) {
    uint64_t z = (uint64_t)key ^ seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (size_t)(z >> (64 - log2));
}
#define home(key, log2) home_of(t->seed, (key), (log2))

static uint64_t seeds = 0; /* tables made so far: each table's seed is a mix of its number */

/* 1 and the key's int64 for an exact int within int64, 0 for any other key (no error). */
static inline int as_i64(PyObject *key, int64_t *out) {
    if (!PyLong_CheckExact(key)) return 0;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(key, &overflow);
    if (overflow) return 0;
    if (v == -1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
    *out = (int64_t)v;
    return 1;
}

/* The slot of key, or -1. */
static inline Py_ssize_t find(const IntTable *t, int64_t key) {
    size_t mask = ((size_t)1 << t->log2) - 1, i = home(key, t->log2);
    for (;;) {
        const Slot *s = &t->slots[i];
        if (s->value == NULL) return -1;
        if (s->key == key && s->value != DELETED) return (Py_ssize_t)i;
        i = (i + 1) & mask;
    }
}

/* The slot of key, or the slot where it goes (the first deleted one on its probe, else the
 * empty one that ends it); *found says which. */
static inline size_t find_or_free(const IntTable *t, int64_t key, int *found) {
    size_t mask = ((size_t)1 << t->log2) - 1, i = home(key, t->log2);
    Py_ssize_t free_at = -1;
    for (;;) {
        const Slot *s = &t->slots[i];
        if (s->value == NULL) {
            *found = 0;
            return free_at >= 0 ? (size_t)free_at : i;
        }
        if (s->value == DELETED) {
            if (free_at < 0) free_at = (Py_ssize_t)i;
        } else if (s->key == key) {
            *found = 1;
            return i;
        }
        i = (i + 1) & mask;
    }
}

/* Make room for `more` new keys without another resize: at most 2/3 of the slots filled. */
static int reserve(IntTable *t, Py_ssize_t more) {
    size_t cap = (size_t)1 << t->log2;
    if ((size_t)(t->fill + more) * 3 <= cap * 2) return 0;
    int log2 = MIN_LOG2; /* the smallest that holds them at most 2/3 full (a growing table doubles) */
    while ((size_t)(t->used + more) * 3 > ((size_t)1 << log2) * 2) log2++;
    if (log2 > 40) {
        PyErr_NoMemory();
        return -1;
    }
    Slot *slots = slots_new(log2);
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    size_t mask = ((size_t)1 << log2) - 1;
    /* the old slots in order, each entry's new place prefetched RS_AHEAD old slots ahead
     * (the new places are random: each would be a cache miss of its own) */
    for (size_t j = 0; j < cap; j++) {
        if (j + RS_AHEAD < cap) {
            const Slot *a = &t->slots[j + RS_AHEAD];
            if (LIVE(a->value)) __builtin_prefetch(&slots[home(a->key, log2)], 1);
        }
        Slot *s = &t->slots[j];
        if (!LIVE(s->value)) continue;
        size_t i = home(s->key, log2);
        while (slots[i].value != NULL) i = (i + 1) & mask;
        slots[i] = *s;
    }
    slots_free(t->slots, t->log2);
    t->slots = slots;
    t->log2 = log2;
    t->fill = t->used;
    t->version++;
    return 0;
}

/* A new dict of the live slots' entries, or NULL with an error. */
static PyObject *slots_dict(IntTable *t) {
    PyObject *d = PyDict_New();
    if (d == NULL) return NULL;
    size_t cap = (size_t)1 << t->log2;
    for (size_t j = 0; j < cap; j++) {
        Slot *s = &t->slots[j];
        if (!LIVE(s->value)) continue;
        PyObject *k = PyLong_FromLongLong(s->key), *v = k ? load(s->value) : NULL;
        if (v == NULL || PyDict_SetItem(d, k, v) < 0) {
            Py_XDECREF(k);
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(k);
        Py_DECREF(v);
    }
    return d;
}

/* Dict mode from now on: every entry moved into a dict (the first key that is not an int64). */
static int to_dict(IntTable *t) {
    PyObject *d = slots_dict(t);
    if (d == NULL) return -1;
    size_t cap = (size_t)1 << t->log2;
    for (size_t j = 0; j < cap; j++)
        if (LIVE(t->slots[j].value)) release(t->slots[j].value);
    slots_free(t->slots, t->log2);
    t->slots = NULL;
    t->log2 = 0;
    t->used = t->fill = 0;
    t->dict = d;
    t->version++;
    return 0;
}

/* The int64 of key in int mode (1), or 0 when the table is (now) in dict mode; -1: error. */
static inline int key_of(IntTable *t, PyObject *key, int64_t *out) {
    if (t->dict != NULL) return 0;
    if (as_i64(key, out)) return 1;
    return to_dict(t) < 0 ? -1 : 0;
}

/* Put what a slot keeps (store_of's, owned) under key; -1 with an error (it released). */
static int set_stored(IntTable *t, int64_t key, PyObject *stored) {
    int found;
    size_t i = find_or_free(t, key, &found);
    if (found) {
        PyObject *old = t->slots[i].value;
        t->slots[i].value = stored;
        release(old);
        return 0;
    }
    Slot *before = t->slots;
    if (reserve(t, 1) < 0) {
        release(stored);
        return -1;
    }
    if (t->slots != before) i = find_or_free(t, key, &found); /* resized: its place moved */
    if (t->slots[i].value == NULL) t->fill++;
    t->slots[i].key = key;
    t->slots[i].value = stored;
    t->used++;
    t->version++;
    return 0;
}

static int set_i64(IntTable *t, int64_t key, PyObject *value) { return set_stored(t, key, store_of(value)); }

/* Remove key (int mode): 1 done (the value handed to *old when asked, else released), 0 absent. */
static int del_i64(IntTable *t, int64_t key, PyObject **old) {
    Py_ssize_t i = find(t, key);
    if (i < 0) return 0;
    PyObject *v = t->slots[i].value;
    t->slots[i].value = DELETED;
    t->used--;
    t->version++;
    if (old) *old = load(v); /* (NULL with MemoryError: the entry is gone all the same) */
    release(v);
    return 1;
}

/* -- the type ---------------------------------------------------------------------------- */

static PyObject *it_new(PyTypeObject *type, PyObject *args, PyObject *kwds);
static PyObject *it_update(IntTable *t, PyObject *const *args, Py_ssize_t nargs);

static void it_dealloc(IntTable *t) {
    if (t->slots != NULL) {
        size_t cap = (size_t)1 << t->log2;
        for (size_t j = 0; j < cap; j++)
            if (LIVE(t->slots[j].value)) release(t->slots[j].value);
        slots_free(t->slots, t->log2);
    }
    Py_XDECREF(t->dict);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static IntTable *new_table(void) {
    IntTable *t = PyObject_New(IntTable, &IntTableType);
    if (t == NULL) return NULL;
    t->slots = slots_new(MIN_LOG2);
    if (t->slots == NULL) {
        t->dict = NULL;
        Py_DECREF(t);
        return (IntTable *)PyErr_NoMemory();
    }
    t->log2 = MIN_LOG2;
    t->used = t->fill = 0;
    t->version = 0;
    t->dict = NULL;
    t->seed = home_of(0x243F6A8885A308D3ull, (int64_t)++seeds, 64);
    return t;
}

static PyObject *it_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "IntTable() takes no keyword arguments");
        return NULL;
    }
    if (PyTuple_GET_SIZE(args) > 1) {
        PyErr_SetString(PyExc_TypeError, "IntTable() takes at most one argument (a mapping or pairs)");
        return NULL;
    }
    IntTable *t = new_table();
    if (t == NULL) return NULL;
    if (PyTuple_GET_SIZE(args) == 1) {
        PyObject *r = it_update(t, &PyTuple_GET_ITEM(args, 0), 1);
        if (r == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        Py_DECREF(r);
    }
    return (PyObject *)t;
}

static Py_ssize_t it_len(IntTable *t) { return t->dict ? PyDict_GET_SIZE(t->dict) : t->used; }

/* KeyError(key), as a dict raises it (the key in a tuple: a tuple key stays one argument). */
static void key_error(PyObject *key) {
    PyObject *tup = PyTuple_Pack(1, key);
    if (tup) {
        PyErr_SetObject(PyExc_KeyError, tup);
        Py_DECREF(tup);
    }
}

/* A new reference to the value of key, NULL without an error when absent (with one: no memory). */
static PyObject *lookup(IntTable *t, PyObject *key) {
    int64_t k;
    int r = key_of(t, key, &k);
    if (r < 0) return NULL;
    if (r == 0) {
        PyObject *v = PyDict_GetItemWithError(t->dict, key);
        Py_XINCREF(v);
        return v;
    }
    Py_ssize_t i = find(t, k);
    if (i < 0) return NULL;
    return load(t->slots[i].value);
}

static PyObject *it_subscript(IntTable *t, PyObject *key) {
    PyObject *v = lookup(t, key);
    if (v == NULL && !PyErr_Occurred()) key_error(key);
    return v;
}

static int it_ass_subscript(IntTable *t, PyObject *key, PyObject *value) {
    int64_t k;
    int r = key_of(t, key, &k);
    if (r < 0) return -1;
    if (r == 0) return value ? PyDict_SetItem(t->dict, key, value) : PyDict_DelItem(t->dict, key);
    if (value != NULL) return set_i64(t, k, value);
    if (del_i64(t, k, NULL)) return 0;
    key_error(key);
    return -1;
}

static int it_contains(IntTable *t, PyObject *key) {
    PyObject *v = lookup(t, key);
    if (v == NULL) return PyErr_Occurred() ? -1 : 0;
    Py_DECREF(v);
    return 1;
}

static PyObject *it_get(IntTable *t, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get(key, default=None)");
        return NULL;
    }
    PyObject *v = lookup(t, args[0]);
    if (v != NULL || PyErr_Occurred()) return v;
    v = nargs == 2 ? args[1] : Py_None;
    Py_INCREF(v);
    return v;
}

static PyObject *it_pop(IntTable *t, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "pop(key[, default])");
        return NULL;
    }
    int64_t k;
    int r = key_of(t, args[0], &k);
    if (r < 0) return NULL;
    if (r == 0) {
        PyObject *name = PyUnicode_FromString("pop");
        if (name == NULL) return NULL;
        PyObject *res = nargs == 2 ? PyObject_CallMethodObjArgs(t->dict, name, args[0], args[1], NULL)
                                   : PyObject_CallMethodObjArgs(t->dict, name, args[0], NULL);
        Py_DECREF(name);
        return res;
    }
    PyObject *old;
    if (del_i64(t, k, &old)) return old; /* (NULL: no memory for the int) */
    if (nargs == 2) {
        Py_INCREF(args[1]);
        return args[1];
    }
    key_error(args[0]);
    return NULL;
}

static PyObject *it_setdefault(IntTable *t, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "setdefault(key, default=None)");
        return NULL;
    }
    PyObject *v = lookup(t, args[0]);
    if (v != NULL || PyErr_Occurred()) return v;
    PyObject *d = nargs == 2 ? args[1] : Py_None;
    if (it_ass_subscript(t, args[0], d) < 0) return NULL;
    Py_INCREF(d);
    return d;
}

static int merge_pair(IntTable *t, PyObject *item) {
    PyObject *fast = PySequence_Fast(item, "IntTable.update: each item must be a (key, value) pair");
    if (fast == NULL) return -1;
    if (PySequence_Fast_GET_SIZE(fast) != 2) {
        PyErr_Format(PyExc_ValueError, "IntTable.update: an item has %zd elements, not 2 (a key and a value)",
                     PySequence_Fast_GET_SIZE(fast));
        Py_DECREF(fast);
        return -1;
    }
    PyObject *k = PySequence_Fast_GET_ITEM(fast, 0), *v = PySequence_Fast_GET_ITEM(fast, 1);
    Py_INCREF(k);
    Py_INCREF(v);
    Py_DECREF(fast);
    int rc = it_ass_subscript(t, k, v);
    Py_DECREF(k);
    Py_DECREF(v);
    return rc;
}

static PyObject *it_items(IntTable *t, PyObject *Py_UNUSED(ignored));

/* Set each item of iterable src: (key, value) pairs, or with a mapping its keys and their
 * values in it (dict.update's two forms). 0, or -1 with an error. */
static int set_each(IntTable *t, PyObject *src, PyObject *mapping) {
    PyObject *it = PyObject_GetIter(src);
    if (it == NULL) return -1;
    PyObject *item;
    while ((item = PyIter_Next(it)) != NULL) {
        int rc;
        if (mapping != NULL) {
            PyObject *v = PyObject_GetItem(mapping, item);
            rc = v == NULL ? -1 : it_ass_subscript(t, item, v);
            Py_XDECREF(v);
        } else {
            rc = merge_pair(t, item);
        }
        Py_DECREF(item);
        if (rc < 0) {
            Py_DECREF(it);
            return -1;
        }
    }
    Py_DECREF(it);
    return PyErr_Occurred() ? -1 : 0;
}

static PyObject *it_update(IntTable *t, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1) {
        if (nargs == 0) Py_RETURN_NONE;
        PyErr_SetString(PyExc_TypeError, "update(mapping_or_pairs)");
        return NULL;
    }
    PyObject *other = args[0];
    if (PyDict_Check(other)) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        if (t->dict == NULL && reserve(t, PyDict_GET_SIZE(other)) < 0) return NULL;
        while (PyDict_Next(other, &pos, &k, &v)) {
            Py_INCREF(k);
            Py_INCREF(v);
            int rc = it_ass_subscript(t, k, v);
            Py_DECREF(k);
            Py_DECREF(v);
            if (rc < 0) return NULL;
        }
        Py_RETURN_NONE;
    }
    PyObject *src = NULL;
    if (Py_IS_TYPE(other, &IntTableType)) {
        if (t->dict == NULL && reserve(t, it_len((IntTable *)other)) < 0) return NULL;
        src = it_items((IntTable *)other, NULL);
        if (src == NULL) return NULL;
        PyObject *lst = PySequence_List(src); /* (other may be t) */
        Py_DECREF(src);
        src = lst;
    } else if (PyObject_HasAttrString(other, "keys")) {
        PyObject *keys = PyObject_CallMethod(other, "keys", NULL);
        if (keys == NULL) return NULL;
        int rc = set_each(t, keys, other);
        Py_DECREF(keys);
        if (rc < 0) return NULL;
        Py_RETURN_NONE;
    } else {
        src = other;
        Py_INCREF(src);
    }
    if (src == NULL) return NULL;
    int rc = set_each(t, src, NULL);
    Py_DECREF(src);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *it_clear(IntTable *t, PyObject *Py_UNUSED(ignored)) {
    Slot *fresh = slots_new(MIN_LOG2);
    if (fresh == NULL) return PyErr_NoMemory();
    Slot *slots = t->slots;
    int log2 = t->log2;
    size_t cap = slots ? (size_t)1 << log2 : 0;
    PyObject *d = t->dict;
    t->slots = fresh;
    t->log2 = MIN_LOG2;
    t->used = t->fill = 0;
    t->dict = NULL; /* back to int mode: the table is empty */
    t->version++;
    for (size_t j = 0; j < cap; j++)
        if (LIVE(slots[j].value)) release(slots[j].value);
    slots_free(slots, log2);
    Py_XDECREF(d);
    Py_RETURN_NONE;
}

static PyObject *it_copy(IntTable *t, PyObject *Py_UNUSED(ignored)) {
    IntTable *c = new_table();
    if (c == NULL) return NULL;
    if (t->dict != NULL) {
        PyObject *r = it_update(c, &t->dict, 1);
        if (r == NULL) {
            Py_DECREF(c);
            return NULL;
        }
        Py_DECREF(r);
        return (PyObject *)c;
    }
    /* the same slots and seed: deleted slots stay deleted (an empty one would cut a probe) */
    size_t cap = (size_t)1 << t->log2;
    Slot *slots = slots_new(t->log2);
    if (slots == NULL) {
        Py_DECREF(c);
        return PyErr_NoMemory();
    }
    memcpy(slots, t->slots, cap * sizeof(Slot));
    for (size_t j = 0; j < cap; j++)
        if (LIVE(slots[j].value)) retain(slots[j].value);
    slots_free(c->slots, c->log2);
    c->slots = slots;
    c->log2 = t->log2;
    c->used = t->used;
    c->fill = t->fill;
    c->seed = t->seed;
    return (PyObject *)c;
}

static PyObject *it_as_dict(IntTable *t) {
    return t->dict ? PyDict_Copy(t->dict) : slots_dict(t);
}

static PyObject *it_dict(IntTable *t, PyObject *Py_UNUSED(ignored)) {
    if (t->dict == NULL) Py_RETURN_NONE;
    Py_INCREF(t->dict);
    return t->dict;
}

static PyObject *it_richcompare(PyObject *a, PyObject *b, int op) {
    if ((op != Py_EQ && op != Py_NE) || !Py_IS_TYPE(a, &IntTableType) ||
        !(PyDict_Check(b) || Py_IS_TYPE(b, &IntTableType)))
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *da = it_as_dict((IntTable *)a);
    if (da == NULL) return NULL;
    PyObject *db = PyDict_Check(b) ? (Py_INCREF(b), b) : it_as_dict((IntTable *)b);
    if (db == NULL) {
        Py_DECREF(da);
        return NULL;
    }
    PyObject *r = PyObject_RichCompare(da, db, op);
    Py_DECREF(da);
    Py_DECREF(db);
    return r;
}

static PyObject *it_repr(IntTable *t) {
    int rc = Py_ReprEnter((PyObject *)t);
    if (rc != 0) return rc > 0 ? PyUnicode_FromString("IntTable(...)") : NULL;
    PyObject *d = it_as_dict(t), *r = NULL;
    if (d != NULL) {
        r = PyUnicode_FromFormat("IntTable(%R)", d);
        Py_DECREF(d);
    }
    Py_ReprLeave((PyObject *)t);
    return r;
}

static PyObject *it_reduce(IntTable *t, PyObject *Py_UNUSED(ignored)) {
    PyObject *d = it_as_dict(t);
    if (d == NULL) return NULL;
    PyObject *r = Py_BuildValue("(O(N))", (PyObject *)Py_TYPE(t), d);
    return r;
}

/* reserve(n): room for n more keys without a resize (a restore that knows how many rows
 * come); nothing in dict mode. */
static PyObject *it_reserve(IntTable *t, PyObject *arg) {
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "reserve(n): n must be >= 0");
        return NULL;
    }
    if (t->dict == NULL && reserve(t, n) < 0) return NULL;
    Py_RETURN_NONE;
}

/* The longest distance of a key from its first slot (the tests' check of the hash). */
static PyObject *it_longest_probe(IntTable *t, PyObject *Py_UNUSED(ignored)) {
    size_t longest = 0;
    if (t->dict == NULL) {
        size_t cap = (size_t)1 << t->log2, mask = cap - 1;
        for (size_t j = 0; j < cap; j++) {
            if (!LIVE(t->slots[j].value)) continue;
            size_t d = (j - home(t->slots[j].key, t->log2)) & mask;
            if (d > longest) longest = d;
        }
    }
    return PyLong_FromSize_t(longest);
}

static PyObject *it_sizeof(IntTable *t, PyObject *Py_UNUSED(ignored)) {
    size_t n = sizeof(IntTable) + (t->slots ? ((size_t)1 << t->log2) * sizeof(Slot) : 0);
    return PyLong_FromSize_t(n);
}

/* -- iteration --------------------------------------------------------------------------- */

enum { ITER_KEYS = 0, ITER_VALUES = 1, ITER_ITEMS = 2 };

typedef struct {
    PyObject_HEAD
    IntTable *table;
    size_t pos;
    uint64_t version;
    int kind;
} TableIter;

static PyTypeObject TableIterType;

static PyObject *make_iter(IntTable *t, int kind) {
    if (t->dict != NULL) {
        const char *name = kind == ITER_KEYS ? "keys" : kind == ITER_VALUES ? "values" : "items";
        return PyObject_CallMethod(t->dict, name, NULL);
    }
    TableIter *it = PyObject_New(TableIter, &TableIterType);
    if (it == NULL) return NULL;
    Py_INCREF(t);
    it->table = t;
    it->pos = 0;
    it->version = t->version;
    it->kind = kind;
    return (PyObject *)it;
}

static PyObject *iter_next(TableIter *it) {
    IntTable *t = it->table;
    if (t == NULL) return NULL;
    if (t->version != it->version || t->dict != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "IntTable changed size during iteration");
        return NULL;
    }
    size_t cap = (size_t)1 << t->log2;
    while (it->pos < cap) {
        Slot *s = &t->slots[it->pos++];
        if (!LIVE(s->value)) continue;
        if (it->kind == ITER_VALUES) return load(s->value);
        PyObject *k = PyLong_FromLongLong(s->key);
        if (k == NULL || it->kind == ITER_KEYS) return k;
        PyObject *v = load(s->value), *pair = v ? PyTuple_New(2) : NULL;
        if (pair == NULL) {
            Py_DECREF(k);
            Py_XDECREF(v);
            return NULL;
        }
        PyTuple_SET_ITEM(pair, 0, k);
        PyTuple_SET_ITEM(pair, 1, v);
        return pair;
    }
    it->table = NULL;
    Py_DECREF(t);
    return NULL;
}

static PyObject *iter_length_hint(TableIter *it, PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromSsize_t(it->table && it->table->dict == NULL ? it->table->used : 0);
}

static void iter_dealloc(TableIter *it) {
    Py_XDECREF(it->table);
    PyObject_Free(it);
}

static PyMethodDef iter_methods[] = {
    {"__length_hint__", (PyCFunction)iter_length_hint, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject TableIterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "statelog._ext.inttable.IntTableIterator",
    .tp_basicsize = sizeof(TableIter),
    .tp_dealloc = (destructor)iter_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)iter_next,
    .tp_methods = iter_methods,
};

static PyObject *it_iter(IntTable *t) {
    if (t->dict != NULL) return PyObject_GetIter(t->dict);
    return make_iter(t, ITER_KEYS);
}
static PyObject *it_keys(IntTable *t, PyObject *Py_UNUSED(ignored)) { return make_iter(t, ITER_KEYS); }
static PyObject *it_values(IntTable *t, PyObject *Py_UNUSED(ignored)) { return make_iter(t, ITER_VALUES); }
static PyObject *it_items(IntTable *t, PyObject *Py_UNUSED(ignored)) { return make_iter(t, ITER_ITEMS); }

/* -- add_into and put_items -------------------------------------------------------------- */

#define PF_AHEAD 16 /* keys ahead whose slot is prefetched */
#define PF_VALUE 6  /* keys ahead whose stored value object is prefetched */

static int int64_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t n, int writable, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    const char *f = view->format ? view->format : "B";
    if (*f == '@' || *f == '=' || *f == '<') f++;
    if (view->itemsize != 8 || !(f[0] == 'l' || f[0] == 'q') || f[1] != '\0' || (n >= 0 && view->len != n * 8)) {
        PyErr_Format(PyExc_TypeError, "%s must be %zd int64s", what, n);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* add_into(table, keys, partial, out, op, lo, hi) -> True, False or None
 *
 * fastpath.add_into for an IntTable in int mode, keys a buffer of distinct int64s: for each
 * i, table[keys[i]] = fold(table.get(keys[i]), partial[i]) and out[i] = that value (FOLD_SUM:
 * an absent entry counts as 0; FOLD_MIN, FOLD_MAX: an absent entry takes partial[i]). Room
 * for every key is made first, so no resize moves a slot during the loop and each key's
 * slot is prefetched PF_AHEAD keys ahead. All or nothing: a stored value that is not an
 * exact int in [lo, hi], or a result outside [lo, hi] (int64 overflow included), puts back
 * every entry the call changed and returns False. None: the table is in dict mode (nothing
 * done). */
static PyObject *add_into(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 || !Py_IS_TYPE(args[0], &IntTableType)) {
        PyErr_SetString(PyExc_TypeError, "add_into(table: IntTable, keys, partial, out, op, lo, hi)");
        return NULL;
    }
    IntTable *t = (IntTable *)args[0];
    if (t->dict != NULL) Py_RETURN_NONE;
    long op;
    long long lo, hi;
    if (fold_args(args, &op, &lo, &hi) < 0) return NULL;
    Py_buffer kv, pv, ov;
    if (int64_buffer(args[1], &kv, -1, 0, "add_into: keys") < 0) return NULL;
    Py_ssize_t n = kv.len / 8;
    if (int64_buffer(args[2], &pv, n, 0, "add_into: partial") < 0) {
        PyBuffer_Release(&kv);
        return NULL;
    }
    if (int64_buffer(args[3], &ov, n, 1, "add_into: out") < 0) {
        PyBuffer_Release(&kv);
        PyBuffer_Release(&pv);
        return NULL;
    }
    const int64_t *keys = kv.buf, *partial = pv.buf;
    int64_t *out = ov.buf;
    PyObject *result = NULL;
    /* what to put back: the slot each key used and the value it held (NULL: none) */
    size_t *where = NULL;
    PyObject **olds = NULL;
    if (reserve(t, n) < 0) goto done;
    where = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(size_t));
    olds = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(PyObject *));
    if (where == NULL || olds == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const int log2 = t->log2;
    Slot *slots = t->slots;
    Py_ssize_t i;
    int declined = 0;
    const size_t mask = ((size_t)1 << log2) - 1;
    for (i = 0; i < n && i < PF_AHEAD; i++) __builtin_prefetch(&slots[home(keys[i], log2)], 1);
    for (i = 0; i < n; i++) {
        if (i + PF_AHEAD < n) __builtin_prefetch(&slots[home(keys[i + PF_AHEAD], log2)], 1);
        if (i + PF_VALUE < n) {
            /* the stored value of a later key, whose slot line came in meanwhile (only its
             * first slot: a key further along its probe is found without the hint) */
            const Slot *ps = &slots[home(keys[i + PF_VALUE], log2) & mask];
            if (ps->key == keys[i + PF_VALUE] && LIVE(ps->value) && !INLINE(ps->value)) __builtin_prefetch(ps->value);
        }
        int found;
        size_t s = find_or_free(t, keys[i], &found);
        int64_t p = partial[i], x = p;
        PyObject *cur = found ? slots[s].value : NULL;
        if (cur != NULL) {
            int of = 0;
            long long y = INLINE(cur) ? untag(cur) : PyLong_CheckExact(cur) ? PyLong_AsLongLongAndOverflow(cur, &of) : 0;
            if (!(INLINE(cur) || PyLong_CheckExact(cur)) || of || y < lo || y > hi) { declined = 1; break; }
            if (op == FOLD_SUM) {
                if ((p > 0 && y > INT64_MAX - p) || (p < 0 && y < INT64_MIN - p)) { declined = 1; break; }
                x = y + p;
            } else if (op == FOLD_MIN) x = y < p ? y : p;
            else x = y > p ? y : p;
            if (x < lo || x > hi) { declined = 1; break; }
            out[i] = x;
            where[i] = s;
            olds[i] = NULL; /* unchanged: nothing to put back */
            if (x == y) continue;
            PyObject *v = stored_int(x);
            if (v == NULL) break;
            olds[i] = cur; /* (owned by olds now) */
            slots[s].value = v;
        } else {
            if (x < lo || x > hi) { declined = 1; break; }
            PyObject *v = stored_int(x);
            if (v == NULL) break;
            out[i] = x;
            where[i] = s;
            olds[i] = DELETED; /* new: put back means delete */
            if (slots[s].value == NULL) t->fill++;
            slots[s].key = keys[i];
            slots[s].value = v;
            t->used++;
        }
    }
    if (i == n) {
        for (Py_ssize_t j = 0; j < n; j++)
            if (olds[j] != NULL && olds[j] != DELETED) release(olds[j]);
        t->version++;
        result = Py_True;
    } else {
        /* put back, newest first: a key new to the table becomes a deleted slot again only if
         * the slot was deleted before; an empty one stays filled as deleted (fill counts it) */
        for (Py_ssize_t j = i - 1; j >= 0; j--) {
            PyObject *o = olds[j];
            if (o == NULL) continue;
            Slot *sl = &slots[where[j]];
            release(sl->value);
            if (o == DELETED) {
                sl->value = DELETED;
                t->used--;
            } else {
                sl->value = o;
            }
        }
        t->version++;
        if (declined) result = Py_False;
    }
done:
    PyMem_Free(where);
    PyMem_Free(olds);
    PyBuffer_Release(&kv);
    PyBuffer_Release(&pv);
    PyBuffer_Release(&ov);
    Py_XINCREF(result);
    return result;
}

/* table[keys[i]] = the i-th value for i in [0, n): values[vstart + i] of the list values,
 * else ints[i]; room made first, each key's slot prefetched PF_AHEAD keys ahead. 0, or -1
 * with an error. (No Python code runs but the release of replaced values, whose finalizers
 * could: the table and the list are checked before each.) */
static int put_run(IntTable *t, const int64_t *keys, PyObject *values, Py_ssize_t vstart, const int64_t *ints,
                   Py_ssize_t n, const char *name) {
    if (reserve(t, n) < 0) return -1;
    for (Py_ssize_t i = 0; i < n && i < PF_AHEAD; i++) __builtin_prefetch(&t->slots[home(keys[i], t->log2)], 1);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + PF_AHEAD < n) __builtin_prefetch(&t->slots[home(keys[i + PF_AHEAD], t->log2)], 1);
        if (t->dict != NULL || t->slots == NULL) {
            PyErr_Format(PyExc_RuntimeError, "%s: the table changed", name);
            return -1;
        }
        PyObject *stored;
        if (values != NULL) {
            if (vstart + i >= PyList_GET_SIZE(values)) {
                PyErr_Format(PyExc_RuntimeError, "%s: the list of values changed", name);
                return -1;
            }
            stored = store_of(PyList_GET_ITEM(values, vstart + i));
        } else if ((stored = stored_int(ints[i])) == NULL) {
            return -1;
        }
        if (set_stored(t, keys[i], stored) < 0) return -1;
    }
    return 0;
}

/* put_items(table, keys, values, start, stop) -> True or None: table[keys[i]] = values[i] for
 * i in [start, stop), in order, each key's slot prefetched ahead (a restore's keys come in
 * key-group order, random in the array). None, with nothing done, when the table is in dict
 * mode or a key of the range is not an int64 (the caller then updates the table itself). */
static PyObject *put_items(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t start, stop;
    if (bulk_range(args, nargs, nargs == 5 && Py_IS_TYPE(args[0], &IntTableType),
                   "put_items(table: IntTable, keys: list, values: list, start, stop)", &start, &stop) < 0)
        return NULL;
    IntTable *t = (IntTable *)args[0];
    PyObject *keys = args[1], *values = args[2];
    if (t->dict != NULL) Py_RETURN_NONE;
    Py_ssize_t n = stop - start;
    int64_t *ik = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    if (ik == NULL) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!as_i64(PyList_GET_ITEM(keys, start + i), &ik[i])) {
            PyMem_Free(ik);
            Py_RETURN_NONE;
        }
    }
    int rc = put_run(t, ik, values, start, NULL, n, "put_items");
    PyMem_Free(ik);
    if (rc < 0) return NULL;
    Py_RETURN_TRUE;
}

/* put_arrays(table, keys, values, start, stop) -> True or None: table[keys[i]] = values[i]
 * for i in [start, stop), keys a buffer of int64s (an Arrow or numpy column: no key objects),
 * values a buffer of int64s (each boxed here) or a list. Each key's slot is prefetched
 * PF_AHEAD keys ahead. None, with nothing done, when the table is in dict mode. */
static PyObject *put_arrays(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !Py_IS_TYPE(args[0], &IntTableType)) {
        PyErr_SetString(PyExc_TypeError, "put_arrays(table: IntTable, keys: int64 buffer, values, start, stop)");
        return NULL;
    }
    IntTable *t = (IntTable *)args[0];
    if (t->dict != NULL) Py_RETURN_NONE;
    Py_ssize_t start = PyLong_AsSsize_t(args[3]), stop;
    if (start == -1 && PyErr_Occurred()) return NULL;
    stop = PyLong_AsSsize_t(args[4]);
    if (stop == -1 && PyErr_Occurred()) return NULL;
    Py_buffer kv, vv;
    if (int64_buffer(args[1], &kv, -1, 0, "put_arrays' keys") < 0) return NULL;
    Py_ssize_t len = kv.len / 8;
    int boxed = PyList_CheckExact(args[2]);
    if (!boxed && int64_buffer(args[2], &vv, len, 0, "put_arrays' values") < 0) {
        PyBuffer_Release(&kv);
        return NULL;
    }
    PyObject *result = NULL;
    if (boxed && PyList_GET_SIZE(args[2]) != len) {
        PyErr_Format(PyExc_ValueError, "put_arrays: %zd keys but %zd values", len, PyList_GET_SIZE(args[2]));
        goto done;
    }
    if (start < 0 || stop < start || stop > len) {
        PyErr_SetString(PyExc_ValueError, "put_arrays: start and stop must be within the arrays");
        goto done;
    }
    if (put_run(t, (const int64_t *)kv.buf + start, boxed ? args[2] : NULL, start,
                boxed ? NULL : (const int64_t *)vv.buf + start, stop - start, "put_arrays") < 0)
        goto done;
    result = Py_True;
    Py_INCREF(result);
done:
    PyBuffer_Release(&kv);
    if (!boxed) PyBuffer_Release(&vv);
    return result;
}

/* -- module ------------------------------------------------------------------------------ */

static PyMethodDef it_methods[] = {
    {"get", (PyCFunction)(void (*)(void))it_get, METH_FASTCALL, "get(key, default=None)"},
    {"pop", (PyCFunction)(void (*)(void))it_pop, METH_FASTCALL, "pop(key[, default])"},
    {"setdefault", (PyCFunction)(void (*)(void))it_setdefault, METH_FASTCALL, "setdefault(key, default=None)"},
    {"update", (PyCFunction)(void (*)(void))it_update, METH_FASTCALL, "update(mapping_or_pairs)"},
    {"keys", (PyCFunction)it_keys, METH_NOARGS, "an iterator over the keys"},
    {"values", (PyCFunction)it_values, METH_NOARGS, "an iterator over the values"},
    {"items", (PyCFunction)it_items, METH_NOARGS, "an iterator over (key, value) pairs"},
    {"clear", (PyCFunction)it_clear, METH_NOARGS, "remove every entry"},
    {"copy", (PyCFunction)it_copy, METH_NOARGS, "a shallow copy"},
    {"dict", (PyCFunction)it_dict, METH_NOARGS, "the table's dict in dict mode, else None"},
    {"__reduce__", (PyCFunction)it_reduce, METH_NOARGS, NULL},
    {"__sizeof__", (PyCFunction)it_sizeof, METH_NOARGS, NULL},
    {"reserve", (PyCFunction)it_reserve, METH_O, "reserve(n): room for n more keys without a resize"},
    {"_longest_probe", (PyCFunction)it_longest_probe, METH_NOARGS, "the longest distance of a key from its first slot"},
    {NULL, NULL, 0, NULL},
};

static PyMappingMethods it_as_mapping = {
    .mp_length = (lenfunc)it_len,
    .mp_subscript = (binaryfunc)it_subscript,
    .mp_ass_subscript = (objobjargproc)it_ass_subscript,
};

static PySequenceMethods it_as_sequence = {
    .sq_contains = (objobjproc)it_contains,
};

static PyTypeObject IntTableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "statelog._ext.inttable.IntTable",
    .tp_doc = "A state's table {key: entry} for int keys (a dict for any other key).",
    .tp_basicsize = sizeof(IntTable),
    .tp_dealloc = (destructor)it_dealloc,
    .tp_repr = (reprfunc)it_repr,
    .tp_as_sequence = &it_as_sequence,
    .tp_as_mapping = &it_as_mapping,
    .tp_hash = PyObject_HashNotImplemented,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_MAPPING,
    .tp_richcompare = it_richcompare,
    .tp_iter = (getiterfunc)it_iter,
    .tp_methods = it_methods,
    .tp_new = it_new,
};

static PyMethodDef module_methods[] = {
    {"add_into", (PyCFunction)(void (*)(void))add_into, METH_FASTCALL,
     "add_into(table, keys, partial, out, op, lo, hi): fold a batch into an IntTable."},
    {"put_items", (PyCFunction)(void (*)(void))put_items, METH_FASTCALL,
     "put_items(table, keys, values, start, stop): table[keys[i]] = values[i], prefetched."},
    {"put_arrays", (PyCFunction)(void (*)(void))put_arrays, METH_FASTCALL,
     "put_arrays(table, keys, values, start, stop): table[keys[i]] = values[i], keys an int64 buffer, "
     "values an int64 buffer or a list."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "statelog._ext.inttable", "IntTable: a state's table for int keys.", -1, module_methods,
};

PyMODINIT_FUNC PyInit_inttable(void) {
    if (PyType_Ready(&IntTableType) < 0 || PyType_Ready(&TableIterType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    Py_INCREF(&IntTableType);
    if (PyModule_AddObject(m, "IntTable", (PyObject *)&IntTableType) < 0 ||
        PyModule_AddIntConstant(m, "FOLD_SUM", FOLD_SUM) < 0 || PyModule_AddIntConstant(m, "FOLD_MIN", FOLD_MIN) < 0 ||
        PyModule_AddIntConstant(m, "FOLD_MAX", FOLD_MAX) < 0) {
        Py_DECREF(&IntTableType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
