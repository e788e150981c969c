/* The columnar encoder's loops over Arrow buffers, compiled when kprod's wheel is built.

   Callers (spark_sink/encoder/columnar.py, producer/partitioner.py) pass numpy views of
   Arrow buffers and allocate the outputs; the loops release the GIL, so the producer's
   sender thread keeps the network busy while a task encodes its next rows. jit.py holds
   the same loops for numba, used where this extension was not built (a --py-files zip);
   tests/encoder/test_columnar.py checks both against the row-wise reference encoder.

   A binary column is (data, starts, lengths): the whole data buffer, where each value
   starts in it, its length (-1 for null; empty lengths: every value null). Only array
   sizes are checked here: the indices inside them are the caller's (columnar.py checks
   the group ids; Arrow's offsets keep starts and lengths inside data). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Every buffer a call acquired, released together however the call ends. */
#define MAX_VIEWS 24
typedef struct {
    Py_buffer view[MAX_VIEWS];
    int count;
} Views;

static void release(Views *views) {
    for (int i = 0; i < views->count; i++) PyBuffer_Release(&views->view[i]);
    views->count = 0;
}

/* A contiguous array of `itemsize`-byte items: its data, and its item count in *len. */
static void *items(Views *views, PyObject *obj, Py_ssize_t itemsize, int writable, Py_ssize_t *len,
                   const char *name) {
    Py_buffer *view = &views->view[views->count];
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return NULL;
    views->count++;
    if (view->itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: expected %zd-byte items, got %zd", name, itemsize, view->itemsize);
        return NULL;
    }
    *len = view->len / itemsize;
    return view->buf;
}

typedef struct {
    const uint8_t *data;
    const int32_t *starts;
    const int64_t *lengths;
    Py_ssize_t rows; /* 0: absent, every value null */
} Column;

static int column(Views *views, PyObject *tuple, Column *col, const char *name) {
    PyObject *data, *starts, *lengths;
    Py_ssize_t data_len, starts_len;
    if (!PyArg_ParseTuple(tuple, "OOO", &data, &starts, &lengths)) return 0;
    if (!(col->data = items(views, data, 1, 0, &data_len, name)) ||
        !(col->starts = items(views, starts, 4, 0, &starts_len, name)) ||
        !(col->lengths = items(views, lengths, 8, 0, &col->rows, name)))
        return 0;
    if (starts_len != col->rows) {
        PyErr_Format(PyExc_ValueError, "%s: %zd starts for %zd lengths", name, starts_len, col->rows);
        return 0;
    }
    return 1;
}

static int too_short(const char *name, Py_ssize_t len, Py_ssize_t rows) {
    PyErr_Format(PyExc_ValueError, "%s: %zd items for %zd rows", name, len, rows);
    return 0;
}

/* Bytes of the zigzag varint of an int64. */
static inline int64_t varint_size(int64_t value) {
    uint64_t u = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    int64_t size = 1;
    while (u >= 128) {
        u >>= 7;
        size++;
    }
    return size;
}

/* A length-prefixed field: its varint and its bytes (none for null, length -1). */
static inline int64_t field_size(int64_t length) { return varint_size(length) + (length > 0 ? length : 0); }

static inline uint8_t *put_varint(uint8_t *out, int64_t value) {
    uint64_t u = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    while (u >= 128) {
        *out++ = (uint8_t)(u | 0x80);
        u >>= 7;
    }
    *out++ = (uint8_t)u;
    return out;
}

/* A whole record, its length varint included, from the bytes that do not depend on where
   it lands in a batch (attributes, key, value, headers) and its two deltas. */
static inline int64_t record_size(int64_t fixed, int64_t timestamp_delta, int64_t offset_delta) {
    int64_t body = fixed + varint_size(timestamp_delta) + varint_size(offset_delta);
    return body + varint_size(body);
}

static inline uint8_t *put_field(uint8_t *out, const uint8_t *data, int64_t length) {
    out = put_varint(out, length);
    if (length > 0) {
        memcpy(out, data, (size_t)length);
        out += length;
    }
    return out;
}

PyDoc_STRVAR(header_sizes_doc,
"header_sizes(entry_offsets, key_lengths, value_lengths, out)\n--\n\n"
"Bytes of each row's header section into out (int64, one per row), its count included (a\n"
"null key is written empty). entry_offsets: int32, each row's first entry, then the end.");

static PyObject *header_sizes(PyObject *self, PyObject *args) {
    PyObject *a[4];
    Views views = {.count = 0};
    Py_ssize_t n_offsets, n_keys, n_values, n;
    if (!PyArg_ParseTuple(args, "OOOO", &a[0], &a[1], &a[2], &a[3])) return NULL;
    const int32_t *entry_offsets = items(&views, a[0], 4, 0, &n_offsets, "entry_offsets");
    const int64_t *key_lengths = entry_offsets ? items(&views, a[1], 8, 0, &n_keys, "key_lengths") : NULL;
    const int64_t *value_lengths = key_lengths ? items(&views, a[2], 8, 0, &n_values, "value_lengths") : NULL;
    int64_t *sizes = value_lengths ? items(&views, a[3], 8, 1, &n, "out") : NULL;
    if (!sizes) goto fail;
    if (n_offsets != n + 1) {
        too_short("entry_offsets", n_offsets, n + 1);
        goto fail;
    }
    if (n && (entry_offsets[n] > n_keys || entry_offsets[n] > n_values)) {
        too_short("header entries", n_keys < n_values ? n_keys : n_values, entry_offsets[n]);
        goto fail;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t row = 0; row < n; row++) {
        int64_t size = varint_size(entry_offsets[row + 1] - entry_offsets[row]);
        for (int32_t e = entry_offsets[row]; e < entry_offsets[row + 1]; e++)
            size += field_size(key_lengths[e] > 0 ? key_lengths[e] : 0) + field_size(value_lengths[e]);
        sizes[row] = size;
    }
    Py_END_ALLOW_THREADS
    release(&views);
    Py_RETURN_NONE;
fail:
    release(&views);
    return NULL;
}

PyDoc_STRVAR(plan_batches_doc,
"plan_batches(key_lengths, value_lengths, header_sizes, timestamps, groups, group_count, limit,\n"
"             opens, plan) -> batch count\n--\n\n"
"Split rows into record batches, each row in its group's (a partition's) batches.\n\n"
"Rows are read in input order and each group's rows keep that order. Greedy and exact, as\n"
"the accumulator fills a batch: a group's batch takes rows while its records section stays\n"
"within limit bytes (a row larger than that gets a batch of its own). Empty key_lengths: no\n"
"keys; empty header_sizes: no headers; empty groups: every row in group 0.\n\n"
"Writes whether each row opens a batch into opens (bool, zeroed, one per row), and per\n"
"batch, in the order they were opened, into the rows of plan (int64, 5 x rows): its group,\n"
"record count, records section size, first and largest timestamp.");

static PyObject *plan_batches(PyObject *self, PyObject *args) {
    PyObject *a[8];
    Py_ssize_t group_count;
    int64_t limit;
    Views views = {.count = 0};
    Py_ssize_t n_keys, n, n_headers, n_ts, n_groups, n_opens, n_plan;
    if (!PyArg_ParseTuple(args, "OOOOOnLOO", &a[0], &a[1], &a[2], &a[3], &a[4], &group_count, &limit, &a[5], &a[6]))
        return NULL;
    const int64_t *key_lengths = items(&views, a[0], 8, 0, &n_keys, "key_lengths");
    const int64_t *value_lengths = key_lengths ? items(&views, a[1], 8, 0, &n, "value_lengths") : NULL;
    const int64_t *header_sizes = value_lengths ? items(&views, a[2], 8, 0, &n_headers, "header_sizes") : NULL;
    const int64_t *timestamps = header_sizes ? items(&views, a[3], 8, 0, &n_ts, "timestamps") : NULL;
    const int64_t *groups = timestamps ? items(&views, a[4], 8, 0, &n_groups, "groups") : NULL;
    uint8_t *opens = groups ? items(&views, a[5], 1, 1, &n_opens, "opens") : NULL;
    int64_t *plan = opens ? items(&views, a[6], 8, 1, &n_plan, "plan") : NULL;
    int64_t *current = NULL;
    if (!plan) goto fail;
    if ((n_keys && n_keys != n) || (n_headers && n_headers != n) || n_ts != n || (n_groups && n_groups != n) ||
        n_opens != n || n_plan != 5 * n) {
        PyErr_Format(PyExc_ValueError, "plan_batches: arrays of %zd rows expected", n);
        goto fail;
    }
    if (group_count < 1 || !(current = PyMem_Malloc(group_count * sizeof(int64_t)))) {
        if (group_count < 1) PyErr_SetString(PyExc_ValueError, "plan_batches: group_count must be at least 1");
        else PyErr_NoMemory();
        goto fail;
    }
    int64_t *batch_group = plan, *counts = plan + n, *sizes = plan + 2 * n, *base_ts = plan + 3 * n,
            *max_ts = plan + 4 * n;
    Py_ssize_t batches = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t g = 0; g < group_count; g++) current[g] = -1; /* each group's open batch */
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t group = n_groups ? groups[i] : 0, ts = timestamps[i];
        /* attributes, key, value, headers: all but the two deltas */
        int64_t fixed = 1 + field_size(n_keys ? key_lengths[i] : -1) + field_size(value_lengths[i]) +
                        (n_headers ? header_sizes[i] : 1);
        int64_t batch = current[group], size = 0;
        if (batch >= 0) {
            size = record_size(fixed, ts - base_ts[batch], counts[batch]);
            if (sizes[batch] + size > limit) batch = -1;
        }
        if (batch < 0) {
            batch = batches++;
            current[group] = batch;
            opens[i] = 1;
            batch_group[batch] = group;
            counts[batch] = 0;
            sizes[batch] = 0;
            base_ts[batch] = ts;
            max_ts[batch] = ts;
            size = record_size(fixed, 0, 0);
        }
        counts[batch]++;
        sizes[batch] += size;
        if (ts > max_ts[batch]) max_ts[batch] = ts;
    }
    Py_END_ALLOW_THREADS
    PyMem_Free(current);
    release(&views);
    return PyLong_FromSsize_t(batches);
fail:
    release(&views);
    return NULL;
}

PyDoc_STRVAR(write_records_doc,
"write_records(out, group_starts, opens, groups, keys, values, headers, timestamps)\n--\n\n"
"Write every row's record into out, each group's records from its start in group_starts\n"
"on, split into batches where opens (from plan_batches) says. headers: (first_entry,\n"
"end_entry, sizes, keys, values), each row's range of entries, the bytes of its header\n"
"section (empty sizes: no headers), and the entries' key and value columns.");

static PyObject *write_records(PyObject *self, PyObject *args) {
    PyObject *out_o, *starts_o, *opens_o, *groups_o, *keys_o, *values_o, *first_o, *end_o, *sizes_o, *hkeys_o,
        *hvalues_o, *ts_o;
    Views views = {.count = 0};
    Column keys, values, hkeys, hvalues;
    Py_ssize_t n_out, group_count, n_opens, n_groups, n_first, n_end, n_sizes, n_ts;
    int64_t *cursor = NULL, *in_batch = NULL, *base = NULL;
    if (!PyArg_ParseTuple(args, "OOOOOO(OOOOO)O", &out_o, &starts_o, &opens_o, &groups_o, &keys_o, &values_o,
                          &first_o, &end_o, &sizes_o, &hkeys_o, &hvalues_o, &ts_o))
        return NULL;
    uint8_t *out = items(&views, out_o, 1, 1, &n_out, "out");
    const int64_t *group_starts = out ? items(&views, starts_o, 8, 0, &group_count, "group_starts") : NULL;
    const uint8_t *opens = group_starts ? items(&views, opens_o, 1, 0, &n_opens, "opens") : NULL;
    const int64_t *groups = opens ? items(&views, groups_o, 8, 0, &n_groups, "groups") : NULL;
    const int32_t *first_entry = groups ? items(&views, first_o, 4, 0, &n_first, "headers") : NULL;
    const int32_t *end_entry = first_entry ? items(&views, end_o, 4, 0, &n_end, "headers") : NULL;
    const int64_t *header_sizes = end_entry ? items(&views, sizes_o, 8, 0, &n_sizes, "headers") : NULL;
    const int64_t *timestamps = header_sizes ? items(&views, ts_o, 8, 0, &n_ts, "timestamps") : NULL;
    if (!timestamps || !column(&views, keys_o, &keys, "keys") || !column(&views, values_o, &values, "values") ||
        !column(&views, hkeys_o, &hkeys, "header keys") || !column(&views, hvalues_o, &hvalues, "header values"))
        goto fail;
    Py_ssize_t n = values.rows;
    if ((keys.rows && keys.rows != n) || n_opens != n || (n_groups && n_groups != n) || n_ts != n ||
        (n_sizes && (n_sizes != n || n_first != n || n_end != n)) || group_count < 1) {
        PyErr_Format(PyExc_ValueError, "write_records: arrays of %zd rows and at least one group expected", n);
        goto fail;
    }
    cursor = PyMem_Malloc(group_count * sizeof(int64_t));
    in_batch = PyMem_Calloc(group_count, sizeof(int64_t)); /* records so far in each group's batch */
    base = PyMem_Calloc(group_count, sizeof(int64_t));     /* and its first timestamp */
    if (!cursor || !in_batch || !base) {
        PyErr_NoMemory();
        goto fail;
    }
    memcpy(cursor, group_starts, group_count * sizeof(int64_t));
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t group = n_groups ? groups[i] : 0;
        if (opens[i]) {
            in_batch[group] = 0;
            base[group] = timestamps[i];
        }
        int64_t offset_delta = in_batch[group]++;
        int64_t timestamp_delta = timestamps[i] - base[group];
        int64_t key_length = keys.rows ? keys.lengths[i] : -1, value_length = values.lengths[i];
        int64_t fixed = 1 + field_size(key_length) + field_size(value_length) + (n_sizes ? header_sizes[i] : 1);
        uint8_t *pos = out + cursor[group];
        pos = put_varint(pos, fixed + varint_size(timestamp_delta) + varint_size(offset_delta));
        *pos++ = 0; /* attributes */
        pos = put_varint(pos, timestamp_delta);
        pos = put_varint(pos, offset_delta);
        pos = put_field(pos, keys.data + (keys.rows ? keys.starts[i] : 0), key_length);
        pos = put_field(pos, values.data + values.starts[i], value_length);
        if (!n_sizes) {
            *pos++ = 0; /* no headers */
        } else {
            pos = put_varint(pos, end_entry[i] - first_entry[i]);
            for (int32_t e = first_entry[i]; e < end_entry[i]; e++) {
                int64_t length = hkeys.lengths[e] > 0 ? hkeys.lengths[e] : 0; /* a null key is written empty */
                pos = put_field(pos, hkeys.data + hkeys.starts[e], length);
                pos = put_field(pos, hvalues.data + hvalues.starts[e], hvalues.lengths[e]);
            }
        }
        cursor[group] = pos - out;
    }
    Py_END_ALLOW_THREADS
    PyMem_Free(cursor);
    PyMem_Free(in_batch);
    PyMem_Free(base);
    release(&views);
    Py_RETURN_NONE;
fail:
    PyMem_Free(cursor);
    PyMem_Free(in_batch);
    PyMem_Free(base);
    release(&views);
    return NULL;
}

PyDoc_STRVAR(murmur2_rows_doc,
"murmur2_rows(data, offsets, nulls, seed, out)\n--\n\n"
"MurmurHash2 with seed (Kafka's Utils.murmur2 with Kafka's seed) of each value of a binary\n"
"column into out (uint32, one per row): data uint8, offsets int32 (rows + 1), nulls bool\n"
"(empty: no nulls; nulls, and absent data, hash as empty).");

static PyObject *murmur2_rows(PyObject *self, PyObject *args) {
    PyObject *a[4];
    int64_t seed;
    Views views = {.count = 0};
    Py_ssize_t n_data, n_offsets, n_nulls, n;
    if (!PyArg_ParseTuple(args, "OOOLO", &a[0], &a[1], &a[2], &seed, &a[3])) return NULL;
    const uint8_t *data = items(&views, a[0], 1, 0, &n_data, "data");
    const int32_t *offsets = data ? items(&views, a[1], 4, 0, &n_offsets, "offsets") : NULL;
    const uint8_t *nulls = offsets ? items(&views, a[2], 1, 0, &n_nulls, "nulls") : NULL;
    uint32_t *out = nulls ? items(&views, a[3], 4, 1, &n, "out") : NULL;
    if (!out) goto fail;
    if (n_offsets != n + 1 || (n_nulls && n_nulls != n)) {
        PyErr_Format(PyExc_ValueError, "murmur2_rows: %zd offsets and %zd nulls for %zd rows", n_offsets, n_nulls, n);
        goto fail;
    }
    const uint32_t m = 0x5BD1E995;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t row = 0; row < n; row++) {
        int32_t length = n_nulls && nulls[row] ? 0 : offsets[row + 1] - offsets[row];
        const uint8_t *p = data + offsets[row];
        uint32_t h = (uint32_t)seed ^ (uint32_t)length;
        for (int32_t i = 0; i + 4 <= length; i += 4, p += 4) {
            uint32_t k = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
            k *= m;
            k ^= k >> 24;
            k *= m;
            h = (h * m) ^ k;
        }
        switch (length & 3) {
        case 3: h ^= (uint32_t)p[2] << 16; /* fall through */
        case 2: h ^= (uint32_t)p[1] << 8;  /* fall through */
        case 1: h ^= p[0]; h *= m;
        }
        h ^= h >> 13;
        h *= m;
        h ^= h >> 15;
        out[row] = h;
    }
    Py_END_ALLOW_THREADS
    release(&views);
    Py_RETURN_NONE;
fail:
    release(&views);
    return NULL;
}

static PyMethodDef methods[] = {
    {"header_sizes", header_sizes, METH_VARARGS, header_sizes_doc},
    {"plan_batches", plan_batches, METH_VARARGS, plan_batches_doc},
    {"write_records", write_records, METH_VARARGS, write_records_doc},
    {"murmur2_rows", murmur2_rows, METH_VARARGS, murmur2_rows_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_kernels",
    .m_doc = "kprod's columnar encoder loops, compiled when the wheel is built.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
