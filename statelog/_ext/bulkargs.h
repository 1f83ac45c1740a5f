/* The arguments shared by the table functions of fastpath.c (a dict) and inttable.c (an
 * IntTable): put_items' (table, keys, values, start, stop), two lists of the same length and
 * a range within them, and add_into's fold (op, lo, hi). */
#ifndef STATELOG_BULKARGS_H
#define STATELOG_BULKARGS_H
#include <Python.h>

/* 0 with *start and *stop set, or -1 with an error. args[0] was checked by the caller. */
static int bulk_range(PyObject *const *args, Py_ssize_t nargs, int table_ok, const char *usage, Py_ssize_t *start,
                      Py_ssize_t *stop) {
    if (nargs != 5 || !table_ok || !PyList_CheckExact(args[1]) || !PyList_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    PyObject *keys = args[1], *values = args[2];
    *start = PyLong_AsSsize_t(args[3]);
    if (*start == -1 && PyErr_Occurred()) return -1;
    *stop = PyLong_AsSsize_t(args[4]);
    if (*stop == -1 && PyErr_Occurred()) return -1;
    if (PyList_GET_SIZE(keys) != PyList_GET_SIZE(values)) {
        PyErr_Format(PyExc_ValueError, "put_items: %zd keys but %zd values", PyList_GET_SIZE(keys),
                     PyList_GET_SIZE(values));
        return -1;
    }
    if (*start < 0 || *stop < *start || *stop > PyList_GET_SIZE(keys)) {
        PyErr_SetString(PyExc_ValueError, "put_items: start and stop must be within the lists");
        return -1;
    }
    return 0;
}

enum { FOLD_SUM = 0, FOLD_MIN = 1, FOLD_MAX = 2 };

/* add_into's args[4:7]: the fold and the declared type's range. 0, or -1 with an error. */
static int fold_args(PyObject *const *args, long *op, long long *lo, long long *hi) {
    *op = PyLong_AsLong(args[4]);
    if (*op == -1 && PyErr_Occurred()) return -1;
    if (*op < FOLD_SUM || *op > FOLD_MAX) {
        PyErr_Format(PyExc_ValueError, "add_into: unknown fold %ld", *op);
        return -1;
    }
    *lo = PyLong_AsLongLong(args[5]);
    if (*lo == -1 && PyErr_Occurred()) return -1;
    *hi = PyLong_AsLongLong(args[6]);
    if (*hi == -1 && PyErr_Occurred()) return -1;
    return 0;
}
#endif
