/* The columnar encoder's loops over Arrow buffers, and send()'s per-record path (at the
   end: RecordBuffer, PlainAppender, PlainSender, run_callbacks), compiled when kprod's
   wheel is built.

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
#include <time.h>

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
"             opens, plan, continued=None) -> batch count\n--\n\n"
"Split rows into record batches, each row in its group's (a partition's) batches.\n\n"
"Rows are read in input order and each group's rows keep that order. Greedy and exact, as\n"
"the accumulator fills a batch: a group's batch takes rows while its records section stays\n"
"within limit bytes (a row larger than that gets a batch of its own). Empty key_lengths: no\n"
"keys; empty header_sizes: no headers; empty groups: every row in group 0.\n\n"
"Writes whether each row opens a batch into opens (bool, zeroed, one per row), and per\n"
"batch, in the order they were opened, into the rows of plan (int64, 5 x rows): its group,\n"
"record count, records section size, first and largest timestamp.\n\n"
"continued (int64, 3 x group_count: record count, records section bytes, first timestamp;\n"
"a count of 0 for none): a batch of each group's already holding records, which its first\n"
"rows continue while they fit (its record count their first offset delta, its first\n"
"timestamp their timestamp deltas' base). plan then has a sixth row, each batch's first\n"
"offset delta (0: a batch of its own); a continuing batch's count and size are its rows'\n"
"own, its first timestamp the continued batch's.");

static PyObject *plan_batches(PyObject *self, PyObject *args) {
    PyObject *a[8] = {NULL};
    Py_ssize_t group_count;
    int64_t limit;
    Views views = {.count = 0};
    Py_ssize_t n_keys, n, n_headers, n_ts, n_groups, n_opens, n_plan, n_continued = 0;
    if (!PyArg_ParseTuple(args, "OOOOOnLOO|O", &a[0], &a[1], &a[2], &a[3], &a[4], &group_count, &limit, &a[5], &a[6],
                          &a[7]))
        return NULL;
    int rows = a[7] && a[7] != Py_None ? 6 : 5;
    const int64_t *key_lengths = items(&views, a[0], 8, 0, &n_keys, "key_lengths");
    const int64_t *value_lengths = key_lengths ? items(&views, a[1], 8, 0, &n, "value_lengths") : NULL;
    const int64_t *header_sizes = value_lengths ? items(&views, a[2], 8, 0, &n_headers, "header_sizes") : NULL;
    const int64_t *timestamps = header_sizes ? items(&views, a[3], 8, 0, &n_ts, "timestamps") : NULL;
    const int64_t *groups = timestamps ? items(&views, a[4], 8, 0, &n_groups, "groups") : NULL;
    uint8_t *opens = groups ? items(&views, a[5], 1, 1, &n_opens, "opens") : NULL;
    int64_t *plan = opens ? items(&views, a[6], 8, 1, &n_plan, "plan") : NULL;
    const int64_t *continued = plan && rows == 6 ? items(&views, a[7], 8, 0, &n_continued, "continued") : NULL;
    int64_t *current = NULL;
    if (!plan || (rows == 6 && !continued)) goto fail;
    if ((n_keys && n_keys != n) || (n_headers && n_headers != n) || n_ts != n || (n_groups && n_groups != n) ||
        n_opens != n || n_plan != rows * n || (continued && n_continued != 3 * group_count)) {
        PyErr_Format(PyExc_ValueError, "plan_batches: arrays of %zd rows (and continued of 3 x groups) expected", n);
        goto fail;
    }
    if (group_count < 1 || !(current = PyMem_Malloc(group_count * sizeof(int64_t)))) {
        if (group_count < 1) PyErr_SetString(PyExc_ValueError, "plan_batches: group_count must be at least 1");
        else PyErr_NoMemory();
        goto fail;
    }
    int64_t *batch_group = plan, *counts = plan + n, *sizes = plan + 2 * n, *base_ts = plan + 3 * n,
            *max_ts = plan + 4 * n, *first_offset = continued ? plan + 5 * n : NULL;
    Py_ssize_t batches = 0;
    Py_BEGIN_ALLOW_THREADS
    /* each group's open batch; -2: none yet, and the continued one still to look at */
    for (Py_ssize_t g = 0; g < group_count; g++) current[g] = continued && continued[g] > 0 ? -2 : -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t group = n_groups ? groups[i] : 0, ts = timestamps[i];
        /* attributes, key, value, headers: all but the two deltas */
        int64_t fixed = 1 + field_size(n_keys ? key_lengths[i] : -1) + field_size(value_lengths[i]) +
                        (n_headers ? header_sizes[i] : 1);
        int64_t batch = current[group], size = 0;
        if (batch == -2) { /* the group's first row: into the continued batch if it fits there */
            int64_t held = continued[group], held_bytes = continued[group_count + group];
            int64_t base = continued[2 * group_count + group];
            size = record_size(fixed, ts - base, held);
            batch = -1;
            if (held_bytes + size <= limit) {
                batch = batches++;
                current[group] = batch;
                batch_group[batch] = group;
                counts[batch] = held; /* while planning: the continued batch's, its own taken off below */
                sizes[batch] = held_bytes;
                base_ts[batch] = base;
                max_ts[batch] = ts;
                first_offset[batch] = held;
            }
        } else if (batch >= 0) {
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
            if (first_offset) first_offset[batch] = 0;
            size = record_size(fixed, 0, 0);
        }
        counts[batch]++;
        sizes[batch] += size;
        if (ts > max_ts[batch]) max_ts[batch] = ts;
    }
    for (Py_ssize_t b = 0; first_offset && b < batches; b++) {
        if (first_offset[b]) { /* a continuing batch: its own rows' count and bytes */
            counts[b] -= first_offset[b];
            sizes[b] -= continued[group_count + batch_group[b]];
        }
    }
    Py_END_ALLOW_THREADS
    PyMem_Free(current);
    release(&views);
    return PyLong_FromSsize_t(batches);
fail:
    release(&views);
    return NULL;
}

/* RecordBuffer (send()'s per-record path, below) here: write_records writes send_arrow's
   records straight into the spare room of one, past its end (see claim and commit). */
#define RECORD_BATCH_OVERHEAD 61

typedef struct {
    PyObject_HEAD
    uint8_t *data;
    Py_ssize_t len, cap;
    long long record_count, base_timestamp, max_timestamp, estimated_size, batch_size;
    int sealed;  /* take() was called: the bytes are final, read through the buffer protocol */
    int claimed; /* a writer holds the spare room past len: nothing else writes or moves the bytes */
    void *owner; /* the claim's owner (claim's argument), by identity: only it releases the claim */
    int pooled;  /* data is a block of the pool below (its size cap), given back there when freed */
} RecordBuffer;

static PyObject *RecordBuffer_type; /* set in PyInit */

/* Blocks of 64 KiB times a power of two, kept for the next RecordBuffer once freed, up to
   POOL_IDLE_MAX bytes of them idle. A batch's buffer lives until it is acknowledged; freed,
   a large block goes back to the kernel (malloc maps those apart), and a new one faults its
   pages in and has them cleared afresh, which costs more than writing the records (as for
   columnar.py's _RecycledBuffers). Smaller blocks come from malloc, which reuses those
   itself. Taken and given back with the GIL held (a RecordBuffer grows and dies only so). */
#define POOL_MIN ((Py_ssize_t)64 << 10)
#define POOL_CLASSES 16
#define POOL_IDLE_MAX ((Py_ssize_t)16 << 20)
static void *pool_free[POOL_CLASSES]; /* per class, a list linked through each block's first bytes */
static Py_ssize_t pool_idle;

static void release_data(RecordBuffer *self) {
    if (self->pooled && pool_idle + self->cap <= POOL_IDLE_MAX) {
        int c = 0;
        while ((POOL_MIN << c) < self->cap) c++;
        *(void **)self->data = pool_free[c];
        pool_free[c] = self->data;
        pool_idle += self->cap;
    } else {
        PyMem_Free(self->data);
    }
    self->data = NULL;
    self->pooled = 0;
}

/* A capacity of at least `cap` bytes (not below what it holds), the bytes held kept. */
static int set_capacity(RecordBuffer *self, Py_ssize_t cap) {
    if (cap < POOL_MIN) {
        uint8_t *data = PyMem_Realloc(self->data, (size_t)cap);
        if (!data) {
            PyErr_NoMemory();
            return 0;
        }
        self->data = data;
        self->cap = cap;
        return 1;
    }
    int c = 0;
    while (c < POOL_CLASSES - 1 && (POOL_MIN << c) < cap) c++;
    int pooled = (POOL_MIN << c) >= cap; /* past the largest class: a block of its own */
    Py_ssize_t size = pooled ? POOL_MIN << c : cap;
    uint8_t *data = NULL;
    /* The smallest idle block that fits: batches free larger blocks than they start with. */
    for (int k = c; pooled && k < POOL_CLASSES && !data; k++) {
        if ((data = pool_free[k])) {
            pool_free[k] = *(void **)data;
            size = POOL_MIN << k;
            pool_idle -= size;
        }
    }
    if (!data && !(data = PyMem_Malloc((size_t)size))) {
        PyErr_NoMemory();
        return 0;
    }
    if (self->len) memcpy(data, self->data, (size_t)self->len);
    release_data(self);
    self->data = data;
    self->cap = size;
    self->pooled = pooled;
    return 1;
}

/* Room for `room` bytes past the end of a claimed or new buffer, growing it by doubling up to
   `most` bytes (a batch that takes many calls' records is not copied each time). */
static int make_room(RecordBuffer *self, int64_t room, int64_t most) {
    if (self->len + room <= self->cap) return 1;
    Py_ssize_t cap = self->cap * 2 < most ? self->cap * 2 : (Py_ssize_t)most;
    if (cap < self->len + room) cap = (Py_ssize_t)(self->len + room);
    return set_capacity(self, cap);
}

PyDoc_STRVAR(write_records_doc,
"write_records(outs, opens, groups, keys, values, headers, timestamps, continued=None, targets=None,\n"
"              room=None, most=0)\n--\n\n"
"Write every row's record into its group's buffer (outs: one writable uint8 buffer, a\n"
"RecordBuffer (written past its end, into room it has), or None, per group, each at least\n"
"that group's bytes as plan_batches sized them), split into batches where opens (from\n"
"plan_batches) says. headers: (first_entry, end_entry, sizes, keys, values), each row's\n"
"range of entries, the bytes of its header section (empty sizes: no headers), and the\n"
"entries' key and value columns; continued as plan_batches had it. targets (with\n"
"continued; a list of a claimed RecordBuffer or None per group): a group's rows before its\n"
"first opening row (those continuing its batch: room, int64 per group, their bytes) go past\n"
"the end of its target instead, which grows to take them (doubling, up to most bytes); one\n"
"sealed meanwhile (the Sender took its batch) is replaced in the list by a new claimed\n"
"RecordBuffer holding them alone, as written; a target without any is released. Returns the\n"
"bytes written for each group, outs and targets together (int64 list).");

/* Rows ahead whose destination write_records asks the memory for (see there). */
#define WRITE_AHEAD 10

static PyObject *write_records(PyObject *self, PyObject *args) {
    PyObject *outs_o, *opens_o, *groups_o, *keys_o, *values_o, *first_o, *end_o, *sizes_o, *hkeys_o, *hvalues_o,
        *ts_o, *continued_o = NULL, *targets_o = NULL, *room_o = NULL, *written = NULL;
    Views views = {.count = 0};
    Column keys, values, hkeys, hvalues;
    Py_ssize_t group_count = 0, acquired = 0, n_opens, n_groups, n_first, n_end, n_sizes, n_ts, n_continued = 0,
               n_room = 0;
    long long most = 0;
    Py_buffer *out_views = NULL;
    uint8_t **out = NULL;
    int64_t *cursor = NULL, *cap = NULL, *in_batch = NULL, *base = NULL, *t_cursor = NULL, *t_cap = NULL;
    uint8_t **t_out = NULL;
    Py_ssize_t bad_row = -1; /* the row whose group is out of range or whose buffer is full, if any */
    if (!PyArg_ParseTuple(args, "OOOOO(OOOOO)O|OOOL", &outs_o, &opens_o, &groups_o, &keys_o, &values_o, &first_o,
                          &end_o, &sizes_o, &hkeys_o, &hvalues_o, &ts_o, &continued_o, &targets_o, &room_o, &most))
        return NULL;
    if (targets_o == Py_None) targets_o = NULL;
    if (!PyList_Check(outs_o)) {
        PyErr_SetString(PyExc_TypeError, "write_records: outs must be a list (a buffer or None per group)");
        return NULL;
    }
    group_count = PyList_Size(outs_o);
    if (targets_o && (!PyList_Check(targets_o) || PyList_Size(targets_o) != group_count ||
                      !continued_o || continued_o == Py_None || !room_o)) {
        PyErr_SetString(PyExc_TypeError, "write_records: targets must be a list as long as outs, with continued and room");
        return NULL;
    }
    const uint8_t *opens = items(&views, opens_o, 1, 0, &n_opens, "opens");
    const int64_t *groups = opens ? items(&views, groups_o, 8, 0, &n_groups, "groups") : NULL;
    const int32_t *first_entry = groups ? items(&views, first_o, 4, 0, &n_first, "headers") : NULL;
    const int32_t *end_entry = first_entry ? items(&views, end_o, 4, 0, &n_end, "headers") : NULL;
    const int64_t *header_sizes = end_entry ? items(&views, sizes_o, 8, 0, &n_sizes, "headers") : NULL;
    const int64_t *timestamps = header_sizes ? items(&views, ts_o, 8, 0, &n_ts, "timestamps") : NULL;
    const int64_t *continued = NULL, *room = NULL;
    if (timestamps && continued_o && continued_o != Py_None &&
        !(continued = items(&views, continued_o, 8, 0, &n_continued, "continued")))
        goto fail;
    if (timestamps && targets_o && !(room = items(&views, room_o, 8, 0, &n_room, "room"))) goto fail;
    if (!timestamps || !column(&views, keys_o, &keys, "keys") || !column(&views, values_o, &values, "values") ||
        !column(&views, hkeys_o, &hkeys, "header keys") || !column(&views, hvalues_o, &hvalues, "header values"))
        goto fail;
    Py_ssize_t n = values.rows;
    if ((keys.rows && keys.rows != n) || n_opens != n || (n_groups && n_groups != n) || n_ts != n ||
        (n_sizes && (n_sizes != n || n_first != n || n_end != n)) || group_count < 1 ||
        (continued && n_continued != 3 * group_count) || (room && n_room != group_count)) {
        PyErr_Format(PyExc_ValueError, "write_records: arrays of %zd rows and at least one group expected", n);
        goto fail;
    }
    out_views = PyMem_Calloc(group_count, sizeof(Py_buffer));
    out = PyMem_Calloc(group_count, sizeof(uint8_t *));
    cursor = PyMem_Calloc(group_count, sizeof(int64_t));   /* bytes written into each group's buffer */
    cap = PyMem_Calloc(group_count, sizeof(int64_t));      /* and its size */
    in_batch = PyMem_Calloc(group_count, sizeof(int64_t)); /* records so far in each group's batch */
    base = PyMem_Calloc(group_count, sizeof(int64_t));     /* and its first timestamp */
    if (targets_o) {
        t_out = PyMem_Calloc(group_count, sizeof(uint8_t *)); /* where a group's continuing rows go, if elsewhere */
        t_cursor = PyMem_Calloc(group_count, sizeof(int64_t));
        t_cap = PyMem_Calloc(group_count, sizeof(int64_t));
    }
    if (!out_views || !out || !cursor || !cap || !in_batch || !base || (targets_o && (!t_out || !t_cursor || !t_cap))) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t g = 0; targets_o && g < group_count; g++) {
        PyObject *target = PyList_GetItem(targets_o, g); /* borrowed: the list holds it through the call */
        if (target == Py_None) continue;
        RecordBuffer *rb = (RecordBuffer *)target;
        if (!PyObject_TypeCheck(target, (PyTypeObject *)RecordBuffer_type) || !rb->claimed) {
            PyErr_SetString(PyExc_TypeError, "write_records: a target must be a claimed RecordBuffer");
            goto fail;
        }
        if (!room[g]) {
            rb->claimed = 0; /* no row continues it */
            rb->owner = NULL;
            continue;
        }
        if (rb->sealed) { /* its batch was taken since the claim: a buffer of their own, moved later */
            PyObject *own = PyObject_CallFunction(RecordBuffer_type, "LL", rb->batch_size, (long long)room[g]);
            if (!own) goto fail;
            ((RecordBuffer *)own)->claimed = 1;
            PyList_SetItem(targets_o, g, own); /* steals own */
            rb = (RecordBuffer *)own;
        } else if (!make_room(rb, room[g], most)) {
            goto fail;
        }
        /* Past its end: the bytes there are no one's until commit, and a claimed buffer never
           moves them (nor does a sealed one, should the Sender seal it meanwhile). The GIL is
           held until the loop below: the Sender cannot seal it between the check and here. */
        t_out[g] = rb->data + rb->len;
        t_cap[g] = rb->cap - rb->len;
    }
    for (Py_ssize_t g = 0; continued && g < group_count; g++) { /* a group's first row may continue a batch */
        in_batch[g] = continued[g];
        base[g] = continued[2 * group_count + g];
    }
    for (; acquired < group_count; acquired++) {
        PyObject *buffer = PyList_GetItem(outs_o, acquired); /* borrowed */
        if (buffer == Py_None) continue; /* a group without rows */
        if (PyObject_TypeCheck(buffer, (PyTypeObject *)RecordBuffer_type)) { /* a new batch's: past its end */
            RecordBuffer *rb = (RecordBuffer *)buffer;
            if (rb->sealed) {
                PyErr_SetString(PyExc_BufferError, "write_records: a RecordBuffer in outs was sealed");
                goto fail;
            }
            out[acquired] = rb->data + rb->len;
            cap[acquired] = rb->cap - rb->len;
            continue;
        }
        Py_buffer *view = &out_views[acquired];
        if (PyObject_GetBuffer(buffer, view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) goto fail;
        out[acquired] = view->buf;
        cap[acquired] = view->len;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t group = n_groups ? groups[i] : 0;
        if (group < 0 || group >= group_count) {
            bad_row = i;
            break;
        }
        if (n_groups && i + WRITE_AHEAD < n) {
            /* The lines a row WRITE_AHEAD rows on will be written to, asked for now: with
               hundreds of groups each row lands in another buffer, too many write streams for
               the processor to see coming, and each record's copy waited for its lines (its
               first bytes mostly go on the line the group's last record ended on). */
            int64_t ahead = groups[i + WRITE_AHEAD];
            const uint8_t *at = NULL;
            if (ahead >= 0 && ahead < group_count)
                at = t_out && t_out[ahead] ? t_out[ahead] + t_cursor[ahead]
                                           : out[ahead] ? out[ahead] + cursor[ahead] : NULL;
            if (at) {
                __builtin_prefetch(at + 64, 1);
                __builtin_prefetch(at + 128, 1);
            }
        }
        if (opens[i]) {
            in_batch[group] = 0;
            base[group] = timestamps[i];
            if (t_out) t_out[group] = NULL; /* the group's continuation, if any, is over */
        }
        int64_t offset_delta = in_batch[group]++;
        int64_t timestamp_delta = timestamps[i] - base[group];
        int64_t key_length = keys.rows ? keys.lengths[i] : -1, value_length = values.lengths[i];
        int64_t fixed = 1 + field_size(key_length) + field_size(value_length) + (n_sizes ? header_sizes[i] : 1);
        int64_t body = fixed + varint_size(timestamp_delta) + varint_size(offset_delta);
        int into_target = t_out && t_out[group];
        int64_t *at = into_target ? &t_cursor[group] : &cursor[group];
        if (*at + varint_size(body) + body > (into_target ? t_cap[group] : cap[group])) {
            bad_row = i;
            break;
        }
        uint8_t *pos = (into_target ? t_out[group] : out[group]) + *at;
        pos = put_varint(pos, body);
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
        *at = pos - (into_target ? t_out[group] : out[group]);
    }
    Py_END_ALLOW_THREADS
    if (bad_row >= 0) {
        PyErr_Format(PyExc_ValueError, "write_records: row %zd: its group is outside outs or its buffer is full",
                     bad_row);
        goto fail;
    }
    if (!(written = PyList_New(group_count))) goto fail;
    for (Py_ssize_t g = 0; g < group_count; g++) {
        PyObject *count = PyLong_FromLongLong(cursor[g] + (t_cursor ? t_cursor[g] : 0));
        if (!count) goto fail;
        PyList_SetItem(written, g, count); /* steals count */
    }
    goto done;
fail:
    Py_CLEAR(written);
done:
    for (Py_ssize_t g = 0; g < acquired; g++)
        if (out_views[g].obj) PyBuffer_Release(&out_views[g]);
    PyMem_Free(out_views);
    PyMem_Free(out);
    PyMem_Free(cursor);
    PyMem_Free(cap);
    PyMem_Free(in_batch);
    PyMem_Free(base);
    PyMem_Free(t_out);
    PyMem_Free(t_cursor);
    PyMem_Free(t_cap);
    release(&views);
    return written;
}

/* A zigzag varint at *pos, before end: its value, *pos moved past it; 0 with *ok cleared
   if it runs past end or past 10 bytes. */
static inline int64_t get_varint(const uint8_t **pos, const uint8_t *end, int *ok) {
    uint64_t u = 0;
    for (int shift = 0; shift < 70 && *pos < end; shift += 7) {
        uint8_t b = *(*pos)++;
        u |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) return (int64_t)(u >> 1) ^ -(int64_t)(u & 1);
    }
    *ok = 0;
    return 0;
}

/* One pass over a records section: with out NULL, the bytes it takes once its records'
   offset deltas are moved by offset_shift and timestamp deltas by ts_shift; else writes it
   there. -1 if the section is not whole records. */
static int64_t move_records(const uint8_t *pos, const uint8_t *end, int64_t offset_shift, int64_t ts_shift,
                            uint8_t *out) {
    int64_t total = 0;
    int ok = 1;
    while (pos < end) {
        int64_t length = get_varint(&pos, end, &ok);
        if (!ok || length < 1 || length > end - pos) return -1;
        const uint8_t *body = pos, *body_end = pos + length;
        pos++; /* attributes */
        int64_t ts_delta = get_varint(&pos, body_end, &ok);
        int64_t offset_delta = get_varint(&pos, body_end, &ok);
        if (!ok) return -1;
        int64_t rest = body_end - pos;
        int64_t new_ts = ts_delta + ts_shift, new_offset = offset_delta + offset_shift;
        int64_t new_body = 1 + varint_size(new_ts) + varint_size(new_offset) + rest;
        if (out) {
            uint8_t *w = out + total;
            w = put_varint(w, new_body);
            *w++ = *body;
            w = put_varint(w, new_ts);
            w = put_varint(w, new_offset);
            memcpy(w, pos, (size_t)rest);
        }
        total += varint_size(new_body) + new_body;
        pos = body_end;
    }
    return total;
}

/* Kafka's murmur2 (MurmurHash2) of one value, unsigned. */
static inline uint32_t murmur2(const uint8_t *p, Py_ssize_t length, uint32_t seed) {
    const uint32_t m = 0x5BD1E995;
    uint32_t h = seed ^ (uint32_t)length;
    for (Py_ssize_t i = 0; i + 4 <= length; i += 4, p += 4) {
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
    return h;
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
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t row = 0; row < n; row++) {
        int32_t length = n_nulls && nulls[row] ? 0 : offsets[row + 1] - offsets[row];
        out[row] = murmur2(data + offsets[row], length, (uint32_t)seed);
    }
    Py_END_ALLOW_THREADS
    release(&views);
    Py_RETURN_NONE;
fail:
    release(&views);
    return NULL;
}

/* ---- send()'s per-record path ------------------------------------------------------

   RecordBuffer: the records section of one open producer batch, written record by record
   as send() appends them (producer/batch.py holds the same in Python where this extension
   is not built). PlainAppender: RecordAccumulator.append_plain in C, send()'s common record
   (bytes key and value, no headers) appended to its partition's open batch without a
   Python frame, and without an object per piece of the record. PlainSender: the whole of send()'s short way, from the
   ProducerRecord to its future. run_callbacks: an acknowledged batch's callbacks. All of
   them hold the GIL throughout: each call is far shorter than a switch would cost.
   tests/producer/test_batch.py checks the bytes against the reference encoder, both ways. */

/* Room for `more` bytes; grown by doubling, up to batch.size first (most batches end there). */
static int reserve(RecordBuffer *self, Py_ssize_t more) {
    if (self->sealed || self->claimed) {
        PyErr_SetString(PyExc_BufferError, self->sealed ? "RecordBuffer: no record can follow take()"
                                                        : "RecordBuffer: a writer holds its room (claim)");
        return 0;
    }
    if (self->len + more <= self->cap) return 1;
    Py_ssize_t cap = self->cap ? self->cap * 2 : 1024;
    if (cap < self->batch_size && self->batch_size <= (1 << 20)) cap = (Py_ssize_t)self->batch_size;
    while (cap < self->len + more) cap *= 2;
    return set_capacity(self, cap);
}

static PyObject *RecordBuffer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    long long batch_size, capacity = 0;
    if (kwargs && PyObject_Length(kwargs) > 0) {
        PyErr_SetString(PyExc_TypeError, "RecordBuffer(batch_size, capacity=0) takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "L|L", &batch_size, &capacity)) return NULL;
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    RecordBuffer *self = (RecordBuffer *)alloc(type, 0);
    if (!self) return NULL;
    self->data = NULL;
    self->len = self->cap = 0;
    self->record_count = 0;
    self->base_timestamp = self->max_timestamp = -1;
    self->estimated_size = RECORD_BATCH_OVERHEAD;
    self->batch_size = batch_size;
    self->sealed = 0;
    self->claimed = 0;
    self->owner = NULL;
    self->pooled = 0;
    if (capacity > 0 && !make_room(self, capacity, capacity)) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void RecordBuffer_dealloc(RecordBuffer *self) {
    PyTypeObject *type = Py_TYPE((PyObject *)self);
    release_data(self);
    freefunc free_ = (freefunc)PyType_GetSlot(type, Py_tp_free);
    free_(self);
    Py_DECREF(type);
}

/* One record whose fields are known: its bytes at the buffer's end, or 0 (and nothing
   written) when it does not fit batch.size behind the records already there; -1 on error.
   key_len / value_len -1: null. headers: n pairs (key bytes, key length, value, length). */
typedef struct {
    const char *key;
    Py_ssize_t key_len;
    const char *value;
    Py_ssize_t value_len;
} HeaderField;

static Py_ssize_t put_record(RecordBuffer *self, long long timestamp, const char *key, Py_ssize_t key_len,
                             const char *value, Py_ssize_t value_len, const HeaderField *headers,
                             Py_ssize_t n_headers) {
    long long index = self->record_count;
    long long base = index ? self->base_timestamp : timestamp;
    int64_t body = 1 + varint_size(timestamp - base) + varint_size(index) + field_size(key_len) +
                   field_size(value_len) + varint_size(n_headers);
    for (Py_ssize_t h = 0; h < n_headers; h++)
        body += field_size(headers[h].key_len) + field_size(headers[h].value_len);
    int64_t size = body + varint_size(body);
    if (index && self->estimated_size + size > self->batch_size) return 0;
    if (!reserve(self, (Py_ssize_t)size)) return -1;
    uint8_t *pos = self->data + self->len;
    pos = put_varint(pos, body);
    *pos++ = 0; /* attributes */
    pos = put_varint(pos, timestamp - base);
    pos = put_varint(pos, index);
    pos = put_field(pos, (const uint8_t *)key, key_len);
    pos = put_field(pos, (const uint8_t *)value, value_len);
    pos = put_varint(pos, n_headers);
    for (Py_ssize_t h = 0; h < n_headers; h++) {
        pos = put_field(pos, (const uint8_t *)headers[h].key, headers[h].key_len);
        pos = put_field(pos, (const uint8_t *)headers[h].value, headers[h].value_len);
    }
    self->len += (Py_ssize_t)size;
    self->record_count = index + 1;
    self->estimated_size += size;
    if (!index) self->base_timestamp = self->max_timestamp = timestamp;
    else if (timestamp > self->max_timestamp) self->max_timestamp = timestamp;
    return (Py_ssize_t)size;
}

/* bytes or None: its data and length (-1: None); 0 with an error set otherwise. */
static int bytes_field(PyObject *obj, const char **data, Py_ssize_t *len, const char *what) {
    if (obj == Py_None) {
        *data = NULL;
        *len = -1;
        return 1;
    }
    char *buf;
    if (!PyBytes_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "RecordBuffer.append: %s must be bytes or None", what);
        return 0;
    }
    if (PyBytes_AsStringAndSize(obj, &buf, len) < 0) return 0;
    *data = buf;
    return 1;
}

PyDoc_STRVAR(RecordBuffer_append_doc,
"append(timestamp, key, value, headers) -> int\n--\n\n"
"Write one record (key and value bytes or None; headers None or (str, bytes | None) pairs)\n"
"after the others: the bytes it took, or 0 when it would take the batch past batch.size\n"
"(the first record always fits).");

static PyObject *RecordBuffer_append(RecordBuffer *self, PyObject *args) {
    long long timestamp;
    PyObject *key_o, *value_o, *headers_o;
    const char *key, *value;
    Py_ssize_t key_len, value_len, n_headers = 0, size = -1;
    HeaderField *headers = NULL;
    PyObject *seq = NULL;
    if (!PyArg_ParseTuple(args, "LOOO", &timestamp, &key_o, &value_o, &headers_o)) return NULL;
    if (!bytes_field(key_o, &key, &key_len, "key") || !bytes_field(value_o, &value, &value_len, "value"))
        return NULL;
    if (headers_o != Py_None) {
        if (!(seq = PySequence_Fast(headers_o, "RecordBuffer.append: headers must be a sequence of pairs")))
            return NULL;
        n_headers = PySequence_Size(seq);
        if (n_headers < 0 || !(headers = PyMem_Calloc(n_headers ? n_headers : 1, sizeof(HeaderField)))) {
            if (n_headers >= 0) PyErr_NoMemory();
            goto done;
        }
        for (Py_ssize_t h = 0; h < n_headers; h++) {
            PyObject *pair = PySequence_GetItem(seq, h), *hkey = NULL, *hvalue = NULL;
            int ok = pair && PySequence_Size(pair) == 2 && (hkey = PySequence_GetItem(pair, 0)) &&
                     (hvalue = PySequence_GetItem(pair, 1)) && PyUnicode_Check(hkey) &&
                     (headers[h].key = PyUnicode_AsUTF8AndSize(hkey, &headers[h].key_len)) &&
                     bytes_field(hvalue, &headers[h].value, &headers[h].value_len, "a header's value");
            /* The strings live on in the pairs of `seq`, held until the record is written. */
            Py_XDECREF(hkey);
            Py_XDECREF(hvalue);
            Py_XDECREF(pair);
            if (!ok) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_TypeError, "RecordBuffer.append: each header must be a (str, bytes | None) pair");
                goto done;
            }
        }
    }
    size = put_record(self, timestamp, key, key_len, value, value_len, headers, n_headers);
done:
    PyMem_Free(headers);
    Py_XDECREF(seq);
    return size < 0 ? NULL : PyLong_FromSsize_t(size);
}

PyDoc_STRVAR(RecordBuffer_take_doc,
"take() -> memoryview\n--\n\nThe records section: a read-only view of the buffer's bytes, not a copy (the\n"
"buffer lives as long as the view). No record can be added after it.");

static PyObject *RecordBuffer_take(RecordBuffer *self, PyObject *unused) {
    self->sealed = 1;
    return PyMemoryView_FromObject((PyObject *)self);
}

/* The buffer protocol, once take() has made the bytes final: they never move or change
   again, and are freed with the buffer, which every view holds. */
static int RecordBuffer_getbuffer(RecordBuffer *self, Py_buffer *view, int flags) {
    static char empty;
    if (!self->sealed) {
        PyErr_SetString(PyExc_BufferError, "RecordBuffer: its bytes are read after take()");
        view->obj = NULL;
        return -1;
    }
    return PyBuffer_FillInfo(view, (PyObject *)self, self->data ? (void *)self->data : (void *)&empty, self->len, 1,
                             flags);
}

PyDoc_STRVAR(RecordBuffer_append_section_doc,
"append_section(payload, count, base_timestamp, max_timestamp, limit, first_offset=0) -> int\n--\n\n"
"The records of an uncompressed records section (count records, their offset deltas from\n"
"first_offset on, their timestamp deltas from base_timestamp, max_timestamp the largest)\n"
"after those here, their deltas moved onto this batch's: the bytes they took, or 0 (nothing\n"
"written) if the batch would then be larger than limit bytes, header included, and already\n"
"holds records. A section that continues this batch as it is (first_offset its record\n"
"count, base_timestamp its first timestamp: plan_batches' continued) is copied as it is.\n"
"Into an empty buffer, the first record's timestamp becomes the batch's first timestamp.\n"
"ValueError if payload is not whole records.");

/* append_section's work on the records [start, end): the bytes taken, 0 if they do not
   fit limit behind records already there, -1 with an error set. */
static int64_t append_records(RecordBuffer *self, const uint8_t *start, const uint8_t *end, long long count,
                              long long base, long long largest, long long limit, long long first_offset) {
    int64_t offset_shift = self->record_count - first_offset, ts_shift = 0;
    if (self->record_count) {
        ts_shift = base - self->base_timestamp;
    } else if (end > start) { /* the first record's timestamp delta becomes 0: read it */
        const uint8_t *pos = start;
        int ok = 1;
        get_varint(&pos, end, &ok); /* length */
        pos++;                      /* attributes */
        int64_t first_delta = pos < end ? get_varint(&pos, end, &ok) : 0;
        if (!ok || pos > end) {
            PyErr_SetString(PyExc_ValueError, "append_section: the payload is not a records section of whole records");
            return -1;
        }
        base += first_delta;
        ts_shift = -first_delta;
    }
    /* The GIL held: a section is a partition's share of one call, small, and moved under
       the accumulator's lock, which is what the other threads would wait for. */
    int64_t size = offset_shift || ts_shift ? move_records(start, end, offset_shift, ts_shift, NULL) : end - start;
    if (size < 0) {
        PyErr_SetString(PyExc_ValueError, "append_section: the payload is not a records section of whole records");
        return -1;
    }
    if (self->record_count && self->estimated_size + size > limit) return 0;
    if (self->sealed || self->claimed) {
        PyErr_SetString(PyExc_BufferError, self->sealed ? "RecordBuffer: no record can follow take()"
                                                        : "RecordBuffer: a writer holds its room (claim)");
        return -1;
    }
    if (self->len + size > self->cap) {
        /* Four times what it holds, up to the limit: a batch joined from a call's share of
           each partition takes many sections, and each growth may copy it (realloc). */
        Py_ssize_t cap = self->cap * 4 < limit ? self->cap * 4 : (Py_ssize_t)limit;
        if (cap < self->len + size) cap = (Py_ssize_t)(self->len + size);
        if (!set_capacity(self, cap)) return -1;
    }
    if (offset_shift || ts_shift)
        move_records(start, end, offset_shift, ts_shift, self->data + self->len);
    else
        memcpy(self->data + self->len, start, (size_t)size);
    if (!self->record_count) self->base_timestamp = self->max_timestamp = base;
    if (largest > self->max_timestamp) self->max_timestamp = largest;
    self->len += (Py_ssize_t)size;
    self->record_count += count;
    self->estimated_size += size;
    return size;
}

static PyObject *RecordBuffer_append_section(RecordBuffer *self, PyObject *args) {
    Py_buffer view;
    long long count, base, largest, limit, first_offset = 0;
    if (!PyArg_ParseTuple(args, "y*LLLL|L", &view, &count, &base, &largest, &limit, &first_offset)) return NULL;
    const uint8_t *start = view.buf;
    int64_t size = append_records(self, start, start + view.len, count, base, largest, limit, first_offset);
    PyBuffer_Release(&view);
    return size < 0 ? NULL : PyLong_FromLongLong(size);
}

PyDoc_STRVAR(RecordBuffer_claim_doc,
"claim(owner=None) -> (record count, records section bytes, first timestamp) or None\n--\n\n"
"Hold the room past the buffer's end for one writer (write_records' targets), until commit,\n"
"pending or release(owner): nothing else writes there or moves the buffer's bytes meanwhile\n"
"(take() still may seal it: it hands out only what is before the end). Returns what the\n"
"writer's records continue (plan_batches' continued), None if it is sealed or claimed\n"
"already. Under the accumulator's lock for a queued batch's buffer.");

static PyObject *RecordBuffer_claim(RecordBuffer *self, PyObject *args) {
    PyObject *owner = Py_None;
    if (!PyArg_ParseTuple(args, "|O", &owner)) return NULL;
    if (self->sealed || self->claimed) Py_RETURN_NONE;
    self->claimed = 1;
    self->owner = owner;
    return Py_BuildValue("(LnL)", self->record_count, self->len, self->base_timestamp);
}

PyDoc_STRVAR(RecordBuffer_release_doc,
"release(owner) -> bool\n--\n\n"
"End a claim that owner (the same object) made and nothing committed: its writer gave up\n"
"(the send_arrow call raised). False, nothing changed, if the buffer is not claimed by\n"
"owner (committed, moved, or claimed since by another writer).");

static PyObject *RecordBuffer_release(RecordBuffer *self, PyObject *owner) {
    if (!self->claimed || self->owner != (void *)owner) Py_RETURN_FALSE;
    self->claimed = 0;
    self->owner = NULL;
    Py_RETURN_TRUE;
}

PyDoc_STRVAR(RecordBuffer_commit_doc,
"commit(size, count, base_timestamp, max_timestamp)\n--\n\n"
"The size bytes a writer put past the end (count records, written as this batch's next:\n"
"their offset deltas from its record count on, their timestamp deltas from its first\n"
"timestamp, which base_timestamp is if it holds none) become the buffer's last records; the\n"
"claim ends. BufferError if it was sealed meanwhile (see pending).");

static PyObject *RecordBuffer_commit(RecordBuffer *self, PyObject *args) {
    long long size, count, base, largest;
    if (!PyArg_ParseTuple(args, "LLLL", &size, &count, &base, &largest)) return NULL;
    if (self->sealed || size < 0 || size > self->cap - self->len) {
        PyErr_SetString(PyExc_BufferError, self->sealed ? "RecordBuffer.commit: sealed meanwhile"
                                                        : "RecordBuffer.commit: more bytes than its room");
        return NULL;
    }
    if (!self->record_count) self->base_timestamp = self->max_timestamp = base;
    if (largest > self->max_timestamp) self->max_timestamp = largest;
    self->len += (Py_ssize_t)size;
    self->record_count += count;
    self->estimated_size += size;
    self->claimed = 0;
    self->owner = NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(RecordBuffer_pending_doc,
"pending(size) -> bytes\n--\n\n"
"A copy of the size bytes a writer put past the end, for a batch of their own (the batch\n"
"they continued was sent or failed meanwhile); the claim ends.");

static PyObject *RecordBuffer_pending(RecordBuffer *self, PyObject *args) {
    long long size;
    if (!PyArg_ParseTuple(args, "L", &size)) return NULL;
    if (size < 0 || size > self->cap - self->len) {
        PyErr_SetString(PyExc_ValueError, "RecordBuffer.pending: more bytes than its room");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize((const char *)self->data + self->len, (Py_ssize_t)size);
    if (out) {
        self->claimed = 0;
        self->owner = NULL;
    }
    return out;
}

#define GETTER(name)                                                                        \
    static PyObject *RecordBuffer_get_##name(RecordBuffer *self, void *closure) {                \
        return PyLong_FromLongLong(self->name);                                                  \
    }
GETTER(record_count)
GETTER(base_timestamp)
GETTER(max_timestamp)
GETTER(estimated_size)
GETTER(batch_size)
GETTER(claimed)

static PyGetSetDef RecordBuffer_getset[] = {
    {"record_count", (getter)RecordBuffer_get_record_count, NULL, "records written", NULL},
    {"base_timestamp", (getter)RecordBuffer_get_base_timestamp, NULL, "the first record's timestamp (-1: none yet)", NULL},
    {"max_timestamp", (getter)RecordBuffer_get_max_timestamp, NULL, "the largest timestamp (-1: none yet)", NULL},
    {"estimated_size", (getter)RecordBuffer_get_estimated_size, NULL, "the batch's size: header and records", NULL},
    {"batch_size", (getter)RecordBuffer_get_batch_size, NULL, "batch.size", NULL},
    {"claimed", (getter)RecordBuffer_get_claimed, NULL, "1 while a writer holds the room past its end", NULL},
    {NULL},
};

static PyMethodDef RecordBuffer_methods[] = {
    {"append", (PyCFunction)RecordBuffer_append, METH_VARARGS, RecordBuffer_append_doc},
    {"take", (PyCFunction)RecordBuffer_take, METH_NOARGS, RecordBuffer_take_doc},
    {"append_section", (PyCFunction)RecordBuffer_append_section, METH_VARARGS, RecordBuffer_append_section_doc},
    {"claim", (PyCFunction)RecordBuffer_claim, METH_VARARGS, RecordBuffer_claim_doc},
    {"release", (PyCFunction)RecordBuffer_release, METH_O, RecordBuffer_release_doc},
    {"commit", (PyCFunction)RecordBuffer_commit, METH_VARARGS, RecordBuffer_commit_doc},
    {"pending", (PyCFunction)RecordBuffer_pending, METH_VARARGS, RecordBuffer_pending_doc},
    {NULL},
};

static PyType_Slot RecordBuffer_slots[] = {
    {Py_tp_new, RecordBuffer_new},
    {Py_tp_dealloc, RecordBuffer_dealloc},
    {Py_tp_getset, RecordBuffer_getset},
    {Py_tp_methods, RecordBuffer_methods},
    {Py_bf_getbuffer, RecordBuffer_getbuffer},
    {Py_tp_doc, "RecordBuffer(batch_size, capacity=0): the records section of an open producer batch, written as records "
                "come (or by write_records, past its end: see claim and commit)."},
    {0, NULL},
};

static PyType_Spec RecordBuffer_spec = {
    .name = "spark_sink.encoder._kernels.RecordBuffer",
    .basicsize = sizeof(RecordBuffer),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = RecordBuffer_slots,
};

/* ---- FutureRecordMetadata --------------------------------------------------------

   send()'s result, one per record: (batch, index in it, timestamp, key size, value size),
   read as a sequence of five by the methods producer/batch.py gives the type (result(),
   metadata(), ...; a tuple subclass there where this extension is not built). Its own
   type rather than a tuple subclass: made and freed per record, it keeps a few freed
   ones for the next records instead of a tuple subclass's generic allocation and
   deallocation (50 ns of a 340 ns send()). */

#define FUTURE_FIELDS 5
#define FUTURE_FREE_MAX 64

typedef struct {
    PyObject_HEAD
    PyObject *fields[FUTURE_FIELDS];
} Future;

static PyObject *Future_type;
static Future *future_free[FUTURE_FREE_MAX];
static int future_nfree;

/* A future whose fields are yet to be set (NULL), tracked by the GC. */
static Future *future_empty(void) {
    Future *f;
    if (future_nfree) {
        f = future_free[--future_nfree];
        PyObject_Init((PyObject *)f, (PyTypeObject *)Future_type); /* a reference to the type again */
    } else if (!(f = PyObject_GC_New(Future, (PyTypeObject *)Future_type))) {
        return NULL;
    }
    for (int i = 0; i < FUTURE_FIELDS; i++) f->fields[i] = NULL;
    PyObject_GC_Track((PyObject *)f);
    return f;
}

static void Future_dealloc(Future *self) {
    PyTypeObject *type = Py_TYPE((PyObject *)self);
    PyObject_GC_UnTrack(self);
    for (int i = 0; i < FUTURE_FIELDS; i++) Py_CLEAR(self->fields[i]);
    if (type == (PyTypeObject *)Future_type && future_nfree < FUTURE_FREE_MAX) future_free[future_nfree++] = self;
    else PyObject_GC_Del(self);
    Py_DECREF(type);
}

static int Future_traverse(Future *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE((PyObject *)self));
    for (int i = 0; i < FUTURE_FIELDS; i++) Py_VISIT(self->fields[i]);
    return 0;
}

static int Future_clear(Future *self) {
    for (int i = 0; i < FUTURE_FIELDS; i++) Py_CLEAR(self->fields[i]);
    return 0;
}

static PyObject *Future_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    if ((kwargs && PyObject_Length(kwargs) > 0) || PyTuple_Size(args) != FUTURE_FIELDS) {
        PyErr_SetString(PyExc_TypeError,
                        "FutureRecordMetadata(batch, index, timestamp, key_size, value_size) takes 5 arguments");
        return NULL;
    }
    Future *f = future_empty();
    if (!f) return NULL;
    for (int i = 0; i < FUTURE_FIELDS; i++) f->fields[i] = Py_NewRef(PyTuple_GetItem(args, i));
    return (PyObject *)f;
}

static Py_ssize_t Future_length(Future *self) { return FUTURE_FIELDS; }

static PyObject *Future_item(Future *self, Py_ssize_t i) {
    if (i < 0 || i >= FUTURE_FIELDS) {
        PyErr_SetString(PyExc_IndexError, "FutureRecordMetadata index out of range");
        return NULL;
    }
    return Py_NewRef(self->fields[i] ? self->fields[i] : Py_None);
}

static PyType_Slot Future_slots[] = {
    {Py_tp_new, Future_new},
    {Py_tp_dealloc, Future_dealloc},
    {Py_tp_traverse, Future_traverse},
    {Py_tp_clear, Future_clear},
    {Py_sq_length, Future_length},
    {Py_sq_item, Future_item},
    {Py_tp_doc, "The result of one send(): result(timeout) returns RecordMetadata or raises."},
    {0, NULL},
};

static PyType_Spec Future_spec = {
    .name = "spark_sink.producer.batch.FutureRecordMetadata",
    .basicsize = sizeof(Future),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = Future_slots,
};

/* Attribute names, interned once. */
static PyObject *str_on_ready, *str_closed, *str_records, *str_callbacks;

/* An attribute of objects of one exact class with __slots__ (ProducerRecord,
   ProducerBatch), read through its member descriptor: without the class lookup a
   getattr makes each time. Objects of any other class are read by name. */
typedef struct {
    PyObject *type, *name, *descr;
    descrgetfunc get;
} Slot;

static int slot_init(Slot *slot, PyObject *type, PyObject *name) {
    slot->type = Py_NewRef(type);
    slot->name = Py_NewRef(name);
    slot->descr = PyObject_GetAttr(type, name); /* a class's member descriptor is itself */
    if (!slot->descr) return 0;
    slot->get = (descrgetfunc)PyType_GetSlot(Py_TYPE(slot->descr), Py_tp_descr_get);
    return 1;
}

static inline PyObject *slot_read(const Slot *slot, PyObject *obj) {
    if (slot->get && Py_TYPE(obj) == (PyTypeObject *)slot->type) return slot->get(slot->descr, obj, slot->type);
    return PyObject_GetAttr(obj, slot->name);
}

static int slot_traverse(Slot *slot, visitproc visit, void *arg) {
    Py_VISIT(slot->type);
    Py_VISIT(slot->name);
    Py_VISIT(slot->descr);
    return 0;
}

static void slot_clear(Slot *slot) {
    Py_CLEAR(slot->type);
    Py_CLEAR(slot->name);
    Py_CLEAR(slot->descr);
}

typedef struct {
    PyObject_HEAD
    PyObject *accumulator;  /* for on_ready, read when needed */
    PyObject *by_topic;     /* {topic: {partition: deque of batches}} */
    PyObject *acquire, *release, *locked; /* the accumulator lock's */
    Slot closed, records, callbacks; /* of ProducerBatch */
    int stopped; /* the accumulator's stop() was called */
    PyObject *last_topic, *last_partitions; /* by_topic's last entry used: most records go to one topic */
} PlainAppender;

static PyObject *PlainAppender_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *accumulator, *by_topic, *lock, *future_type, *batch_type;
    if (kwargs && PyObject_Length(kwargs) > 0) {
        PyErr_SetString(PyExc_TypeError, "PlainAppender() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OO!OO!O!", &accumulator, &PyDict_Type, &by_topic, &lock, &PyType_Type, &future_type,
                          &PyType_Type, &batch_type))
        return NULL;
    if (future_type != Future_type) {
        PyErr_SetString(PyExc_TypeError, "PlainAppender: the future type must be this module's FutureRecordMetadata");
        return NULL;
    }
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    PlainAppender *self = (PlainAppender *)alloc(type, 0);
    if (!self) return NULL;
    self->acquire = PyObject_GetAttrString(lock, "acquire");
    self->release = self->acquire ? PyObject_GetAttrString(lock, "release") : NULL;
    self->locked = self->release ? PyObject_GetAttrString(lock, "locked") : NULL;
    if (!self->locked || !slot_init(&self->closed, batch_type, str_closed) ||
        !slot_init(&self->records, batch_type, str_records) || !slot_init(&self->callbacks, batch_type, str_callbacks)) {
        Py_DECREF(self);
        return NULL;
    }
    self->accumulator = Py_NewRef(accumulator);
    self->by_topic = Py_NewRef(by_topic);
    self->stopped = 0;
    self->last_topic = self->last_partitions = NULL;
    return (PyObject *)self;
}

static int PlainAppender_traverse(PlainAppender *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE((PyObject *)self));
    Py_VISIT(self->accumulator);
    Py_VISIT(self->by_topic);
    Py_VISIT(self->acquire);
    Py_VISIT(self->release);
    Py_VISIT(self->locked);
    Py_VISIT(self->last_topic);
    Py_VISIT(self->last_partitions);
    return slot_traverse(&self->closed, visit, arg) || slot_traverse(&self->records, visit, arg) ||
           slot_traverse(&self->callbacks, visit, arg);
}

static int PlainAppender_clear(PlainAppender *self) {
    Py_CLEAR(self->accumulator);
    Py_CLEAR(self->by_topic);
    Py_CLEAR(self->acquire);
    Py_CLEAR(self->release);
    Py_CLEAR(self->locked);
    Py_CLEAR(self->last_topic);
    Py_CLEAR(self->last_partitions);
    slot_clear(&self->closed);
    slot_clear(&self->records);
    slot_clear(&self->callbacks);
    return 0;
}

static void PlainAppender_dealloc(PlainAppender *self) {
    PyTypeObject *type = Py_TYPE((PyObject *)self);
    PyObject_GC_UnTrack(self);
    PlainAppender_clear(self);
    freefunc free_ = (freefunc)PyType_GetSlot(type, Py_tp_free);
    free_(self);
    Py_DECREF(type);
}

/* The partition's open batch and its RecordBuffer (new references), 0 if there is none to
   append to (no batch, a closed one, one without a RecordBuffer), -1 on error. Called
   with the lock held (or, see append_plain, while no thread holds it). */
static int open_batch(PlainAppender *self, PyObject *topic, PyObject *partition, PyObject **batch,
                      RecordBuffer **records) {
    /* by_topic's entries are never replaced or removed (the accumulator's _deque): the
       last one found holds for the same topic. */
    PyObject *partitions = self->last_partitions;
    if (topic != self->last_topic || !partitions) {
        partitions = PyDict_GetItemWithError(self->by_topic, topic); /* borrowed */
        if (!partitions) return PyErr_Occurred() ? -1 : 0;
        Py_XDECREF(self->last_topic); /* a str, and a dict by_topic still holds: no Python code */
        Py_XDECREF(self->last_partitions);
        self->last_topic = Py_NewRef(topic);
        self->last_partitions = Py_NewRef(partitions);
    }
    PyObject *dq = PyDict_GetItemWithError(partitions, partition);
    if (!dq) return PyErr_Occurred() ? -1 : 0;
    Py_ssize_t n = PyObject_Length(dq);
    if (n <= 0) return n < 0 ? -1 : 0;
    PyObject *last = PySequence_GetItem(dq, n - 1);
    if (!last) return -1;
    PyObject *closed = slot_read(&self->closed, last);
    int is_closed = closed ? PyObject_IsTrue(closed) : -1;
    Py_XDECREF(closed);
    PyObject *buffer = is_closed == 0 ? slot_read(&self->records, last) : NULL;
    if (!buffer) {
        Py_DECREF(last);
        return is_closed == 1 ? 0 : -1;
    }
    if (!PyObject_TypeCheck(buffer, (PyTypeObject *)RecordBuffer_type)) {
        Py_DECREF(buffer);
        Py_DECREF(last);
        return 0;
    }
    *batch = last;
    *records = (RecordBuffer *)buffer;
    return 1;
}

PyDoc_STRVAR(PlainAppender_append_doc,
"append(topic, partition, timestamp, key, value, callback, key_size, value_size)\n--\n\n"
"RecordAccumulator.append_plain: a header-less record with bytes key and value appended to\n"
"its partition's open batch, returning its future (having called the accumulator's on_ready\n"
"if the record filled its batch); None when it needs append() (no open batch with room for\n"
"it, or the producer has stopped).");

/* append() below, for arguments already checked: key and value exact bytes. */
/* ts: timestamp as an int (borrowed), or NULL to make one. */
static PyObject *append_plain(PlainAppender *self, PyObject *topic, PyObject *partition, long long timestamp,
                              PyObject *ts, PyObject *key_o, PyObject *value_o, PyObject *callback,
                              PyObject *key_size, PyObject *value_size) {
    char *key, *value;
    Py_ssize_t key_len, value_len;
    if (PyBytes_AsStringAndSize(key_o, &key, &key_len) < 0 || PyBytes_AsStringAndSize(value_o, &value, &value_len) < 0)
        return NULL;
    /* The future before the section below: an allocation of an object the cyclic GC
       tracks may run a collection, and with it finalizers (Python code). */
    Future *future = future_empty();
    if (!future) return NULL;
    /* The accumulator's lock is taken only if some thread holds it. Otherwise no thread
       can take it before this call returns: the section below holds the GIL throughout
       (it runs no Python code and allocates nothing the GC tracks), and a thread that
       takes the lock meanwhile, blocked in acquire() without the GIL, goes on only once
       it has the GIL again, after the section: the same order as if this call had taken
       the lock first. Checking costs a sixth of acquire() (which parses its arguments). */
    PyObject *held = PyObject_CallNoArgs(self->locked);
    int locked = held ? PyObject_IsTrue(held) : -1;
    Py_XDECREF(held);
    if (locked > 0) {
        PyObject *acquired = PyObject_CallNoArgs(self->acquire);
        if (!acquired) locked = -1;
        Py_XDECREF(acquired);
    }
    if (locked < 0) {
        Py_DECREF(future);
        return NULL;
    }
    PyObject *batch = NULL;
    RecordBuffer *records = NULL;
    Py_ssize_t size = -1;
    int ready = 0;
    int found = self->stopped ? 0 : open_batch(self, topic, partition, &batch, &records);
    if (found <= 0) goto unlock;
    long long index = records->record_count;
    PyObject *ix = PyLong_FromLongLong(index); /* an int: not tracked by the GC */
    ts = ts ? Py_NewRef(ts) : PyLong_FromLongLong(timestamp);
    if (!ix || !ts) {
        Py_XDECREF(ix);
        Py_XDECREF(ts);
        found = -1;
        goto unlock;
    }
    size = put_record(records, timestamp, key, key_len, value, value_len, NULL, 0);
    if (size > 0) { /* once the record is written, nothing may fail but the callback list */
        future->fields[0] = Py_NewRef(batch);
        future->fields[1] = Py_NewRef(ix);
        future->fields[2] = Py_NewRef(ts);
        future->fields[3] = Py_NewRef(key_size);
        future->fields[4] = Py_NewRef(value_size);
    }
    if (size > 0 && callback != Py_None) {
        PyObject *callbacks = slot_read(&self->callbacks, batch);
        int ok = callbacks && PyList_Append(callbacks, callback) == 0 && PyList_Append(callbacks, ix) == 0 &&
                 PyList_Append(callbacks, ts) == 0 && PyList_Append(callbacks, key_size) == 0 &&
                 PyList_Append(callbacks, value_size) == 0;
        Py_XDECREF(callbacks);
        if (!ok) size = -1; /* out of memory: the record is in the batch without its callback */
    }
    Py_DECREF(ix); /* both held by the future or the batch, or (no room) by no one: not Python */
    Py_DECREF(ts);
    if (size < 0) found = -1;
    /* Only a batch this record filled is news: one with batches after it was announced
       when the next was made (the Sender's round for a new batch). */
    else ready = records->estimated_size >= records->batch_size;
unlock:
    Py_XDECREF(batch); /* both still held by the accumulator */
    Py_XDECREF((PyObject *)records);
    if (locked) {
        PyObject *err_type, *err_value, *err_tb;
        PyErr_Fetch(&err_type, &err_value, &err_tb);
        PyObject *released = PyObject_CallNoArgs(self->release);
        if (!released) {
            Py_XDECREF(err_type);
            Py_XDECREF(err_value);
            Py_XDECREF(err_tb);
            Py_DECREF(future);
            return NULL;
        }
        Py_DECREF(released);
        PyErr_Restore(err_type, err_value, err_tb);
    }
    if (found < 0) {
        Py_DECREF(future);
        return NULL;
    }
    if (found == 0 || size == 0) { /* no open batch with room for it */
        Py_DECREF(future);
        Py_RETURN_NONE;
    }
    if (ready) {
        PyObject *on_ready = PyObject_GetAttr(self->accumulator, str_on_ready);
        PyObject *done = on_ready ? PyObject_CallNoArgs(on_ready) : NULL;
        Py_XDECREF(on_ready);
        if (!done) {
            Py_DECREF(future);
            return NULL;
        }
        Py_DECREF(done);
    }
    return (PyObject *)future;
}

PyDoc_STRVAR(PlainAppender_stop_doc,
"stop()\n--\n\nThe accumulator has stopped: append() returns None from now on (as its\n"
"_stopped set does for Python's append_plain). Called with the accumulator's lock held.");

static PyObject *PlainAppender_stop(PlainAppender *self, PyObject *unused) {
    self->stopped = 1;
    Py_RETURN_NONE;
}

static PyObject *PlainAppender_append(PlainAppender *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_Format(PyExc_TypeError, "append_plain() takes 8 arguments, got %zd", nargs);
        return NULL;
    }
    long long timestamp = PyLong_AsLongLong(args[2]);
    if (timestamp == -1 && PyErr_Occurred()) return NULL;
    if (!PyBytes_CheckExact(args[3]) || !PyBytes_CheckExact(args[4])) {
        PyErr_SetString(PyExc_TypeError, "append_plain(): key and value must be bytes");
        return NULL;
    }
    /* Exact types: looking them up in the accumulator's dicts then runs no Python code
       (see append_plain). */
    if (!PyUnicode_CheckExact(args[0]) || !PyLong_CheckExact(args[1]) || !PyLong_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "append_plain(): topic must be a str, partition and timestamp ints");
        return NULL;
    }
    return append_plain(self, args[0], args[1], timestamp, args[2], args[3], args[4], args[5], args[6], args[7]);
}

static PyMethodDef PlainAppender_methods[] = {
    {"append", (PyCFunction)(void (*)(void))PlainAppender_append, METH_FASTCALL, PlainAppender_append_doc},
    {"stop", (PyCFunction)PlainAppender_stop, METH_NOARGS, PlainAppender_stop_doc},
    {NULL},
};

static PyType_Slot PlainAppender_slots[] = {
    {Py_tp_new, PlainAppender_new},
    {Py_tp_dealloc, PlainAppender_dealloc},
    {Py_tp_traverse, PlainAppender_traverse},
    {Py_tp_clear, PlainAppender_clear},
    {Py_tp_methods, PlainAppender_methods},
    {Py_tp_doc, "PlainAppender(accumulator, by_topic, lock, future_type, batch_type): send()'s common record, "
                "appended in C."},
    {0, NULL},
};

static PyType_Spec PlainAppender_spec = {
    .name = "spark_sink.encoder._kernels.PlainAppender",
    .basicsize = sizeof(PlainAppender),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = PlainAppender_slots,
};

/* send() whole: PlainSender(appender, metadata, max_payload, seed, ProducerRecord,
   long_way, new_batch, wall_ns).send(record, callback=None) is KafkaProducer.send (producer.py has
   the short way in Python too, _send_plain_py). The common record is appended here; one
   that needs a new batch goes to new_batch(topic, partition, timestamp, key, value,
   callback, key_size, value_size) with everything already worked out; every other record,
   and every record once close() was called, to long_way(record, callback). A record's
   timestamp is wall_ns() // 10**6: the producer's clock (spark_sink/client/clock.py),
   which tests move. When that clock is Python's own time_ns (the system's), it is read here
   the way time_ns reads it, without the call: through Python's call and its int, the
   clock cost about 85 ns a record, a third more than this whole send
   (bench/bench_plain_send.py). */
static PyObject *str_topic, *str_key, *str_value, *str_partition, *str_timestamp, *str_headers, *str_leaders,
    *str_callback;
static PyObject *system_wall_ns; /* the time module's time_ns */

typedef struct {
    PyObject_HEAD
    PyObject *appender; /* PlainAppender */
    PyObject *metadata; /* its leaders: {topic: [leader per partition]}, replaced when metadata changes */
    PyObject *metadata_dict; /* metadata's __dict__, where `leaders` is read (NULL: read by name) */
    PyObject *long_way, *new_batch;
    PyObject *wall_ns;  /* the record timestamps' clock: nanoseconds since the epoch, an int */
    int system_clock;   /* wall_ns is the time module's time_ns */
    long long max_payload;
    uint32_t seed;
    int closed;
    long long last_ms;   /* the last record's timestamp, */
    PyObject *last_ts;   /* as an int: most records share their millisecond with the previous one */
    Slot topic, key, value, partition, timestamp, headers; /* of ProducerRecord */
} PlainSender;

static PyObject *PlainAppender_type;

static PyObject *PlainSender_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *appender, *metadata, *record_type, *long_way, *new_batch, *wall_ns;
    long long max_payload, seed;
    if (kwargs && PyObject_Length(kwargs) > 0) {
        PyErr_SetString(PyExc_TypeError, "PlainSender() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!OLLO!OOO", (PyTypeObject *)PlainAppender_type, &appender, &metadata, &max_payload,
                          &seed, &PyType_Type, &record_type, &long_way, &new_batch, &wall_ns))
        return NULL;
    if (!PyCallable_Check(long_way) || !PyCallable_Check(new_batch) || !PyCallable_Check(wall_ns)) {
        PyErr_SetString(PyExc_TypeError, "PlainSender: long_way, new_batch and wall_ns must be callable");
        return NULL;
    }
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    PlainSender *self = (PlainSender *)alloc(type, 0);
    if (!self) return NULL;
    self->appender = Py_NewRef(appender);
    self->metadata = Py_NewRef(metadata);
    /* leaders is a plain instance attribute (nothing of that name on its class): read it
       from the instance's dict, without the class lookup a getattr makes each time. */
    int on_class = PyObject_HasAttr((PyObject *)Py_TYPE(metadata), str_leaders);
    self->metadata_dict = on_class ? NULL : PyObject_GenericGetDict(metadata, NULL);
    if (!self->metadata_dict) PyErr_Clear();
    self->long_way = Py_NewRef(long_way);
    self->new_batch = Py_NewRef(new_batch);
    self->wall_ns = Py_NewRef(wall_ns);
    self->system_clock = wall_ns == system_wall_ns;
    self->max_payload = max_payload;
    self->seed = (uint32_t)seed;
    self->closed = 0;
    self->last_ms = -1;
    self->last_ts = NULL;
    if (!slot_init(&self->topic, record_type, str_topic) || !slot_init(&self->key, record_type, str_key) ||
        !slot_init(&self->value, record_type, str_value) || !slot_init(&self->partition, record_type, str_partition) ||
        !slot_init(&self->timestamp, record_type, str_timestamp) ||
        !slot_init(&self->headers, record_type, str_headers)) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int PlainSender_traverse(PlainSender *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE((PyObject *)self));
    Py_VISIT(self->appender);
    Py_VISIT(self->metadata);
    Py_VISIT(self->metadata_dict);
    Py_VISIT(self->long_way);
    Py_VISIT(self->new_batch);
    Py_VISIT(self->wall_ns);
    Slot *slots[] = {&self->topic, &self->key, &self->value, &self->partition, &self->timestamp, &self->headers};
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++) {
        int visited = slot_traverse(slots[i], visit, arg);
        if (visited) return visited;
    }
    return 0;
}

static int PlainSender_clear(PlainSender *self) {
    Py_CLEAR(self->appender);
    Py_CLEAR(self->metadata);
    Py_CLEAR(self->metadata_dict);
    Py_CLEAR(self->long_way);
    Py_CLEAR(self->new_batch);
    Py_CLEAR(self->wall_ns);
    Py_CLEAR(self->last_ts);
    Slot *slots[] = {&self->topic, &self->key, &self->value, &self->partition, &self->timestamp, &self->headers};
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++) slot_clear(slots[i]);
    return 0;
}

static void PlainSender_dealloc(PlainSender *self) {
    PyTypeObject *type = Py_TYPE((PyObject *)self);
    PyObject_GC_UnTrack(self);
    PlainSender_clear(self);
    freefunc free_ = (freefunc)PyType_GetSlot(type, Py_tp_free);
    free_(self);
    Py_DECREF(type);
}

PyDoc_STRVAR(PlainSender_send_doc,
"send(record, callback=None) -> FutureRecordMetadata\n--\n\n"
"Queue one record; callback(metadata, exception) runs once it is acknowledged or failed.\n"
"The common record (bytes key and value; no partition, timestamp or headers; a topic with\n"
"known leaders) is appended here, or handed to new_batch when its partition's open batch\n"
"has no room for it; every other record goes to long_way.");

static PyObject *PlainSender_send(PlainSender *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *record, *callback = Py_None;
    Py_ssize_t nkw = kwnames ? PyTuple_Size(kwnames) : 0;
    if (nargs + nkw < 1 || nargs + nkw > 2 || nargs < 1 ||
        (nkw && PyUnicode_Compare(PyTuple_GetItem(kwnames, 0), str_callback) != 0)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "send() takes a record and an optional callback");
        return NULL;
    }
    record = args[0];
    if (nargs + nkw == 2) callback = args[1];
    if (self->closed) return PyObject_CallFunctionObjArgs(self->long_way, record, callback, NULL);
    PyObject *key = NULL, *value = NULL, *topic = NULL, *other = NULL, *leaders = NULL, *partition = NULL,
             *key_size = NULL, *value_size = NULL, *future = NULL;
    /* Anything unusual, or an error on the way, is the long way's to handle (and to report). */
    if (!(key = slot_read(&self->key, record)) || !PyBytes_CheckExact(key) ||
        !(value = slot_read(&self->value, record)) || !PyBytes_CheckExact(value) ||
        !(topic = slot_read(&self->topic, record)) || !PyUnicode_CheckExact(topic))
        goto long_way;
    const Slot *must_be_none[] = {&self->partition, &self->timestamp};
    for (int i = 0; i < 2; i++) {
        other = slot_read(must_be_none[i], record);
        if (other != Py_None) goto long_way;
        Py_CLEAR(other);
    }
    if (!(other = slot_read(&self->headers, record)) || (other != Py_None && PyObject_IsTrue(other) != 0))
        goto long_way;
    Py_CLEAR(other);
    other = self->metadata_dict ? Py_XNewRef(PyDict_GetItemWithError(self->metadata_dict, str_leaders))
                                : PyObject_GetAttr(self->metadata, str_leaders);
    if (!other || !PyDict_CheckExact(other)) goto long_way;
    leaders = PyDict_GetItemWithError(other, topic); /* borrowed: `other` holds it */
    Py_ssize_t n = leaders && PyList_CheckExact(leaders) ? PyList_Size(leaders) : 0;
    if (n <= 0) goto long_way;
    Py_ssize_t key_len = PyBytes_Size(key), value_len = PyBytes_Size(value);
    if (key_len + value_len > self->max_payload) goto long_way;
    uint32_t h = murmur2((const uint8_t *)PyBytes_AsString(key), key_len, self->seed);
    long long timestamp;
    if (self->system_clock) {
        struct timespec now; /* C11's TIME_UTC: CLOCK_REALTIME, which time_ns() reads */
        timespec_get(&now, TIME_UTC);
        timestamp = (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000; /* time_ns() // 10**6 */
    } else {
        /* The clock may run Python (a test's): every object used after it is held. */
        PyObject *now = PyObject_CallNoArgs(self->wall_ns);
        if (!now) goto done;
        long long now_ns = PyLong_AsLongLong(now);
        Py_DECREF(now);
        if (now_ns == -1 && PyErr_Occurred()) goto done;
        timestamp = now_ns / 1000000; /* wall_ns() // 10**6 (a time after 1970) */
    }
    if (timestamp != self->last_ms || !self->last_ts) {
        PyObject *ts = PyLong_FromLongLong(timestamp);
        if (!ts) goto done;
        Py_XDECREF(self->last_ts);
        self->last_ts = ts;
        self->last_ms = timestamp;
    }
    if (!(partition = PyLong_FromLong((long)((h & 0x7FFFFFFF) % (uint32_t)n))) ||
        !(key_size = PyLong_FromSsize_t(key_len)) || !(value_size = PyLong_FromSsize_t(value_len)))
        goto done;
    PyObject *ts = Py_NewRef(self->last_ts); /* held: a finalizer run below may send, and replace it */
    future = append_plain((PlainAppender *)self->appender, topic, partition, timestamp, ts, key, value, callback,
                          key_size, value_size);
    if (future == Py_None) { /* no room: a new batch, the rest worked out already */
        Py_DECREF(future);
        future = PyObject_CallFunctionObjArgs(self->new_batch, topic, partition, ts, key, value, callback, key_size,
                                              value_size, NULL);
    }
    Py_DECREF(ts);
    goto done;
long_way:
    PyErr_Clear();
    future = PyObject_CallFunctionObjArgs(self->long_way, record, callback, NULL);
done:
    Py_XDECREF(key);
    Py_XDECREF(value);
    Py_XDECREF(topic);
    Py_XDECREF(other);
    Py_XDECREF(partition);
    Py_XDECREF(key_size);
    Py_XDECREF(value_size);
    return future;
}

PyDoc_STRVAR(PlainSender_close_doc,
"close()\n--\n\nEvery later record goes to long_way (which refuses it once the producer is closed).");

static PyObject *PlainSender_close(PlainSender *self, PyObject *unused) {
    self->closed = 1;
    Py_RETURN_NONE;
}

static PyMethodDef PlainSender_methods[] = {
    {"send", (PyCFunction)(void (*)(void))PlainSender_send, METH_FASTCALL | METH_KEYWORDS, PlainSender_send_doc},
    {"close", (PyCFunction)PlainSender_close, METH_NOARGS, PlainSender_close_doc},
    {NULL},
};

static PyType_Slot PlainSender_slots[] = {
    {Py_tp_new, PlainSender_new},
    {Py_tp_dealloc, PlainSender_dealloc},
    {Py_tp_traverse, PlainSender_traverse},
    {Py_tp_clear, PlainSender_clear},
    {Py_tp_methods, PlainSender_methods},
    {Py_tp_doc, "PlainSender(appender, metadata, max_payload, seed, record_type, long_way, new_batch, wall_ns): "
                "send() in C."},
    {0, NULL},
};

static PyType_Spec PlainSender_spec = {
    .name = "spark_sink.encoder._kernels.PlainSender",
    .basicsize = sizeof(PlainSender),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = PlainSender_slots,
};

PyDoc_STRVAR(run_callbacks_doc,
"run_callbacks(entries, topic, partition, base_offset, metadata_type, on_error)\n--\n\n"
"ProducerBatch's callbacks for an acknowledged batch whose offsets are known and whose\n"
"records keep their create time: entries holds (callback, index, timestamp, key size, value\n"
"size) flat, record after record; each callback gets (metadata_type(topic, partition,\n"
"base_offset + index, timestamp, key size, value size), None). A callback that raises an\n"
"Exception is handed to on_error(exception) and the others still run.");

static PyObject *run_callbacks(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "run_callbacks() takes 6 arguments, got %zd", nargs);
        return NULL;
    }
    PyObject *entries = args[0], *topic = args[1], *partition = args[2], *metadata_type = args[4],
             *on_error = args[5];
    long long base = PyLong_AsLongLong(args[3]);
    if (base == -1 && PyErr_Occurred()) return NULL;
    if (!PyList_CheckExact(entries) || !PyType_Check(metadata_type) ||
        !PyType_IsSubtype((PyTypeObject *)metadata_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "run_callbacks(): entries must be a list, metadata_type a tuple subclass");
        return NULL;
    }
    allocfunc alloc = (allocfunc)PyType_GetSlot((PyTypeObject *)metadata_type, Py_tp_alloc);
    /* One metadata object serves record after record while no callback keeps it (its only
       reference is this loop's again once the callback returns): its fields are replaced
       in place, as a tuple no one else holds may be. One a callback keeps is left as it
       was, and the next record gets a new one. */
    PyObject *md = NULL;
    /* Read afresh each round: a callback may (wrongly) change the list; never past its end. */
    for (Py_ssize_t i = 0; i + 5 <= PyList_Size(entries); i += 5) {
        PyObject *callback = PyList_GetItem(entries, i), *index = PyList_GetItem(entries, i + 1);
        long long offset = PyLong_AsLongLong(index);
        PyObject *offset_o = offset == -1 && PyErr_Occurred() ? NULL : PyLong_FromLongLong(base + offset);
        if (!offset_o) {
            Py_XDECREF(md);
            return NULL;
        }
        if (md && Py_REFCNT(md) != 1) Py_CLEAR(md); /* kept by the last callback */
        if (!md) {
            if (!(md = alloc((PyTypeObject *)metadata_type, 6))) {
                Py_DECREF(offset_o);
                return NULL;
            }
            PyTuple_SetItem(md, 0, Py_NewRef(topic));
            PyTuple_SetItem(md, 1, Py_NewRef(partition));
        }
        PyTuple_SetItem(md, 2, offset_o);
        for (int k = 0; k < 3; k++) PyTuple_SetItem(md, 3 + k, Py_NewRef(PyList_GetItem(entries, i + 2 + k)));
        Py_INCREF(callback); /* the list may drop it meanwhile */
        PyObject *done = PyObject_CallFunctionObjArgs(callback, md, Py_None, NULL);
        Py_DECREF(callback);
        if (done) {
            Py_DECREF(done);
            continue;
        }
        if (!PyErr_ExceptionMatches(PyExc_Exception)) { /* KeyboardInterrupt and the like go on up */
            Py_DECREF(md);
            return NULL;
        }
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        PyErr_NormalizeException(&type, &value, &traceback);
        if (traceback) PyException_SetTraceback(value, traceback);
        PyObject *handled = PyObject_CallFunctionObjArgs(on_error, value, NULL);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
        if (!handled) {
            Py_DECREF(md);
            return NULL;
        }
        Py_DECREF(handled);
    }
    Py_XDECREF(md);
    Py_RETURN_NONE;
}

/* ---- Joiner: send_arrow's hand-over of an encoded chunk ---------------------------

   What RecordAccumulator.continued and _enqueue do per partition of a chunk, over all of
   them in one call: the claims of the batches a chunk's rows may continue, and the
   queueing of its partitions' records (committed into the batch they continue, or a
   ProducerBatch made for each new one). Python runs only what must be Python: a
   ProducerBatch's __init__ per new batch. Every case it does not take (a partition's first
   batch, several batches of one partition, records moved because their batch was taken)
   is left to the Python path at the index it stops at. Called with the accumulator's lock
   held. */

typedef struct {
    PyObject_HEAD
    PyObject *batch_type, *append; /* ProducerBatch; "append" */
    Slot records, segments, attempts, memory, closed; /* of ProducerBatch */
    Slot payload, record_count, uncompressed_size, base_timestamp, max_timestamp, first_offset, codec; /* of EncodedRecords */
} Joiner;

static PyObject *Joiner_type;

/* The slot's value as a long long (an int attribute); 0 with an error set otherwise. */
static int slot_long(const Slot *slot, PyObject *obj, long long *out) {
    PyObject *v = slot_read(slot, obj);
    if (!v) return 0;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return !(*out == -1 && PyErr_Occurred());
}

static int slot_write(const Slot *slot, PyObject *obj, PyObject *value) {
    if (Py_TYPE(obj) == (PyTypeObject *)slot->type) {
        descrsetfunc set = (descrsetfunc)PyType_GetSlot(Py_TYPE(slot->descr), Py_tp_descr_set);
        if (set) return set(slot->descr, obj, value);
    }
    return PyObject_SetAttr(obj, slot->name, value);
}

static PyObject *Joiner_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *batch_type, *encoded_type;
    if (kwargs && PyObject_Length(kwargs) > 0) {
        PyErr_SetString(PyExc_TypeError, "Joiner() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!O!", &PyType_Type, &batch_type, &PyType_Type, &encoded_type)) return NULL;
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    Joiner *self = (Joiner *)alloc(type, 0);
    if (!self) return NULL;
    struct { Slot *slot; PyObject *type; const char *name; } slots[] = {
        {&self->records, batch_type, "records"}, {&self->segments, batch_type, "segments"},
        {&self->attempts, batch_type, "attempts"}, {&self->memory, batch_type, "memory"},
        {&self->closed, batch_type, "closed"}, {&self->payload, encoded_type, "payload"},
        {&self->record_count, encoded_type, "record_count"},
        {&self->uncompressed_size, encoded_type, "uncompressed_size"},
        {&self->base_timestamp, encoded_type, "base_timestamp"}, {&self->max_timestamp, encoded_type, "max_timestamp"},
        {&self->first_offset, encoded_type, "first_offset"}, {&self->codec, encoded_type, "codec"},
    };
    self->batch_type = Py_NewRef(batch_type);
    if (!(self->append = PyUnicode_InternFromString("append"))) goto fail;
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++) {
        PyObject *name = PyUnicode_InternFromString(slots[i].name);
        int ok = name && slot_init(slots[i].slot, slots[i].type, name);
        Py_XDECREF(name);
        if (!ok) goto fail;
    }
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

#define JOINER_SLOTS(self) &self->records, &self->segments, &self->attempts, &self->memory, &self->closed, \
    &self->payload, &self->record_count, &self->uncompressed_size, &self->base_timestamp, &self->max_timestamp, \
    &self->first_offset, &self->codec

static int Joiner_traverse(Joiner *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE((PyObject *)self));
    Py_VISIT(self->batch_type);
    Slot *slots[] = {JOINER_SLOTS(self)};
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++)
        if (slots[i]->type && slot_traverse(slots[i], visit, arg)) return -1;
    return 0;
}

static int Joiner_clear(Joiner *self) {
    Py_CLEAR(self->batch_type);
    Py_CLEAR(self->append);
    Slot *slots[] = {JOINER_SLOTS(self)};
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++) slot_clear(slots[i]);
    return 0;
}

static void Joiner_dealloc(Joiner *self) {
    PyTypeObject *type = Py_TYPE((PyObject *)self);
    PyObject_GC_UnTrack(self);
    Joiner_clear(self);
    freefunc free_ = (freefunc)PyType_GetSlot(type, Py_tp_free);
    free_(self);
    Py_DECREF(type);
}

/* The last batch of deque dq (a new reference), NULL without error if it is empty. */
static PyObject *last_of(PyObject *dq) {
    Py_ssize_t n = PyObject_Length(dq);
    if (n <= 0) return NULL;
    return PySequence_GetItem(dq, n - 1);
}

PyDoc_STRVAR(Joiner_claim_doc,
"claim(queues, partitions, owner, held) -> targets\n--\n\n"
"RecordAccumulator.continued's claims: for each of partitions (queues: partition -> deque\n"
"of ProducerBatch), the RecordBuffer of its last batch if that batch takes joins (one of\n"
"send_arrow's, never sent, a reservation of its own) and it is neither sealed nor claimed:\n"
"claimed for owner, its record count, records section bytes and first timestamp written\n"
"into held (int64, 3 x partitions, zeroed). Returns the claimed buffers, None where none.");

static PyObject *Joiner_claim(Joiner *self, PyObject *args) {
    PyObject *queues, *partitions, *owner, *held_o, *targets = NULL;
    Views views = {.count = 0};
    Py_ssize_t n_held;
    if (!PyArg_ParseTuple(args, "O!OOO", &PyDict_Type, &queues, &partitions, &owner, &held_o)) return NULL;
    Py_ssize_t n = PySequence_Size(partitions);
    int64_t *held = n >= 0 ? items(&views, held_o, 8, 1, &n_held, "held") : NULL;
    if (!held) goto fail;
    if (n_held != 3 * n) {
        PyErr_SetString(PyExc_ValueError, "Joiner.claim: held must be 3 x partitions");
        goto fail;
    }
    if (!(targets = PyList_New(n))) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) PyList_SetItem(targets, i, Py_NewRef(Py_None));
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *partition = PySequence_GetItem(partitions, i);
        if (!partition) goto fail;
        PyObject *dq = PyDict_GetItemWithError(queues, partition); /* borrowed */
        Py_DECREF(partition);
        if (!dq) {
            if (PyErr_Occurred()) goto fail;
            continue;
        }
        PyObject *last = last_of(dq);
        if (!last) {
            if (PyErr_Occurred()) goto fail;
            continue;
        }
        PyObject *records = slot_read(&self->records, last), *segments = NULL, *memory = NULL;
        long long attempts = -1;
        int joins = records && Py_TYPE(records) == (PyTypeObject *)RecordBuffer_type &&
                    !((RecordBuffer *)records)->sealed && !((RecordBuffer *)records)->claimed &&
                    (segments = slot_read(&self->segments, last)) && segments != Py_None &&
                    slot_long(&self->attempts, last, &attempts) && attempts == 0 &&
                    (memory = slot_read(&self->memory, last)) && PyLong_CheckExact(memory);
        Py_XDECREF(segments);
        Py_XDECREF(memory);
        Py_DECREF(last);
        if (PyErr_Occurred()) {
            Py_XDECREF(records);
            goto fail;
        }
        if (!joins) {
            Py_XDECREF(records);
            continue;
        }
        RecordBuffer *rb = (RecordBuffer *)records;
        rb->claimed = 1;
        rb->owner = owner;
        held[i] = rb->record_count;
        held[n + i] = rb->len;
        held[2 * n + i] = rb->base_timestamp;
        PyList_SetItem(targets, i, records); /* steals records */
    }
    release(&views);
    return targets;
fail:
    Py_XDECREF(targets);
    release(&views);
    return NULL;
}

PyDoc_STRVAR(Joiner_sizes_doc,
"sizes(groups) -> list\n--\n\n"
"Bytes each (partition, its EncodedRecords) of groups takes on the wire, batch headers\n"
"included: what buffer.memory reserves for it.");

static PyObject *Joiner_sizes(Joiner *self, PyObject *groups) {
    Py_ssize_t n = PySequence_Size(groups);
    PyObject *out = n >= 0 ? PyList_New(n) : NULL;
    for (Py_ssize_t i = 0; out && i < n; i++) {
        PyObject *group = PySequence_GetItem(groups, i), *encoded = NULL, *size = NULL;
        Py_ssize_t m = -1;
        long long total = 0;
        if (group && (encoded = PySequence_GetItem(group, 1)) && (m = PySequence_Size(encoded)) >= 0) {
            for (Py_ssize_t k = 0; k < m; k++) {
                PyObject *e = PySequence_GetItem(encoded, k), *payload = NULL;
                long long codec = 0, bytes = 0;
                int ok = e && slot_long(&self->codec, e, &codec) &&
                         (codec ? (payload = slot_read(&self->payload, e)) && (bytes = PyObject_Length(payload)) >= 0
                                : slot_long(&self->uncompressed_size, e, &bytes));
                Py_XDECREF(payload);
                Py_XDECREF(e);
                if (!ok) {
                    m = -1;
                    break;
                }
                total += RECORD_BATCH_OVERHEAD + bytes;
            }
        }
        Py_XDECREF(encoded);
        Py_XDECREF(group);
        if (m < 0 || !(size = PyLong_FromLongLong(total))) Py_CLEAR(out);
        else PyList_SetItem(out, i, size);
    }
    return out;
}

/* A claimed buffer's size bytes past its end, count records, become its last ones (as
   RecordBuffer.commit). */
static void commit_records(RecordBuffer *rb, long long size, long long count, long long base, long long largest) {
    if (!rb->record_count) rb->base_timestamp = rb->max_timestamp = base;
    if (largest > rb->max_timestamp) rb->max_timestamp = largest;
    rb->len += (Py_ssize_t)size;
    rb->record_count += count;
    rb->estimated_size += size;
    rb->claimed = 0;
    rb->owner = NULL;
}

/* Whether a batch of dq other than its last holds records (RecordAccumulator's
   _holding): 1, 0, -1 on error. */
static int held_before_last(Joiner *self, PyObject *dq, PyObject *records) {
    Py_ssize_t n = PyObject_Length(dq);
    for (Py_ssize_t i = n - 2; i >= 0; i--) {
        PyObject *batch = PySequence_GetItem(dq, i), *held = batch ? slot_read(&self->records, batch) : NULL;
        Py_XDECREF(batch);
        if (!held) return -1;
        Py_DECREF(held);
        if (held == records) return 1;
    }
    return n < 0 ? -1 : 0;
}

/* Joins e (count records, uncompressed bytes, written past the end of the claimed buffer
   rb) to last, the batch whose buffer rb is, if they fit limit: 1 if joined, 0 if not
   (nothing changed), -1 on error (nothing changed either). */
static int join_last(Joiner *self, PyObject *last, RecordBuffer *rb, PyObject *listener, PyObject *count_o,
                     PyObject *size_o, long long count, long long uncompressed, long long base, long long largest,
                     long long limit) {
    if (!rb->claimed || rb->sealed || rb->estimated_size + uncompressed > limit || uncompressed > rb->cap - rb->len)
        return 0;
    PyObject *segments = slot_read(&self->segments, last), *memory = NULL, *more = NULL, *segment = NULL;
    int joined = -1;
    if (segments && PyList_Check(segments) && (memory = slot_read(&self->memory, last)) && PyLong_CheckExact(memory) &&
        (more = PyNumber_Add(memory, size_o)) && (segment = PyList_New(2))) {
        /* All or nothing: what may fail (memory for the new objects) comes first, the
           segment goes in in one step, and a slot's write and the commit cannot fail. */
        PyList_SetItem(segment, 0, Py_NewRef(listener));
        PyList_SetItem(segment, 1, Py_NewRef(count_o));
        Py_ssize_t at = PyList_Size(segments);
        if (PyList_SetSlice(segments, at, at, segment) == 0 && slot_write(&self->memory, last, more) == 0) {
            commit_records(rb, uncompressed, count, base, largest);
            joined = 1;
        }
    } else if (!PyErr_Occurred()) {
        joined = 0; /* not one that takes joins */
    }
    Py_XDECREF(segment);
    Py_XDECREF(more);
    Py_XDECREF(memory);
    Py_XDECREF(segments);
    return joined;
}

/* A new ProducerBatch of e's records (in the RecordBuffer records, or e's sealed payload
   where records is NULL), queued last in dq after closing the one before; 1 if queued, 0
   with an error set (not queued). */
static int queue_new(Joiner *self, PyObject *dq, PyObject *last, PyObject *e, PyObject *records,
                     PyObject *listener, PyObject *count_o, PyObject *size_o, PyObject *topic, PyObject *partition,
                     PyObject *now, PyObject *order, PyObject *batch_size, PyObject *incomplete) {
    PyObject *segments = PyList_New(2), *seq = NULL, *call = NULL, *batch = NULL;
    int queued = 0;
    if (segments) {
        PyList_SetItem(segments, 0, Py_NewRef(listener));
        PyList_SetItem(segments, 1, Py_NewRef(count_o));
    }
    /* later send() records must not overtake it: the batch before is closed */
    if (segments && (!last || slot_write(&self->closed, last, Py_True) == 0) && (seq = PyIter_Next(order)) &&
        (call = PyTuple_Pack(10, topic, partition, now, seq, size_o, batch_size, records ? Py_None : e, Py_None,
                             records ? records : Py_None, segments)) &&
        (batch = PyObject_Call(self->batch_type, call, NULL)) && slot_write(&self->closed, batch, Py_True) == 0) {
        int added = PySet_Add(incomplete, batch) == 0; /* incomplete first: a queued batch is always completed */
        PyObject *appended = added ? PyObject_CallMethodObjArgs(dq, self->append, batch, NULL) : NULL;
        if (appended) {
            queued = 1;
        } else if (added) { /* not queued: not the accumulator's to complete either */
            PyObject *type, *value, *traceback;
            PyErr_Fetch(&type, &value, &traceback);
            PySet_Discard(incomplete, batch);
            PyErr_Restore(type, value, traceback);
        }
        Py_XDECREF(appended);
    }
    if (!seq && segments && !PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "Joiner: the order ran out");
    Py_XDECREF(batch);
    Py_XDECREF(call);
    Py_XDECREF(seq);
    Py_XDECREF(segments);
    return queued;
}

PyDoc_STRVAR(Joiner_enqueue_doc,
"enqueue(queues, groups, start, end, sizes, join, limit, listener, topic, now, order, batch_size,\n"
"        incomplete, tally) -> index\n--\n\n"
"RecordAccumulator._enqueue's common cases for groups[start:end] ((partition, [one\n"
"EncodedRecords]) each, sizes[k] bytes reserved for it), in order: records written past\n"
"the end of the partition's last batch's claimed RecordBuffer (join true) are committed\n"
"there while the batch stays within limit bytes (its segments and reservation take\n"
"them), else moved into a RecordBuffer of their own (the claim ends); a batch of their own\n"
"(in a RecordBuffer, or sealed) becomes a new ProducerBatch (created now, its order\n"
"next(order), closed), queued after the partition's others (closed too) and added to\n"
"incomplete. Each partition is all or nothing. Adds records, their bytes of keys and values,\n"
"parts and reserved bytes queued to tally (int64 x 4) as it goes. Returns the index of the\n"
"first group it leaves to the caller (end: none): a partition's first batch or several\n"
"batches, records continuing a batch that is not the partition's last.");

static PyObject *Joiner_enqueue(Joiner *self, PyObject *args) {
    PyObject *queues, *groups, *sizes, *listener, *topic, *now, *order, *batch_size, *incomplete, *tally_o;
    Py_ssize_t start, end;
    int join;
    long long limit, batch_bytes;
    Views views = {.count = 0};
    Py_ssize_t n_tally;
    if (!PyArg_ParseTuple(args, "O!O!nnO!pLOOOOOO!O", &PyDict_Type, &queues, &PyList_Type, &groups, &start, &end,
                          &PyList_Type, &sizes, &join, &limit, &listener, &topic, &now, &order, &batch_size,
                          &PySet_Type, &incomplete, &tally_o))
        return NULL;
    batch_bytes = PyLong_AsLongLong(batch_size);
    int64_t *tally = batch_bytes == -1 && PyErr_Occurred() ? NULL : items(&views, tally_o, 8, 1, &n_tally, "tally");
    if (!tally || n_tally != 4) {
        if (tally) PyErr_SetString(PyExc_ValueError, "Joiner.enqueue: tally must be 4 int64");
        release(&views);
        return NULL;
    }
    if (end > PyList_Size(groups)) end = PyList_Size(groups);
    if (end > PyList_Size(sizes)) end = PyList_Size(sizes);
    Py_ssize_t k = start;
    for (; k < end; k++) {
        PyObject *group = PyList_GetItem(groups, k); /* borrowed, as below: the lists hold them */
        PyObject *partition = PyTuple_Check(group) && PyTuple_Size(group) == 2 ? PyTuple_GetItem(group, 0) : NULL;
        PyObject *encoded = partition ? PyTuple_GetItem(group, 1) : NULL;
        if (!encoded || !PyList_Check(encoded) || PyList_Size(encoded) != 1) break;
        PyObject *e = PyList_GetItem(encoded, 0), *size_o = PyList_GetItem(sizes, k);
        PyObject *dq = PyDict_GetItemWithError(queues, partition);
        if (!dq) break; /* the partition's first batch (or an error): the caller's */
        long long first_offset, count, uncompressed, base, largest, size = PyLong_AsLongLong(size_o);
        if ((size == -1 && PyErr_Occurred()) || !slot_long(&self->first_offset, e, &first_offset) ||
            !slot_long(&self->record_count, e, &count) || !slot_long(&self->uncompressed_size, e, &uncompressed) ||
            !slot_long(&self->base_timestamp, e, &base) || !slot_long(&self->max_timestamp, e, &largest))
            break;
        PyObject *payload = slot_read(&self->payload, e), *last = payload ? last_of(dq) : NULL;
        PyObject *count_o = PyErr_Occurred() ? NULL : PyLong_FromLongLong(count), *records = NULL;
        int done = 0, leave = !count_o; /* leave: the caller's (or an error) */
        if (!leave && first_offset) { /* a continuation: committed where it was written, if still there */
            RecordBuffer *rb = (RecordBuffer *)payload;
            PyObject *held = join && last ? slot_read(&self->records, last) : NULL;
            if (Py_TYPE(payload) != (PyTypeObject *)RecordBuffer_type || PyErr_Occurred()) {
                leave = 1;
            } else if (held == payload) {
                done = join_last(self, last, rb, listener, count_o, size_o, count, uncompressed, base, largest, limit);
                leave = done < 0;
            } else if (join && last && held_before_last(self, dq, payload) != 0) {
                leave = 1; /* another call's batch after it: the caller's, as rare */
            }
            Py_XDECREF(held);
            if (!done && !leave) { /* the batch was taken (or is not to be joined): moved into a buffer of their own */
                if (uncompressed > rb->cap - rb->len) {
                    PyErr_SetString(PyExc_ValueError, "Joiner: more bytes than the claimed buffer's room");
                    leave = 1;
                } else if (!(records = PyObject_CallFunction(RecordBuffer_type, "LL", batch_bytes, uncompressed)) ||
                           append_records((RecordBuffer *)records, rb->data + rb->len, rb->data + rb->len + uncompressed,
                                          count, base, largest, limit, first_offset) < 0) {
                    leave = 1;
                } else {
                    rb->claimed = 0; /* the claim ends, as with pending() */
                    rb->owner = NULL;
                }
            }
        } else if (!leave && Py_TYPE(payload) == (PyTypeObject *)RecordBuffer_type) {
            records = Py_NewRef(payload);
        }
        if (!leave && !done)
            done = queue_new(self, dq, last, e, records, listener, count_o, size_o, topic, partition, now, order,
                             batch_size, incomplete);
        Py_XDECREF(records);
        Py_XDECREF(count_o);
        Py_XDECREF(last);
        Py_XDECREF(payload);
        if (done <= 0) break;
        tally[0] += count;
        tally[1] += uncompressed;
        tally[2] += 1;
        tally[3] += size;
    }
    release(&views);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromSsize_t(k);
}

static PyMethodDef Joiner_methods[] = {
    {"claim", (PyCFunction)Joiner_claim, METH_VARARGS, Joiner_claim_doc},
    {"sizes", (PyCFunction)Joiner_sizes, METH_O, Joiner_sizes_doc},
    {"enqueue", (PyCFunction)Joiner_enqueue, METH_VARARGS, Joiner_enqueue_doc},
    {NULL},
};

static PyType_Slot Joiner_slots[] = {
    {Py_tp_new, Joiner_new},
    {Py_tp_dealloc, Joiner_dealloc},
    {Py_tp_traverse, Joiner_traverse},
    {Py_tp_clear, Joiner_clear},
    {Py_tp_methods, Joiner_methods},
    {Py_tp_doc, "Joiner(ProducerBatch, EncodedRecords): send_arrow's claims and queueing of a chunk's partitions, "
                "compiled (see RecordAccumulator.continued and _enqueue)."},
    {0, NULL},
};

static PyType_Spec Joiner_spec = {
    .name = "spark_sink.encoder._kernels.Joiner",
    .basicsize = sizeof(Joiner),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = Joiner_slots,
};

PyDoc_STRVAR(encoded_records_doc,
"encoded_records(EncodedRecords, plan, batches, buffers, targets, out)\n--\n\n"
"encode_groups' uncompressed batches as EncodedRecords, appended to out[group] (a list per\n"
"group) in plan's order: plan as plan_batches wrote it with continued (int64, 6 x rows; the\n"
"first batches columns), buffers and targets as write_records had them. A continuation's\n"
"payload is its group's target; a group's RecordBuffer takes its batch's records (commit);\n"
"other batches are views of their group's buffer, one after another.");

static PyObject *encoded_records(PyObject *module, PyObject *args) {
    PyObject *type, *plan_o, *buffers, *targets, *out, *empty = NULL, *views_list = NULL;
    Py_ssize_t batches, n_plan;
    Views views = {.count = 0};
    int64_t *starts = NULL;
    if (!PyArg_ParseTuple(args, "O!OnO!O!O!", &PyType_Type, &type, &plan_o, &batches, &PyList_Type, &buffers,
                          &PyList_Type, &targets, &PyList_Type, &out))
        return NULL;
    Py_ssize_t groups = PyList_Size(out);
    const int64_t *plan = items(&views, plan_o, 8, 0, &n_plan, "plan");
    const char *names[] = {"payload", "codec", "record_count", "base_timestamp", "max_timestamp", "uncompressed_size",
                           "first_offset"};
    Slot slots[7] = {{0}};
    int ready = plan != NULL;
    for (int f = 0; ready && f < 7; f++) {
        PyObject *name = PyUnicode_InternFromString(names[f]);
        ready = name && slot_init(&slots[f], type, name);
        Py_XDECREF(name);
    }
    newfunc new_ = ready ? (newfunc)PyType_GetSlot((PyTypeObject *)type, Py_tp_new) : NULL;
    Py_ssize_t rows = n_plan / 6;
    if (ready && (n_plan % 6 || batches > rows || PyList_Size(buffers) != groups || PyList_Size(targets) != groups)) {
        PyErr_SetString(PyExc_ValueError, "encoded_records: plan of 6 x rows, and buffers, targets and out per group");
        ready = 0;
    }
    if (ready && (!new_ || !(empty = PyTuple_New(0)) || !(starts = PyMem_Calloc(groups ? groups : 1, sizeof(int64_t))) ||
                  !(views_list = PyList_New(groups)))) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        ready = 0;
    }
    for (Py_ssize_t g = 0; ready && g < groups; g++) PyList_SetItem(views_list, g, Py_NewRef(Py_None));
    for (Py_ssize_t b = 0; ready && b < batches; b++) {
        int64_t group = plan[b], count = plan[rows + b], size = plan[2 * rows + b], base = plan[3 * rows + b],
                largest = plan[4 * rows + b], first_offset = plan[5 * rows + b];
        if (group < 0 || group >= groups) {
            PyErr_SetString(PyExc_ValueError, "encoded_records: a batch's group outside out");
            break;
        }
        PyObject *payload = NULL, *buffer = PyList_GetItem(buffers, group); /* borrowed */
        if (first_offset) {
            payload = Py_NewRef(PyList_GetItem(targets, group));
        } else if (Py_TYPE(buffer) == (PyTypeObject *)RecordBuffer_type) {
            RecordBuffer *rb = (RecordBuffer *)buffer;
            if (rb->sealed || size > rb->cap - rb->len) {
                PyErr_SetString(PyExc_BufferError, "encoded_records: more bytes than its RecordBuffer's room");
                break;
            }
            commit_records(rb, size, count, base, largest);
            payload = Py_NewRef(buffer);
        } else { /* a view of the group's buffer: its next size bytes */
            PyObject *whole = PyList_GetItem(views_list, group);
            if (whole == Py_None) {
                if (!(whole = PyMemoryView_FromObject(buffer))) break;
                PyList_SetItem(views_list, group, whole); /* steals */
            }
            payload = PySequence_GetSlice(whole, starts[group], starts[group] + size);
            starts[group] += size;
        }
        PyObject *e = payload ? new_((PyTypeObject *)type, empty, NULL) : NULL;
        long long values[6] = {0, count, base, largest, size, first_offset};
        int ok = e && slot_write(&slots[0], e, payload) == 0;
        for (int f = 1; ok && f < 7; f++) {
            PyObject *v = PyLong_FromLongLong(values[f - 1]);
            ok = v && slot_write(&slots[f], e, v) == 0;
            Py_XDECREF(v);
        }
        ok = ok && PyList_Append(PyList_GetItem(out, group), e) == 0;
        Py_XDECREF(e);
        Py_XDECREF(payload);
        if (!ok) break;
    }
    for (int f = 0; f < 7; f++) slot_clear(&slots[f]);
    Py_XDECREF(views_list);
    Py_XDECREF(empty);
    PyMem_Free(starts);
    release(&views);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"header_sizes", header_sizes, METH_VARARGS, header_sizes_doc},
    {"plan_batches", plan_batches, METH_VARARGS, plan_batches_doc},
    {"write_records", write_records, METH_VARARGS, write_records_doc},
    {"encoded_records", encoded_records, METH_VARARGS, encoded_records_doc},
    {"murmur2_rows", murmur2_rows, METH_VARARGS, murmur2_rows_doc},
    {"run_callbacks", (PyCFunction)(void (*)(void))run_callbacks, METH_FASTCALL, run_callbacks_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_kernels",
    .m_doc = "kprod's columnar encoder loops and send()'s per-record path, compiled when the wheel is built.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__kernels(void) {
    PyObject *m = PyModule_Create(&module), *sender = NULL;
    if (!m) return NULL;
    struct { PyObject **name; const char *text; } names[] = {
        {&str_on_ready, "on_ready"}, {&str_closed, "closed"}, {&str_records, "records"},
        {&str_callbacks, "callbacks"}, {&str_topic, "topic"}, {&str_key, "key"}, {&str_value, "value"},
        {&str_partition, "partition"}, {&str_timestamp, "timestamp"}, {&str_headers, "headers"},
        {&str_leaders, "leaders"}, {&str_callback, "callback"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!(*names[i].name = PyUnicode_InternFromString(names[i].text))) goto fail;
    PyObject *time_module = PyImport_ImportModule("time");
    system_wall_ns = time_module ? PyObject_GetAttrString(time_module, "time_ns") : NULL;
    Py_XDECREF(time_module);
    if (!system_wall_ns) goto fail;
    if (!(Future_type = PyType_FromSpec(&Future_spec)) ||
        PyModule_AddObjectRef(m, "FutureRecordMetadata", Future_type) < 0 ||
        !(RecordBuffer_type = PyType_FromSpec(&RecordBuffer_spec)) ||
        PyModule_AddObjectRef(m, "RecordBuffer", RecordBuffer_type) < 0 ||
        !(PlainAppender_type = PyType_FromSpec(&PlainAppender_spec)) ||
        PyModule_AddObjectRef(m, "PlainAppender", PlainAppender_type) < 0 ||
        !(sender = PyType_FromSpec(&PlainSender_spec)) || PyModule_AddObjectRef(m, "PlainSender", sender) < 0 ||
        !(Joiner_type = PyType_FromSpec(&Joiner_spec)) || PyModule_AddObjectRef(m, "Joiner", Joiner_type) < 0)
        goto fail;
    Py_DECREF(sender);
    return m;
fail:
    Py_XDECREF(sender);
    Py_DECREF(m);
    return NULL;
}
