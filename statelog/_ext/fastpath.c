/* Hot path of value-like state in C: ValueState.update() without the interpreter.
 *
 * update(v): type check (fast for the declared primitive type, else the Python validator),
 * table[backend._key] = v for the state's current namespace table, and with a changelog
 * stream: append the compact record (key bytes, key group, namespace bytes, op, v) to the
 * stream's flat buffer, then call stream.on_buffer_full() when len(buffer) reaches the
 * stream's limit cell. The state shares its [table, namespace bytes] as a list (updated
 * by set_namespace) and the stream its limit as a one-element list (0 while throttled). The five appends happen
 * without running Python code in between, so the flusher (which takes whole records under
 * the GIL) never sees a partial record. The pure-Python closure in statelog/state/kinds.py
 * is the reference implementation and the fallback when this module is not built.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <limits.h>

static PyObject *s_key, *s_kinfo, *s_on_buffer_full;

typedef struct {
    PyObject_HEAD
    PyObject *nsctx;    /* the state's [current table, current namespace bytes] */
    PyObject *cell;     /* the stream's [buffer limit], or NULL */
    PyObject *backend;
    PyObject *buf;      /* list, or NULL without changelog */
    PyObject *stream;   /* stream, or NULL */
    PyObject *pytype;   /* the Python type that passes without calling check */
    int is_int;
    long long lo, hi;
    PyObject *check;
    PyObject *clear;
    PyObject *op;
    vectorcallfunc vectorcall;
} Update;

static void update_dealloc(Update *self) {
    PyObject_GC_UnTrack(self);
    Py_CLEAR(self->nsctx); Py_CLEAR(self->cell); Py_CLEAR(self->backend); Py_CLEAR(self->buf);
    Py_CLEAR(self->stream);
    Py_CLEAR(self->pytype); Py_CLEAR(self->check); Py_CLEAR(self->clear); Py_CLEAR(self->op);
    PyObject_GC_Del(self);
}

static int update_traverse(Update *self, visitproc visit, void *arg) {
    Py_VISIT(self->nsctx); Py_VISIT(self->cell); Py_VISIT(self->backend); Py_VISIT(self->buf);
    Py_VISIT(self->stream);
    Py_VISIT(self->pytype); Py_VISIT(self->check); Py_VISIT(self->clear); Py_VISIT(self->op);
    return 0;
}

static PyObject *update_call(Update *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)) {
        PyErr_SetString(PyExc_TypeError, "update() takes exactly one positional argument");
        return NULL;
    }
    PyObject *v = args[0];
    int ok = 0;
    if ((PyObject *)Py_TYPE(v) == self->pytype) {
        if (self->is_int) {
            int overflow = 0;
            long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
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
    PyObject *key = PyObject_GetAttr(self->backend, s_key);
    if (key == NULL) return NULL;
    Py_INCREF(cur);
    int rc = PyObject_SetItem(cur, key, v); /* may run Python code (__hash__, __eq__) */
    Py_DECREF(cur);
    Py_DECREF(key);
    if (rc < 0) return NULL;
    if (self->buf == NULL) Py_RETURN_NONE;

    PyObject *kinfo = PyObject_GetAttr(self->backend, s_kinfo);
    if (kinfo == NULL) return NULL;
    if (!PyTuple_CheckExact(kinfo) || PyTuple_GET_SIZE(kinfo) != 3) {
        Py_DECREF(kinfo);
        PyErr_SetString(PyExc_TypeError, "fast path: backend._kinfo must be a 3-tuple");
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(PyList_GET_ITEM(self->cell, 0));
    if (limit == -1 && PyErr_Occurred()) { Py_DECREF(kinfo); return NULL; }
    /* one whole record; no Python code runs between these appends */
    if (PyList_Append(self->buf, PyTuple_GET_ITEM(kinfo, 1)) < 0 ||
        PyList_Append(self->buf, PyTuple_GET_ITEM(kinfo, 2)) < 0 ||
        PyList_Append(self->buf, PyList_GET_ITEM(self->nsctx, 1)) < 0 ||
        PyList_Append(self->buf, self->op) < 0 || PyList_Append(self->buf, v) < 0) {
        Py_DECREF(kinfo);
        return NULL;
    }
    Py_DECREF(kinfo);
    if (PyList_GET_SIZE(self->buf) >= limit) {
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

/* make_update(backend, buf, stream, pytype, lo, hi, check, clear, op, nsctx, cell) */
static PyObject *make_update(PyObject *module, PyObject *args) {
    PyObject *backend, *buf, *stream, *pytype, *lo, *hi, *check, *clear, *op, *nsctx, *cell;
    if (!PyArg_UnpackTuple(args, "make_update", 11, 11, &backend, &buf, &stream, &pytype, &lo,
                           &hi, &check, &clear, &op, &nsctx, &cell))
        return NULL;
    if ((buf != Py_None && (!PyList_CheckExact(buf) || !PyList_CheckExact(cell) ||
                            PyList_GET_SIZE(cell) != 1)) ||
        !PyList_CheckExact(nsctx) || PyList_GET_SIZE(nsctx) != 2) {
        PyErr_SetString(PyExc_TypeError, "make_update: bad buffer, limit cell or namespace context");
        return NULL;
    }
    Update *self = PyObject_GC_New(Update, &UpdateType);
    if (self == NULL) return NULL;
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
    Py_INCREF(backend); self->backend = backend;
    Py_INCREF(nsctx); self->nsctx = nsctx;
    if (buf == Py_None) { self->buf = NULL; self->stream = NULL; self->cell = NULL; }
    else {
        Py_INCREF(buf); self->buf = buf;
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

static PyMethodDef methods[] = {
    {"make_update", make_update, METH_VARARGS, "Build the fast update() of a value-like state."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "fastpath", NULL, -1, methods};

PyMODINIT_FUNC PyInit_fastpath(void) {
    if (PyType_Ready(&UpdateType) < 0) return NULL;
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL;
    INTERN(s_key, "_key") INTERN(s_kinfo, "_kinfo") INTERN(s_on_buffer_full, "on_buffer_full")
    return PyModule_Create(&moduledef);
}
