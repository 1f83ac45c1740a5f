/* Hot path of value-like state in C: ValueState.update() without the interpreter.
 *
 * update(v): type check (fast for the declared primitive type, else the Python validator),
 * state._cur[backend._key] = v, and with a changelog stream: append the compact record
 * (key bytes, key group, namespace bytes, op, v) to the stream's flat buffer, then call
 * stream.on_buffer_full() when len(buffer) >= stream.buf_limit. The five appends happen
 * without running Python code in between, so the flusher (which takes whole records under
 * the GIL) never sees a partial record. The pure-Python closure in statelog/state/kinds.py
 * is the reference implementation and the fallback when this module is not built.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <limits.h>

static PyObject *s_cur, *s_key, *s_kb, *s_kg, *s_nsb, *s_buf_limit, *s_on_buffer_full;

typedef struct {
    PyObject_HEAD
    PyObject *state;
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
    Py_CLEAR(self->state); Py_CLEAR(self->backend); Py_CLEAR(self->buf); Py_CLEAR(self->stream);
    Py_CLEAR(self->pytype); Py_CLEAR(self->check); Py_CLEAR(self->clear); Py_CLEAR(self->op);
    PyObject_GC_Del(self);
}

static int update_traverse(Update *self, visitproc visit, void *arg) {
    Py_VISIT(self->state); Py_VISIT(self->backend); Py_VISIT(self->buf); Py_VISIT(self->stream);
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
    PyObject *cur = PyObject_GetAttr(self->state, s_cur);
    if (cur == NULL) return NULL;
    PyObject *key = PyObject_GetAttr(self->backend, s_key);
    if (key == NULL) { Py_DECREF(cur); return NULL; }
    int rc = PyObject_SetItem(cur, key, v);
    Py_DECREF(cur);
    Py_DECREF(key);
    if (rc < 0) return NULL;
    if (self->buf == NULL) Py_RETURN_NONE;

    PyObject *kb = PyObject_GetAttr(self->backend, s_kb);
    PyObject *kg = kb ? PyObject_GetAttr(self->backend, s_kg) : NULL;
    PyObject *nsb = kg ? PyObject_GetAttr(self->state, s_nsb) : NULL;
    PyObject *lim = nsb ? PyObject_GetAttr(self->stream, s_buf_limit) : NULL;
    if (lim == NULL) { Py_XDECREF(kb); Py_XDECREF(kg); Py_XDECREF(nsb); return NULL; }
    Py_ssize_t limit = PyLong_AsSsize_t(lim);
    Py_DECREF(lim);
    if (limit == -1 && PyErr_Occurred()) { Py_DECREF(kb); Py_DECREF(kg); Py_DECREF(nsb); return NULL; }
    /* one whole record; no Python code runs between these appends */
    if (PyList_Append(self->buf, kb) < 0 || PyList_Append(self->buf, kg) < 0 ||
        PyList_Append(self->buf, nsb) < 0 || PyList_Append(self->buf, self->op) < 0 ||
        PyList_Append(self->buf, v) < 0) {
        Py_DECREF(kb); Py_DECREF(kg); Py_DECREF(nsb);
        return NULL;
    }
    Py_DECREF(kb); Py_DECREF(kg); Py_DECREF(nsb);
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

/* make_update(state, backend, buf, stream, pytype, lo, hi, check, clear, op) */
static PyObject *make_update(PyObject *module, PyObject *args) {
    PyObject *state, *backend, *buf, *stream, *pytype, *lo, *hi, *check, *clear, *op;
    if (!PyArg_UnpackTuple(args, "make_update", 10, 10, &state, &backend, &buf, &stream, &pytype,
                           &lo, &hi, &check, &clear, &op))
        return NULL;
    if (buf != Py_None && !PyList_CheckExact(buf)) {
        PyErr_SetString(PyExc_TypeError, "buf must be a list or None");
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
    Py_INCREF(state); self->state = state;
    Py_INCREF(backend); self->backend = backend;
    if (buf == Py_None) { self->buf = NULL; self->stream = NULL; }
    else { Py_INCREF(buf); self->buf = buf; Py_INCREF(stream); self->stream = stream; }
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
    INTERN(s_cur, "_cur") INTERN(s_key, "_key") INTERN(s_kb, "_kb") INTERN(s_kg, "_kg")
    INTERN(s_nsb, "_nsb") INTERN(s_buf_limit, "buf_limit") INTERN(s_on_buffer_full, "on_buffer_full")
    return PyModule_Create(&moduledef);
}
