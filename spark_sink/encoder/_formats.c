/* Value formats over Arrow buffers: one Avro binary body per row (and, in formats.py's
   JsonEncoder, one JSON text), compiled when kprod's wheel is built.

   formats.py checks the Arrow type against the schema once and hands this module a plan:
   a table of nodes, one per Arrow array in the column's tree (a struct's children in the
   schema's field order, with constants for schema fields the column lacks), each with
   its buffers and offset. The loop walks the rows with the GIL released and returns the
   bodies' bytes and their offsets; no Python object is made per row.

   Avro as Java's GenericDatumWriter writes it (what Spark's to_avro runs): zigzag
   varints, arrays and maps in one block (count, items, 0; an empty one is just 0), a map's
   entries in the order Java's HashMap iterates them (Spark puts them in a HashMap first),
   decimals as Avro's DecimalConversion (fixed: sign-extended to the size; bytes:
   BigInteger.toByteArray, the minimal two's complement). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    K_CONST, K_BOOL, K_INT8, K_INT16, K_INT32, K_INT64, K_FLOAT32, K_FLOAT64, K_BYTES32, K_BYTES64,
    K_DEC_FIXED, K_DEC_BYTES, K_LIST32, K_LIST64, K_MAP, K_STRUCT,
    K_DATE32, K_TIMESTAMP, /* JSON only: text; Avro writes them as K_INT32 and K_INT64 */
    K_KINDS
};

/* How a node's nulls are written: refused (the schema has no null there), or as a union
   with null first (branch 0 is null) or second. */
enum { NULL_REFUSED, NULL_FIRST, NULL_SECOND };

/* What went wrong in the loop, reported as ValueError(kind, node, row, detail) for
   formats.py to name the column path. */
enum { E_NONE, E_NULL, E_FIXED_SIZE, E_PRECISION, E_NOT_FINITE, E_YEAR, E_MEMORY, E_BUDGET };
static const char *error_names[] = {"", "null", "fixed_size", "precision", "not_finite", "year", "memory", "budget"};

typedef struct {
    int kind, nulls;
    const uint8_t *validity; /* NULL: no nulls */
    int64_t offset;          /* Arrow's offset of this array */
    const uint8_t *data;     /* values (or a constant's bytes) */
    const void *offsets;     /* int32 or int64 offsets of strings, binaries, lists, maps */
    int64_t param;           /* timestamps: divisor; fixed: size; const: length */
    int64_t param2;          /* decimals: precision */
    __int128 limit;          /* decimals: 10 ** precision, the first value out of range */
    int first_child, n_children;
} Node;

typedef struct {
    uint8_t *buf;
    size_t len, cap;
} Out;

typedef struct {
    const Node *nodes;
    const int32_t *children;
    Out out;
    int json;
    int64_t row;
    int error, error_node;
    int64_t error_detail;
} Ctx;

static int grow(Ctx *c, size_t more) {
    size_t need = c->out.len + more;
    if (need <= c->out.cap) return 1;
    size_t cap = c->out.cap ? c->out.cap : 4096;
    while (cap < need) cap *= 2;
    uint8_t *buf = realloc(c->out.buf, cap);
    if (!buf) {
        c->error = E_MEMORY;
        return 0;
    }
    c->out.buf = buf;
    c->out.cap = cap;
    return 1;
}

static inline int put(Ctx *c, const void *data, size_t n) {
    if (!grow(c, n)) return 0;
    memcpy(c->out.buf + c->out.len, data, n);
    c->out.len += n;
    return 1;
}

static inline int put_varint(Ctx *c, int64_t value) {
    if (!grow(c, 10)) return 0;
    uint64_t u = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    uint8_t *p = c->out.buf + c->out.len;
    while (u >= 128) {
        *p++ = (uint8_t)(u | 0x80);
        u >>= 7;
    }
    *p++ = (uint8_t)u;
    c->out.len = (size_t)(p - c->out.buf);
    return 1;
}

static inline int bit(const uint8_t *bits, int64_t i) { return (bits[i >> 3] >> (i & 7)) & 1; }

static int fail(Ctx *c, int error, int node, int64_t detail) {
    c->error = error;
    c->error_node = node;
    c->error_detail = detail;
    return 0;
}

static inline int64_t offset_at(const Node *n, int64_t i, int wide) {
    return wide ? ((const int64_t *)n->offsets)[i] : (int64_t)((const int32_t *)n->offsets)[i];
}

static inline int64_t floor_div(int64_t a, int64_t b) {
    int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

/* Java's String.hashCode of UTF-8 bytes (over their UTF-16 code units), spread as
   HashMap spreads it. */
static uint32_t java_hash(const uint8_t *s, int64_t n) {
    uint32_t h = 0;
    for (int64_t i = 0; i < n;) {
        uint32_t cp = s[i];
        int more = cp < 0x80 ? 0 : cp < 0xE0 ? 1 : cp < 0xF0 ? 2 : 3;
        cp &= more == 0 ? 0x7F : more == 1 ? 0x1F : more == 2 ? 0x0F : 0x07;
        i++;
        for (int k = 0; k < more && i < n; k++, i++) cp = (cp << 6) | (s[i] & 0x3F);
        if (cp >= 0x10000) {
            cp -= 0x10000;
            h = 31 * h + (0xD800 + (cp >> 10));
            h = 31 * h + (0xDC00 + (cp & 0x3FF));
        } else {
            h = 31 * h + cp;
        }
    }
    return h ^ (h >> 16);
}

/* The table size a HashMap made with new HashMap(n) has after n puts. */
static int64_t java_map_capacity(int64_t n) {
    int64_t cap = 1;
    while (cap < n) cap <<= 1;
    while (n > (int64_t)(cap * 0.75)) cap <<= 1;
    return cap;
}

static int encode(Ctx *c, int id, int64_t i);

/* The entries [start, end) of a map in the order Java's HashMap iterates them: by bucket,
   then in insertion order (a bucket of nine or more keys, which Java turns into a tree,
   is the one case this order may differ). */
static int map_order(Ctx *c, const Node *keys, int64_t start, int64_t n, int64_t *order) {
    int64_t cap = java_map_capacity(n);
    int64_t *count = calloc((size_t)cap + 1, sizeof(int64_t));
    uint32_t *bucket = malloc((size_t)n * sizeof(uint32_t));
    if (!count || !bucket) {
        free(count);
        free(bucket);
        return fail(c, E_MEMORY, 0, 0);
    }
    int wide = keys->kind == K_BYTES64;
    for (int64_t j = 0; j < n; j++) {
        int64_t p = keys->offset + start + j, a = offset_at(keys, p, wide), b = offset_at(keys, p + 1, wide);
        bucket[j] = java_hash(keys->data + a, b - a) & (uint32_t)(cap - 1);
        count[bucket[j] + 1]++;
    }
    for (int64_t k = 0; k < cap; k++) count[k + 1] += count[k];
    for (int64_t j = 0; j < n; j++) order[count[bucket[j]]++] = start + j;
    free(count);
    free(bucket);
    return 1;
}

static int encode_avro(Ctx *c, int id, int64_t i) {
    const Node *n = &c->nodes[id];
    if (n->kind == K_CONST) return put(c, n->data, (size_t)n->param);
    int64_t p = n->offset + i;
    if (n->nulls != NULL_REFUSED) {
        int valid = !n->validity || bit(n->validity, p);
        uint8_t branch = (uint8_t)((valid == (n->nulls == NULL_FIRST)) ? 2 : 0); /* zigzag 1 or 0 */
        if (!put(c, &branch, 1)) return 0;
        if (!valid) return 1;
    } else if (n->validity && !bit(n->validity, p)) {
        return fail(c, E_NULL, id, 0);
    }
    switch (n->kind) {
    case K_BOOL: {
        uint8_t b = (uint8_t)bit(n->data, p);
        return put(c, &b, 1);
    }
    case K_INT8: return put_varint(c, ((const int8_t *)n->data)[p]);
    case K_INT16: return put_varint(c, ((const int16_t *)n->data)[p]);
    case K_INT32: return put_varint(c, ((const int32_t *)n->data)[p]);
    case K_INT64: {
        int64_t v = ((const int64_t *)n->data)[p];
        return put_varint(c, n->param == 1 ? v : floor_div(v, n->param));
    }
    case K_FLOAT32: return put(c, (const float *)n->data + p, 4); /* little-endian, as Avro */
    case K_FLOAT64: return put(c, (const double *)n->data + p, 8);
    case K_BYTES32:
    case K_BYTES64: {
        int wide = n->kind == K_BYTES64;
        int64_t a = offset_at(n, p, wide), len = offset_at(n, p + 1, wide) - a;
        if (n->param >= 0) {
            if (len != n->param) return fail(c, E_FIXED_SIZE, id, len);
        } else if (!put_varint(c, len)) {
            return 0;
        }
        return put(c, n->data + a, (size_t)len);
    }
    case K_DEC_FIXED:
    case K_DEC_BYTES: {
        /* Arrow's decimal128: 16 bytes, little-endian two's complement. */
        const uint8_t *le = n->data + 16 * p;
        __int128 v;
        memcpy(&v, le, 16);
        if (v >= n->limit || v <= -n->limit) return fail(c, E_PRECISION, id, 0);
        uint8_t be[16];
        for (int k = 0; k < 16; k++) be[k] = le[15 - k];
        int start = 0;
        /* Drop sign bytes the next byte's top bit repeats (BigInteger.toByteArray). */
        while (start < 15 && ((be[start] == 0x00 && !(be[start + 1] & 0x80)) ||
                              (be[start] == 0xFF && (be[start + 1] & 0x80))))
            start++;
        int len = 16 - start;
        if (n->kind == K_DEC_BYTES) return put_varint(c, len) && put(c, be + start, (size_t)len);
        uint8_t fill = (be[0] & 0x80) ? 0xFF : 0x00;
        for (int64_t k = len; k < n->param; k++)
            if (!put(c, &fill, 1)) return 0;
        return put(c, be + start, (size_t)len);
    }
    case K_LIST32:
    case K_LIST64: {
        int wide = n->kind == K_LIST64;
        int64_t a = offset_at(n, p, wide), b = offset_at(n, p + 1, wide);
        if (b > a && !put_varint(c, b - a)) return 0;
        for (int64_t j = a; j < b; j++)
            if (!encode(c, c->children[n->first_child], j)) return 0;
        return put_varint(c, 0);
    }
    case K_MAP: {
        int64_t a = offset_at(n, p, 0), b = offset_at(n, p + 1, 0), count = b - a;
        int key = c->children[n->first_child], value = c->children[n->first_child + 1];
        if (count && !put_varint(c, count)) return 0;
        int64_t small[32], *order = count <= 32 ? small : malloc((size_t)count * sizeof(int64_t));
        if (!order) return fail(c, E_MEMORY, id, 0);
        int ok = map_order(c, &c->nodes[key], a, count, order);
        for (int64_t j = 0; ok && j < count; j++) ok = encode(c, key, order[j]) && encode(c, value, order[j]);
        if (order != small) free(order);
        return ok && put_varint(c, 0);
    }
    case K_STRUCT:
        for (int k = 0; k < n->n_children; k++)
            if (!encode(c, c->children[n->first_child + k], i)) return 0;
        return 1;
    }
    return 0;
}

/* ---- JSON ------------------------------------------------------------------------
   The same plan, with the schema's field names as constants (`"name":`) before each of a
   struct's children; nulls are `null` (refused where the schema allows none). */

static int put_json_string(Ctx *c, const uint8_t *s, int64_t n) {
    static const char hex[] = "0123456789abcdef";
    if (!grow(c, (size_t)n * 6 + 2)) return 0;
    uint8_t *o = c->out.buf + c->out.len;
    *o++ = '"';
    for (int64_t k = 0; k < n; k++) {
        uint8_t ch = s[k];
        if (ch == '"' || ch == '\\') {
            *o++ = '\\';
            *o++ = ch;
        } else if (ch < 0x20) {
            *o++ = '\\';
            switch (ch) {
            case '\b': *o++ = 'b'; break;
            case '\f': *o++ = 'f'; break;
            case '\n': *o++ = 'n'; break;
            case '\r': *o++ = 'r'; break;
            case '\t': *o++ = 't'; break;
            default:
                *o++ = 'u'; *o++ = '0'; *o++ = '0'; *o++ = hex[ch >> 4]; *o++ = hex[ch & 15];
            }
        } else {
            *o++ = ch;
        }
    }
    *o++ = '"';
    c->out.len = (size_t)(o - c->out.buf);
    return 1;
}

static int put_base64(Ctx *c, const uint8_t *s, int64_t n) {
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    if (!grow(c, (size_t)(n + 2) / 3 * 4 + 2)) return 0;
    uint8_t *o = c->out.buf + c->out.len;
    *o++ = '"';
    int64_t k = 0;
    for (; k + 2 < n; k += 3) {
        uint32_t v = ((uint32_t)s[k] << 16) | ((uint32_t)s[k + 1] << 8) | s[k + 2];
        *o++ = alphabet[v >> 18]; *o++ = alphabet[(v >> 12) & 63]; *o++ = alphabet[(v >> 6) & 63]; *o++ = alphabet[v & 63];
    }
    if (k < n) {
        uint32_t v = (uint32_t)s[k] << 16 | (k + 1 < n ? (uint32_t)s[k + 1] << 8 : 0);
        *o++ = alphabet[v >> 18];
        *o++ = alphabet[(v >> 12) & 63];
        *o++ = k + 1 < n ? alphabet[(v >> 6) & 63] : '=';
        *o++ = '=';
    }
    *o++ = '"';
    c->out.len = (size_t)(o - c->out.buf);
    return 1;
}

static int put_text(Ctx *c, const char *s) { return put(c, s, strlen(s)); }

/* The shortest of %.{6..17}g that reads back to the same value (what Python's repr and
   Java's Double.toString aim at), as a JSON number. */
static int put_double(Ctx *c, double v, int is_float) {
    char text[40];
    for (int digits = is_float ? 6 : 15; digits <= 17; digits++) {
        snprintf(text, sizeof text, "%.*g", digits, v);
        if (is_float ? (float)strtod(text, NULL) == (float)v : strtod(text, NULL) == v) break;
    }
    /* JSON has no "inf"/"nan" (refused before) and wants a digit before an exponent's e. */
    if (!strchr(text, '.') && !strchr(text, 'e') && !strchr(text, 'n')) strcat(text, ".0");
    return put_text(c, text);
}

/* An int128 as decimal text with `scale` digits after the point. */
static int put_decimal(Ctx *c, __int128 v, int64_t scale) {
    char digits[48], text[56];
    int nd = 0, neg = v < 0;
    unsigned __int128 u = neg ? (unsigned __int128)(-(v + 1)) + 1 : (unsigned __int128)v;
    do {
        digits[nd++] = (char)('0' + (int)(u % 10));
        u /= 10;
    } while (u);
    while (nd <= scale) digits[nd++] = '0';
    int t = 0;
    if (neg) text[t++] = '-';
    for (int k = nd - 1; k >= 0; k--) {
        text[t++] = digits[k];
        if (k == scale && scale > 0) text[t++] = '.';
    }
    return put(c, text, (size_t)t);
}

/* Days since 1970-01-01 as a proleptic Gregorian (year, month, day): Howard Hinnant's
   civil_from_days. */
static void civil(int64_t days, int64_t *y, int *m, int *d) {
    days += 719468;
    int64_t era = (days >= 0 ? days : days - 146096) / 146097;
    int64_t doe = days - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153;
    *d = (int)(doy - (153 * mp + 2) / 5 + 1);
    *m = (int)(mp < 10 ? mp + 3 : mp - 9);
    *y = yoe + era * 400 + (*m <= 2);
}

/* RFC 3339's full-date ("2024-05-01"), and date-time with six fractional digits and Z
   ("2024-05-01T12:00:00.000000Z"; without Z for a timestamp with no time zone): years
   0001 to 9999 only, as RFC 3339. */
static int put_date_time(Ctx *c, int id, int64_t days, int64_t micros_of_day, int time, int zone) {
    int64_t y;
    int m, d;
    char text[48];
    civil(days, &y, &m, &d);
    if (y < 1 || y > 9999) return fail(c, E_YEAR, id, y);
    if (!time) {
        snprintf(text, sizeof text, "\"%04d-%02d-%02d\"", (int)y, m, d);
    } else {
        int64_t s = micros_of_day / 1000000;
        snprintf(text, sizeof text, "\"%04d-%02d-%02dT%02d:%02d:%02d.%06d%s\"", (int)y, m, d, (int)(s / 3600),
                 (int)(s / 60 % 60), (int)(s % 60), (int)(micros_of_day % 1000000), zone ? "Z" : "");
    }
    return put_text(c, text);
}

static int encode_json(Ctx *c, int id, int64_t i) {
    const Node *n = &c->nodes[id];
    if (n->kind == K_CONST) return put(c, n->data, (size_t)n->param);
    int64_t p = n->offset + i;
    if (n->validity && !bit(n->validity, p))
        return n->nulls == NULL_REFUSED ? fail(c, E_NULL, id, 0) : put_text(c, "null");
    char text[32];
    switch (n->kind) {
    case K_BOOL: return put_text(c, bit(n->data, p) ? "true" : "false");
    case K_INT8: snprintf(text, sizeof text, "%d", ((const int8_t *)n->data)[p]); return put_text(c, text);
    case K_INT16: snprintf(text, sizeof text, "%d", ((const int16_t *)n->data)[p]); return put_text(c, text);
    case K_INT32: snprintf(text, sizeof text, "%d", ((const int32_t *)n->data)[p]); return put_text(c, text);
    case K_INT64:
        snprintf(text, sizeof text, "%lld", (long long)((const int64_t *)n->data)[p]);
        return put_text(c, text);
    case K_FLOAT32:
    case K_FLOAT64: {
        double v = n->kind == K_FLOAT32 ? ((const float *)n->data)[p] : ((const double *)n->data)[p];
        if (!isfinite(v)) return fail(c, E_NOT_FINITE, id, 0);
        return put_double(c, v, n->kind == K_FLOAT32);
    }
    case K_BYTES32:
    case K_BYTES64: {
        int wide = n->kind == K_BYTES64;
        int64_t a = offset_at(n, p, wide), len = offset_at(n, p + 1, wide) - a;
        return n->param ? put_base64(c, n->data + a, len) : put_json_string(c, n->data + a, len);
    }
    case K_DEC_BYTES: {
        __int128 v;
        memcpy(&v, n->data + 16 * p, 16);
        return put_decimal(c, v, n->param);
    }
    case K_DATE32: return put_date_time(c, id, ((const int32_t *)n->data)[p], 0, 0, 0);
    case K_TIMESTAMP: {
        int64_t v = ((const int64_t *)n->data)[p], days = floor_div(v, 86400000000LL);
        return put_date_time(c, id, days, v - days * 86400000000LL, 1, (int)n->param2);
    }
    case K_LIST32:
    case K_LIST64: {
        int wide = n->kind == K_LIST64;
        int64_t a = offset_at(n, p, wide), b = offset_at(n, p + 1, wide);
        if (!put_text(c, "[")) return 0;
        for (int64_t j = a; j < b; j++)
            if ((j > a && !put_text(c, ",")) || !encode(c, c->children[n->first_child], j)) return 0;
        return put_text(c, "]");
    }
    case K_MAP: {
        int64_t a = offset_at(n, p, 0), b = offset_at(n, p + 1, 0);
        int key = c->children[n->first_child], value = c->children[n->first_child + 1];
        if (!put_text(c, "{")) return 0;
        for (int64_t j = a; j < b; j++)
            if ((j > a && !put_text(c, ",")) || !encode(c, key, j) || !put_text(c, ":") || !encode(c, value, j))
                return 0;
        return put_text(c, "}");
    }
    case K_STRUCT:
        /* children: (`"name":` constant, with a comma before all but the first, value) pairs */
        if (!put_text(c, "{")) return 0;
        for (int k = 0; k < n->n_children; k++)
            if (!encode(c, c->children[n->first_child + k], i)) return 0;
        return put_text(c, "}");
    }
    return 0;
}

static int encode(Ctx *c, int id, int64_t i) { return c->json ? encode_json(c, id, i) : encode_avro(c, id, i); }

/* ---- the entry point ------------------------------------------------------------- */

static int get_buffer(PyObject *obj, Py_buffer *views, int *count, const void **out) {
    if (obj == Py_None) {
        *out = NULL;
        return 1;
    }
    if (PyObject_GetBuffer(obj, &views[*count], PyBUF_SIMPLE) < 0) return 0;
    *out = views[*count].buf;
    (*count)++;
    return 1;
}

PyDoc_STRVAR(encode_doc,
"encode(nodes, children, rows, validity, offset, prefix, json, skip=False, budget=-1)\n"
"-> (data, offsets[, refused])\n--\n\n"
"Each of `rows` rows of node 0 (rows whose bit in `validity`, at `offset`, is clear are\n"
"skipped: empty) as `prefix` + its Avro body (or JSON text, when `json`). nodes: tuples\n"
"(kind, nulls, validity, offset, data, offsets, param, param2, first_child, n_children);\n"
"children: an int32 buffer of node indices. Returns the bytes and the rows' int64\n"
"offsets into them (rows + 1). A row the schema refuses raises\n"
"ValueError(error, node, row, detail); with `skip`, it is left empty instead and listed\n"
"in `refused`, int64 quadruples (row, error, node, detail), and the loop goes on.\n"
"With `budget` >= 0, a row after the first that takes the bytes past it stops the loop\n"
"with ValueError('budget', 0, row, 0): the rows before it fit.");

static PyObject *encode_rows(PyObject *self, PyObject *args) {
    PyObject *nodes_obj, *children_obj, *validity_obj;
    Py_ssize_t rows, offset;
    Py_buffer prefix, children_view;
    Py_ssize_t budget = -1;
    int json, skip = 0;
    if (!PyArg_ParseTuple(args, "OOnOny*p|pn", &nodes_obj, &children_obj, &rows, &validity_obj, &offset, &prefix,
                          &json, &skip, &budget))
        return NULL;
    PyObject *result = NULL, *data = NULL, *offsets = NULL, *refused_obj = NULL;
    /* With skip: the rows the schema refused, four int64 each (row, error, node, detail);
       grown by doubling, as rare as the bad rows are. */
    int64_t *refused = NULL;
    size_t n_refused = 0, refused_cap = 0;
    Py_ssize_t n_nodes = PySequence_Size(nodes_obj);
    Node *nodes = n_nodes > 0 ? calloc((size_t)n_nodes, sizeof(Node)) : NULL;
    Py_buffer *views = n_nodes > 0 ? calloc((size_t)n_nodes * 3 + 1, sizeof(Py_buffer)) : NULL;
    int count = 0, have_children = 0;
    const uint8_t *top_validity = NULL;
    Ctx c = {.json = json};
    int64_t *ends = NULL;
    if (!nodes || !views) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "encode: no nodes");
        goto done;
    }
    if (PyObject_GetBuffer(children_obj, &children_view, PyBUF_SIMPLE) < 0) goto done;
    have_children = 1;
    c.children = children_view.buf;
    Py_ssize_t n_children = children_view.len / 4;
    for (Py_ssize_t k = 0; k < n_nodes; k++) {
        PyObject *t = PySequence_GetItem(nodes_obj, k), *v, *d, *o;
        Node *n = &nodes[k];
        long long off, param, param2;
        if (!t) goto done;
        int ok = PyArg_ParseTuple(t, "iiOLOOLLii", &n->kind, &n->nulls, &v, &off, &d, &o, &param, &param2,
                                  &n->first_child, &n->n_children) &&
                 get_buffer(v, views, &count, (const void **)&n->validity) &&
                 get_buffer(d, views, &count, (const void **)&n->data) && get_buffer(o, views, &count, &n->offsets);
        Py_DECREF(t);
        if (!ok) goto done;
        n->offset = off;
        n->param = param;
        n->param2 = param2;
        n->limit = 1;
        for (int p = 0; p < param2 && p < 38; p++) n->limit *= 10;
        if (n->kind < 0 || n->kind >= K_KINDS || n->first_child < 0 || n->n_children < 0 ||
            n->first_child + n->n_children > n_children) {
            PyErr_Format(PyExc_ValueError, "encode: node %zd is malformed", k);
            goto done;
        }
    }
    for (Py_ssize_t k = 0; k < n_children; k++)
        if (c.children[k] < 0 || c.children[k] >= n_nodes) {
            PyErr_Format(PyExc_ValueError, "encode: child %zd names no node", k);
            goto done;
        }
    if (!get_buffer(validity_obj, views, &count, (const void **)&top_validity)) goto done;
    c.nodes = nodes;
    if (!(ends = malloc(((size_t)rows + 1) * sizeof(int64_t)))) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    ends[0] = 0;
    for (c.row = 0; c.row < rows; c.row++) {
        if (!top_validity || bit(top_validity, offset + c.row)) {
            size_t start = c.out.len;
            if (!put(&c, prefix.buf, (size_t)prefix.len) || !encode(&c, 0, c.row)) {
                if (!skip || c.error == E_MEMORY) break;
                /* The row's own error: its partial bytes dropped, the row listed. */
                if (n_refused == refused_cap) {
                    size_t cap = refused_cap ? refused_cap * 2 : 16;
                    int64_t *grown = realloc(refused, cap * 4 * sizeof(int64_t));
                    if (!grown) {
                        c.error = E_MEMORY;
                        break;
                    }
                    refused = grown;
                    refused_cap = cap;
                }
                int64_t *r = refused + 4 * n_refused++;
                r[0] = c.row;
                r[1] = c.error;
                r[2] = c.error_node;
                r[3] = c.error_detail;
                c.out.len = start;
                c.error = E_NONE;
            }
        }
        ends[c.row + 1] = (int64_t)c.out.len;
        /* Checked once a row is whole (a row cannot be cut); the first always goes, so
           that a caller retrying with the rows that fit makes progress. */
        if (budget >= 0 && c.row > 0 && c.out.len > (size_t)budget) {
            c.error = E_BUDGET;
            c.error_node = 0;
            c.error_detail = 0;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    if (c.error == E_MEMORY) {
        PyErr_NoMemory();
    } else if (c.error) {
        PyObject *e = Py_BuildValue("(sinL)", error_names[c.error], c.error_node, (Py_ssize_t)c.row,
                                    (long long)c.error_detail);
        if (e) PyErr_SetObject(PyExc_ValueError, e);
        Py_XDECREF(e);
    } else if ((data = PyBytes_FromStringAndSize((const char *)c.out.buf, (Py_ssize_t)c.out.len)) &&
               (offsets = PyBytes_FromStringAndSize((const char *)ends, (Py_ssize_t)((rows + 1) * 8)))) {
        if (!skip) {
            result = PyTuple_Pack(2, data, offsets);
        } else if ((refused_obj = PyBytes_FromStringAndSize((const char *)refused,
                                                            (Py_ssize_t)(n_refused * 4 * sizeof(int64_t))))) {
            result = PyTuple_Pack(3, data, offsets, refused_obj);
        }
    }
done:
    for (int k = 0; k < count; k++) PyBuffer_Release(&views[k]);
    if (have_children) PyBuffer_Release(&children_view);
    PyBuffer_Release(&prefix);
    Py_XDECREF(data);
    Py_XDECREF(offsets);
    Py_XDECREF(refused_obj);
    free(refused);
    free(nodes);
    free(views);
    free(ends);
    free(c.out.buf);
    return result;
}

static PyMethodDef methods[] = {
    {"encode", encode_rows, METH_VARARGS, encode_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_formats",
    .m_doc = "kprod's value formats (Avro binary, JSON) over Arrow buffers, compiled when the wheel is built.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__formats(void) { return PyModule_Create(&module); }
