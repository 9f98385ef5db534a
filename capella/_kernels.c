/* Optional C kernels: per-message loops that a profile still showed after record batches.
 *
 * capella/kernels.py loads this module unless CAPELLA_NO_EXTENSIONS=1; every function has a
 * pure-Python equivalent that gives the same answer (tests/core/test_kernels.py checks the two
 * against each other on generated input), and returns None for whatever it does not handle,
 * so that the caller takes the Python path: that path also raises CorruptData for a body
 * that does not parse. The record batch layout is docs/format.md's ("Record batch").
 *
 * batch_json(data, body, end, flags, count, base_id, base_time, source)
 *     Each message of the record batch whose body is data[body:end] as the StoredMessage
 *     JSON object the API answers with, byte for byte what orjson.dumps(stored_message(m))
 *     gives; None when a payload is not UTF-8 (its object holds data_b64), a time is one
 *     orjson writes in another notation than repr (outside 1e-4 <= |t| < 1e16, or not
 *     finite), or the body does not parse.
 *
 * batch_messages(make, data, body, end, flags, count, base_id, base_time, source)
 *     Each message of the record batch as make(id, time, source, external_id, external_time,
 *     segment, headers, data), the values record_batch.decode_body gives and data the
 *     payload as a str (wire.messages.stored_of); None when a payload is not UTF-8 (its
 *     StoredMessage holds data_b64) or the body does not parse.
 *
 * crc32(data, value=0)
 *     zlib.crc32's answer, folded with PCLMULQDQ where the CPU has it (Intel's "Fast CRC
 *     Computation for Generic Polynomials Using PCLMULQDQ", the fold Chromium's zlib uses), a
 *     byte table elsewhere; like zlib.crc32 it lets go of the GIL for more than 5 KiB.
 *     FAST_CRC32 says whether the fold is used: capella/kernels.py takes zlib.crc32 when not.
 *
 * crc32c(data, value=0)
 *     CRC-32C (Castagnoli: Kafka's record batches, iSCSI), running like zlib.crc32: the crc of
 *     b after a is crc32c(b, crc32c(a)). The SSE4.2 crc32 instruction where the CPU has it
 *     (FAST_CRC32C, checked at init as the fold is), in three streams joined by tables (~23
 *     GB/s on a MiB), slicing-by-8 tables elsewhere (~1.5 GB/s); the GIL
 *     is let go for more than 5 KiB. capella/crc32c.py is the pure-Python equivalent.
 *     crc32c_tables(data, value=0) is the table path alone, for the tests.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <math.h>
#include <string.h>

#define FLAG_SOURCES 0x01
#define FLAG_EXTERNAL_IDS 0x02
#define FLAG_EXTERNAL_TIMES 0x04
#define FLAG_SEGMENTS 0x08
#define FLAG_HEADERS 0x10
#define KNOWN_FLAGS 0x1f

/* --- little-endian reads ------------------------------------------------------------- */

static uint16_t le16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static uint64_t le64(const unsigned char *p) { return (uint64_t)le32(p) | ((uint64_t)le32(p + 4) << 32); }

static double le_double(const unsigned char *p) {
    uint64_t bits = le64(p);
    double value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* --- a growing output buffer ---------------------------------------------------------- */

typedef struct {
    char *data;
    size_t len;
    size_t cap;
} Out;

static int out_reserve(Out *out, size_t more) {
    if (out->len + more <= out->cap) {
        return 0;
    }
    size_t cap = out->cap ? out->cap : 4096;
    while (cap < out->len + more) {
        cap *= 2;
    }
    char *grown = PyMem_Realloc(out->data, cap);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    out->data = grown;
    out->cap = cap;
    return 0;
}

/* Callers reserve first: these only copy. */
static void out_put(Out *out, const char *text, size_t len) {
    memcpy(out->data + out->len, text, len);
    out->len += len;
}

#define OUT_LITERAL(out, text) out_put((out), (text), sizeof(text) - 1)

static void out_uint(Out *out, uint64_t value) {
    char digits[20];
    int at = 20;
    do {
        digits[--at] = (char)('0' + value % 10);
        value /= 10;
    } while (value);
    out_put(out, digits + at, (size_t)(20 - at));
}

static void out_int(Out *out, int64_t value) {
    if (value < 0) {
        out_put(out, "-", 1);
        out_uint(out, (uint64_t)0 - (uint64_t)value);
    } else {
        out_uint(out, (uint64_t)value);
    }
}

/* A float as orjson writes it, into text (33 bytes), where that is repr's notation: its
 * length, 0 when orjson's notation differs (see above), -1 on a Python error. */
static int float_text(double value, char *text) {
    double magnitude = value < 0 ? -value : value;
    if (!(value == 0.0 || (magnitude >= 1e-4 && magnitude < 1e16))) {
        return 0;
    }
    char *repr = PyOS_double_to_string(value, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (repr == NULL) {
        return -1;
    }
    size_t len = strlen(repr);
    if (len > 32) {
        len = 0;
    } else {
        memcpy(text, repr, len);
    }
    PyMem_Free(repr);
    return (int)len;
}

/* --- UTF-8 and JSON strings ----------------------------------------------------------- */

/* The length of the UTF-8 sequence at p (at most end - p bytes), as Python's strict decoder
 * takes it; 0 for an invalid one (overlong forms, surrogates, past U+10FFFF, cut short). */
static size_t utf8_sequence(const unsigned char *p, const unsigned char *end) {
    unsigned char c = p[0];
    size_t left = (size_t)(end - p);
    if (c < 0x80) {
        return 1;
    }
    if (c >= 0xc2 && c <= 0xdf) {
        return left >= 2 && (p[1] & 0xc0) == 0x80 ? 2 : 0;
    }
    if (c >= 0xe0 && c <= 0xef) {
        if (left < 3 || (p[1] & 0xc0) != 0x80 || (p[2] & 0xc0) != 0x80) {
            return 0;
        }
        if ((c == 0xe0 && p[1] < 0xa0) || (c == 0xed && p[1] > 0x9f)) {
            return 0;
        }
        return 3;
    }
    if (c >= 0xf0 && c <= 0xf4) {
        if (left < 4 || (p[1] & 0xc0) != 0x80 || (p[2] & 0xc0) != 0x80 || (p[3] & 0xc0) != 0x80) {
            return 0;
        }
        if ((c == 0xf0 && p[1] < 0x90) || (c == 0xf4 && p[1] > 0x8f)) {
            return 0;
        }
        return 4;
    }
    return 0;
}

/* Whether text is UTF-8 that Python's strict decoder takes. */
static int utf8_valid(const unsigned char *text, size_t len) {
    const unsigned char *end = text + len;
    while (text < end) {
        size_t n = utf8_sequence(text, end);
        if (n == 0) {
            return 0;
        }
        text += n;
    }
    return 1;
}

/* The most bytes a JSON string of len bytes of text takes: quotes and six per escape. */
#define JSON_STRING_MAX(len) (2 + 6 * (size_t)(len))

/* text as a JSON string, escaped as orjson escapes; 0 when it is not UTF-8. Reserve
 * JSON_STRING_MAX(len) first. */
static int out_json_string(Out *out, const unsigned char *text, size_t len) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = text;
    const unsigned char *end = text + len;
    char *w = out->data + out->len;
    *w++ = '"';
    while (p < end) {
        /* Eight plain bytes at a time: none below 0x20, none '"' or '\\', none past ASCII. */
        while (end - p >= 8) {
            uint64_t x;
            memcpy(&x, p, 8);
            const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
            uint64_t quote = x ^ (ones * '"'), backslash = x ^ (ones * '\\');
            uint64_t special = ((x - ones * 0x20) | (quote - ones) | (backslash - ones)) & ~x & highs;
            if (special | (x & highs)) {
                break;
            }
            memcpy(w, p, 8);
            w += 8;
            p += 8;
        }
        if (p == end) {
            break;
        }
        unsigned char c = *p;
        if (c >= 0x20 && c != '"' && c != '\\' && c < 0x80) {
            *w++ = (char)c;
            p++;
            continue;
        }
        if (c >= 0x80) {
            size_t n = utf8_sequence(p, end);
            if (n == 0) {
                return 0;
            }
            memcpy(w, p, n);
            w += n;
            p += n;
            continue;
        }
        *w++ = '\\';
        switch (c) {
        case '"': *w++ = '"'; break;
        case '\\': *w++ = '\\'; break;
        case '\b': *w++ = 'b'; break;
        case '\t': *w++ = 't'; break;
        case '\n': *w++ = 'n'; break;
        case '\f': *w++ = 'f'; break;
        case '\r': *w++ = 'r'; break;
        default:
            *w++ = 'u';
            *w++ = '0';
            *w++ = '0';
            *w++ = hex[c >> 4];
            *w++ = hex[c & 0xf];
        }
        p++;
    }
    *w++ = '"';
    out->len = (size_t)(w - out->data);
    return 1;
}

/* --- the body's columns --------------------------------------------------------------- */

typedef struct {
    const unsigned char *text;
    size_t len;
} Span;

typedef struct {
    uint32_t count;
    const unsigned char *lengths;     /* u32 per message */
    Span *sources;                    /* the table; 0 is the default source */
    uint16_t source_count;            /* entries in sources */
    const unsigned char *source_index; /* u16 per message, or NULL */
    const unsigned char *id_bits;     /* the presence bitmap, or NULL */
    const unsigned char *external_ids; /* i64 per message */
    const unsigned char *external_times; /* f64 per message, or NULL */
    const unsigned char *segments;    /* i64 per message, or NULL */
    const unsigned char *header_lengths; /* u32 per message, or NULL */
    const unsigned char *headers;     /* the maps, back to back */
    const unsigned char *payloads;    /* back to back */
} Columns;

/* Takes size bytes at *pos, never past end; NULL when they are not there. */
static const unsigned char *take(const unsigned char **pos, const unsigned char *end, size_t size) {
    if ((size_t)(end - *pos) < size) {
        return NULL;
    }
    const unsigned char *at = *pos;
    *pos += size;
    return at;
}

/* 1 when the columns parse as record_batch._decode_columns reads them, else 0 (the caller
 * answers None and Python raises CorruptData). Allocates c->sources (PyMem_Free it). */
static int read_columns(Columns *c, const unsigned char *body, const unsigned char *end, unsigned flags,
                        uint32_t count, const char *source, Py_ssize_t source_len) {
    const unsigned char *pos = body;
    size_t n = count;
    memset(c, 0, sizeof *c);
    c->count = count;
    if ((flags & ~KNOWN_FLAGS) || n == 0 || !(c->lengths = take(&pos, end, 4 * n))) {
        return 0;
    }
    const unsigned char *at;
    if (flags & FLAG_SOURCES) {
        if (!(at = take(&pos, end, 2))) {
            return 0;
        }
        c->source_count = le16(at);
    }
    c->sources = PyMem_Malloc(sizeof(Span) * ((size_t)c->source_count + 1));
    if (c->sources == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    c->sources[0].text = (const unsigned char *)source;
    c->sources[0].len = (size_t)source_len;
    for (size_t k = 1; k <= c->source_count; k++) {
        if (!(at = take(&pos, end, 2))) {
            return 0;
        }
        size_t len = le16(at);
        /* Python decodes every entry, used or not. */
        if (!(c->sources[k].text = take(&pos, end, len)) || !utf8_valid(c->sources[k].text, len)) {
            return 0;
        }
        c->sources[k].len = len;
    }
    if (flags & FLAG_SOURCES) {
        if (!(c->source_index = take(&pos, end, 2 * n))) {
            return 0;
        }
        for (size_t i = 0; i < n; i++) {
            if (le16(c->source_index + 2 * i) > c->source_count) {
                return 0;
            }
        }
    }
    if (flags & FLAG_EXTERNAL_IDS) {
        if (!(c->id_bits = take(&pos, end, (n + 7) / 8)) || !(c->external_ids = take(&pos, end, 8 * n))) {
            return 0;
        }
    }
    if ((flags & FLAG_EXTERNAL_TIMES) && !(c->external_times = take(&pos, end, 8 * n))) {
        return 0;
    }
    if ((flags & FLAG_SEGMENTS) && !(c->segments = take(&pos, end, 8 * n))) {
        return 0;
    }
    if (flags & FLAG_HEADERS) {
        if (!(c->header_lengths = take(&pos, end, 4 * n))) {
            return 0;
        }
        c->headers = pos;
        for (size_t i = 0; i < n; i++) {
            if (!take(&pos, end, le32(c->header_lengths + 4 * i))) {
                return 0;
            }
        }
    }
    c->payloads = pos;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        total += le32(c->lengths + 4 * i);
    }
    return total == (size_t)(end - pos);
}

/* The next entry of a header map at *pos (u16 key length, key, u32 value length, value):
 * 1 with both, 0 when it runs past end. */
static int next_header(const unsigned char **pos, const unsigned char *end, Span *key, Span *value) {
    const unsigned char *at;
    if (!(at = take(pos, end, 2))) {
        return 0;
    }
    key->len = le16(at);
    if (!(key->text = take(pos, end, key->len)) || !(at = take(pos, end, 4))) {
        return 0;
    }
    value->len = le32(at);
    return (value->text = take(pos, end, value->len)) != NULL;
}

/* The columns of the body at data[body:end], as read_columns; 0 also for offsets outside the
 * buffer or ids that would pass 2**64 (Python's read refuses both before a kernel is called,
 * but a kernel trusts nothing it is given). */
static int read_batch(Columns *c, const Py_buffer *data, Py_ssize_t body, Py_ssize_t end, unsigned flags,
                      uint32_t count, unsigned long long base_id, const char *source, Py_ssize_t source_len) {
    memset(c, 0, sizeof *c);
    if (body < 0 || end < body || end > data->len || base_id > UINT64_MAX - count) {
        return 0;
    }
    const unsigned char *bytes = data->buf;
    return read_columns(c, bytes + body, bytes + end, flags, count, source, source_len);
}

/* One header map as a JSON object; 0 when it does not parse as _decode_headers reads it
 * (a repeated key included) or a key or value is not UTF-8. */
static int out_headers(Out *out, const unsigned char *map, size_t len) {
    if (len == 0) {
        if (out_reserve(out, 2) < 0) {
            return -1;
        }
        OUT_LITERAL(out, "{}");
        return 1;
    }
    const unsigned char *pos = map;
    const unsigned char *end = map + len;
    const unsigned char *at;
    if (!(at = take(&pos, end, 2))) {
        return 0;
    }
    uint16_t count = le16(at);
    /* Each entry's key, for the repeated-key check. */
    Span keys[64];
    Span *seen = count <= 64 ? keys : PyMem_Malloc(sizeof(Span) * count);
    if (seen == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int result = 0;
    if (out_reserve(out, 2 + (size_t)count) < 0) {
        result = -1;
        goto done;
    }
    OUT_LITERAL(out, "{");
    for (uint16_t k = 0; k < count; k++) {
        Span key, value;
        if (!next_header(&pos, end, &key, &value)) {
            goto done;
        }
        for (uint16_t j = 0; j < k; j++) {
            if (seen[j].len == key.len && memcmp(seen[j].text, key.text, key.len) == 0) {
                goto done;
            }
        }
        seen[k] = key;
        if (out_reserve(out, JSON_STRING_MAX(key.len) + JSON_STRING_MAX(value.len) + 2) < 0) {
            result = -1;
            goto done;
        }
        if (k > 0) {
            OUT_LITERAL(out, ",");
        }
        if (!out_json_string(out, key.text, key.len)) {
            goto done;
        }
        OUT_LITERAL(out, ":");
        if (!out_json_string(out, value.text, value.len)) {
            goto done;
        }
    }
    if (pos != end) {
        goto done;
    }
    OUT_LITERAL(out, "}");
    result = 1;
done:
    if (seen != keys) {
        PyMem_Free(seen);
    }
    return result;
}

/* --- batch_json ----------------------------------------------------------------------- */

/* Message i's JSON object, appended to out: 1, 0 (not handled: the caller answers None) or
 * -1 (a Python error is set). */
static int out_message(Out *out, const Columns *c, size_t i, uint64_t id, const char *time, int time_len,
                       const unsigned char **header_at, const unsigned char **payload_at) {
    size_t plen = le32(c->lengths + 4 * i);
    const Span *source = &c->sources[c->source_index ? le16(c->source_index + 2 * i) : 0];
    if (out_reserve(out, 256 + JSON_STRING_MAX(source->len) + JSON_STRING_MAX(plen)) < 0) {
        return -1;
    }
    int done;
    OUT_LITERAL(out, "{\"id\":");
    out_uint(out, id);
    OUT_LITERAL(out, ",\"time\":");
    out_put(out, time, (size_t)time_len);
    OUT_LITERAL(out, ",\"source\":");
    if (!out_json_string(out, source->text, source->len)) {
        return 0;
    }
    OUT_LITERAL(out, ",\"external_id\":");
    if (c->id_bits && (c->id_bits[i >> 3] >> (i & 7) & 1)) {
        out_int(out, (int64_t)le64(c->external_ids + 8 * i));
    } else {
        out_uint(out, id);
    }
    OUT_LITERAL(out, ",\"external_time\":");
    double external_time = c->external_times ? le_double(c->external_times + 8 * i) : NAN;
    if (external_time == external_time) {
        char text[33];
        if ((done = float_text(external_time, text)) <= 0) {
            return done;
        }
        out_put(out, text, (size_t)done);
    } else {
        out_put(out, time, (size_t)time_len);  /* NaN, or no column: the batch's time */
    }
    OUT_LITERAL(out, ",\"segment\":");
    out_int(out, c->segments ? (int64_t)le64(c->segments + 8 * i) : 0);
    OUT_LITERAL(out, ",\"headers\":");
    if (c->header_lengths) {
        size_t hlen = le32(c->header_lengths + 4 * i);
        if ((done = out_headers(out, *header_at, hlen)) != 1) {
            return done;
        }
        *header_at += hlen;
    } else {
        OUT_LITERAL(out, "{}");
    }
    if (out_reserve(out, 16 + JSON_STRING_MAX(plen)) < 0) {
        return -1;
    }
    OUT_LITERAL(out, ",\"data\":");
    if (!out_json_string(out, *payload_at, plen)) {
        return 0;
    }
    *payload_at += plen;
    OUT_LITERAL(out, "}");
    return 1;
}

static PyObject *batch_json(PyObject *Py_UNUSED(module), PyObject *args) {
    Py_buffer data;
    Py_ssize_t body, end;
    unsigned int flags, count;
    unsigned long long base_id;
    double base_time;
    const char *source;
    Py_ssize_t source_len;
    if (!PyArg_ParseTuple(args, "y*nnIIKds#", &data, &body, &end, &flags, &count, &base_id, &base_time,
                          &source, &source_len)) {
        return NULL;
    }
    PyObject *result = NULL;
    Out out = {NULL, 0, 0};
    Columns c = {0};
    int parsed = read_batch(&c, &data, body, end, flags, count, base_id, source, source_len);
    if (parsed <= 0) {
        result = parsed < 0 ? NULL : Py_NewRef(Py_None);
        goto done;
    }
    result = PyList_New(count);
    if (result == NULL) {
        goto done;
    }
    char time[33];
    int time_len = float_text(base_time, time);
    if (time_len <= 0) {
        Py_SETREF(result, time_len < 0 ? NULL : Py_NewRef(Py_None));
        goto done;
    }
    const unsigned char *header_at = c.headers;
    const unsigned char *payload_at = c.payloads;
    for (size_t i = 0; i < count; i++) {
        out.len = 0;
        int done = out_message(&out, &c, i, base_id + i, time, time_len, &header_at, &payload_at);
        if (done != 1) {
            Py_SETREF(result, done < 0 ? NULL : Py_NewRef(Py_None));
            goto done;
        }
        PyObject *object = PyBytes_FromStringAndSize(out.data, (Py_ssize_t)out.len);
        if (object == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, (Py_ssize_t)i, object);
    }
done:
    PyMem_Free(c.sources);
    PyMem_Free(out.data);
    PyBuffer_Release(&data);
    return result;
}

/* --- batch_messages ------------------------------------------------------------------ */

/* A str of UTF-8 text; NULL with no error set when it is not UTF-8 (the caller answers None). */
static PyObject *text_of(const unsigned char *text, size_t len) {
    PyObject *str = PyUnicode_DecodeUTF8((const char *)text, (Py_ssize_t)len, NULL);
    if (str == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear();
    }
    return str;
}

/* One header map as a dict; Py_None (a new reference) when it does not parse as
 * _decode_headers reads it (a repeated key included), NULL on a Python error. */
static PyObject *headers_of(const unsigned char *map, size_t len) {
    PyObject *headers = PyDict_New();
    if (headers == NULL || len == 0) {
        return headers;
    }
    const unsigned char *pos = map;
    const unsigned char *end = map + len;
    const unsigned char *at;
    if (!(at = take(&pos, end, 2))) {
        goto refused;
    }
    uint16_t count = le16(at);
    for (uint16_t k = 0; k < count; k++) {
        Span key_at, value_at;
        if (!next_header(&pos, end, &key_at, &value_at)) {
            goto refused;
        }
        PyObject *key = text_of(key_at.text, key_at.len);
        PyObject *value = key ? text_of(value_at.text, value_at.len) : NULL;
        int stored = -1;
        if (value != NULL) {
            int present = PyDict_Contains(headers, key);
            stored = present != 0 ? present : PyDict_SetItem(headers, key, value);
        }
        Py_XDECREF(key);
        Py_XDECREF(value);
        if (stored < 0) {
            if (PyErr_Occurred()) {
                Py_DECREF(headers);
                return NULL;
            }
            goto refused;
        }
        if (stored > 0) {
            goto refused; /* a repeated key */
        }
    }
    if (pos == end) {
        return headers;
    }
refused:
    Py_DECREF(headers);
    return Py_NewRef(Py_None);
}

/* The message at i as make(id, time, source, external_id, external_time, segment, headers,
 * data); Py_None (new) when Python must make it, NULL on a Python error. */
static PyObject *message_of(PyObject *make, const Columns *c, size_t i, uint64_t id, PyObject *time,
                            PyObject **sources, const unsigned char **header_at,
                            const unsigned char **payload_at) {
    PyObject *args[8] = {NULL};
    PyObject *result = NULL;
    size_t plen = le32(c->lengths + 4 * i);
    args[6] = c->header_lengths ? headers_of(*header_at, le32(c->header_lengths + 4 * i)) : PyDict_New();
    if (args[6] == NULL || args[6] == Py_None) {
        result = args[6] ? Py_NewRef(Py_None) : NULL;
        goto done;
    }
    if (c->header_lengths) {
        *header_at += le32(c->header_lengths + 4 * i);
    }
    args[7] = text_of(*payload_at, plen);
    if (args[7] == NULL) {
        result = PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
        goto done;
    }
    *payload_at += plen;
    args[0] = PyLong_FromUnsignedLongLong(id);
    if (c->id_bits && (c->id_bits[i >> 3] >> (i & 7) & 1)) {
        args[3] = PyLong_FromLongLong((long long)le64(c->external_ids + 8 * i));
    } else {
        args[3] = Py_XNewRef(args[0]);
    }
    double external_time = c->external_times ? le_double(c->external_times + 8 * i) : NAN;
    args[4] = external_time == external_time ? PyFloat_FromDouble(external_time) : Py_NewRef(time);
    args[5] = PyLong_FromLongLong(c->segments ? (long long)le64(c->segments + 8 * i) : 0);
    if (!args[0] || !args[3] || !args[4] || !args[5]) {
        goto done;
    }
    args[1] = Py_NewRef(time);
    args[2] = Py_NewRef(sources[c->source_index ? le16(c->source_index + 2 * i) : 0]);
    result = PyObject_Vectorcall(make, args, 8, NULL);
done:
    for (int k = 0; k < 8; k++) {
        Py_XDECREF(args[k]);
    }
    return result;
}

static PyObject *batch_messages(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *make;
    Py_buffer data;
    Py_ssize_t body, end;
    unsigned int flags, count;
    unsigned long long base_id;
    double base_time;
    PyObject *source;
    if (!PyArg_ParseTuple(args, "Oy*nnIIKdU", &make, &data, &body, &end, &flags, &count, &base_id, &base_time,
                          &source)) {
        return NULL;
    }
    PyObject *result = NULL;
    PyObject *time = NULL;
    PyObject **sources = NULL;
    Columns c = {0};
    int parsed = read_batch(&c, &data, body, end, flags, count, base_id, "", 0);
    if (parsed <= 0) {
        result = parsed < 0 ? NULL : Py_NewRef(Py_None);
        goto done;
    }
    sources = PyMem_Calloc((size_t)c.source_count + 1, sizeof(PyObject *));
    if (sources == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    sources[0] = Py_NewRef(source);
    for (size_t k = 1; k <= c.source_count; k++) {
        /* read_columns checked that every entry is UTF-8 */
        if (!(sources[k] = text_of(c.sources[k].text, c.sources[k].len))) {
            goto done;
        }
    }
    if (!(time = PyFloat_FromDouble(base_time)) || !(result = PyList_New(count))) {
        goto done;
    }
    const unsigned char *header_at = c.headers;
    const unsigned char *payload_at = c.payloads;
    for (size_t i = 0; i < count; i++) {
        PyObject *message = message_of(make, &c, i, base_id + i, time, sources, &header_at, &payload_at);
        if (message == NULL || message == Py_None) {
            Py_SETREF(result, message);
            goto done;
        }
        PyList_SET_ITEM(result, (Py_ssize_t)i, message);
    }
done:
    if (sources != NULL) {
        for (size_t k = 0; k <= c.source_count; k++) {
            Py_XDECREF(sources[k]);
        }
        PyMem_Free(sources);
    }
    Py_XDECREF(time);
    PyMem_Free(c.sources);
    PyBuffer_Release(&data);
    return result;
}

/* --- crc32 ---------------------------------------------------------------------------- */

static uint32_t crc_table[256];

static void crc_table_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
        }
        crc_table[n] = c;
    }
}

/* The running state is the complement of the crc, as inside zlib. */
static uint32_t crc_bytes(uint32_t state, const unsigned char *p, size_t n) {
    while (n--) {
        state = crc_table[(state ^ *p++) & 0xff] ^ (state >> 8);
    }
    return state;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_FOLD 1

/* The state after len bytes, len >= 64 and a multiple of 16: four lanes of 128 bits folded
 * 64 bytes at a time, then into one lane, then Barrett-reduced to 32 bits. The constants are
 * x^(k) mod P for the bit-reflected polynomial 0x104c11db7 (the paper's k1..k5, mu and P'). */
__attribute__((target("sse4.1,pclmul"))) static uint32_t crc_fold(uint32_t state, const unsigned char *buf,
                                                                 size_t len) {
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596, 0x0154442bd4);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009e, 0x01751997d0);
    const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124);
    const __m128i poly = _mm_set_epi64x(0x01f7011641, 0x01db710641);
    const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i x1 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
    __m128i x4 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
    __m128i x5;
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)state));
    buf += 64;
    len -= 64;
    while (len >= 64) {
        __m128i x6, x7, x8;
        x5 = _mm_clmulepi64_si128(x1, k1k2, 0x00);
        x6 = _mm_clmulepi64_si128(x2, k1k2, 0x00);
        x7 = _mm_clmulepi64_si128(x3, k1k2, 0x00);
        x8 = _mm_clmulepi64_si128(x4, k1k2, 0x00);
        x1 = _mm_clmulepi64_si128(x1, k1k2, 0x11);
        x2 = _mm_clmulepi64_si128(x2, k1k2, 0x11);
        x3 = _mm_clmulepi64_si128(x3, k1k2, 0x11);
        x4 = _mm_clmulepi64_si128(x4, k1k2, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), _mm_loadu_si128((const __m128i *)(buf + 0x00)));
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), _mm_loadu_si128((const __m128i *)(buf + 0x10)));
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), _mm_loadu_si128((const __m128i *)(buf + 0x20)));
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), _mm_loadu_si128((const __m128i *)(buf + 0x30)));
        buf += 64;
        len -= 64;
    }
    /* Four lanes into one. */
    x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), x2), x5);
    x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), x3), x5);
    x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), x4), x5);
    while (len >= 16) {
        x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
        x1 = _mm_clmulepi64_si128(x1, k3k4, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, _mm_loadu_si128((const __m128i *)buf)), x5);
        buf += 16;
        len -= 16;
    }
    /* 128 bits to 64, then 64 to 32. */
    x2 = _mm_clmulepi64_si128(x1, k3k4, 0x10);
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, low32);
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(x1, k5k0, 0x00), x2);
    /* Barrett reduction. */
    x2 = _mm_and_si128(x1, low32);
    x2 = _mm_clmulepi64_si128(x2, poly, 0x10);
    x2 = _mm_and_si128(x2, low32);
    x2 = _mm_clmulepi64_si128(x2, poly, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}
#else
#define HAVE_FOLD 0
#endif

static int fold_usable;

static uint32_t crc_update(uint32_t crc, const unsigned char *p, size_t n) {
    uint32_t state = ~crc;
#if HAVE_FOLD
    if (fold_usable && n >= 64) {
        size_t folded = n & ~(size_t)15;
        state = crc_fold(state, p, folded);
        p += folded;
        n -= folded;
    }
#endif
    return ~crc_bytes(state, p, n);
}

static PyObject *crc32(PyObject *Py_UNUSED(module), PyObject *args) {
    Py_buffer data;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, "y*|I:crc32", &data, &value)) {
        return NULL;
    }
    uint32_t crc;
    if (data.len > 5 * 1024) {
        Py_BEGIN_ALLOW_THREADS
        crc = crc_update((uint32_t)value, data.buf, (size_t)data.len);
        Py_END_ALLOW_THREADS
    } else {
        crc = crc_update((uint32_t)value, data.buf, (size_t)data.len);
    }
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

/* --- crc32c --------------------------------------------------------------------------- */

/* Slicing-by-8 tables for the reflected Castagnoli polynomial 0x82f63b78: crc32c_table[k][b]
 * is the state after byte b followed by k zero bytes. */
static uint32_t crc32c_table[8][256];

static void crc32c_table_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? 0x82f63b78u ^ (c >> 1) : c >> 1;
        }
        crc32c_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        for (int k = 1; k < 8; k++) {
            uint32_t c = crc32c_table[k - 1][n];
            crc32c_table[k][n] = (c >> 8) ^ crc32c_table[0][c & 0xff];
        }
    }
}

/* The running state (the complement of the crc), eight bytes a step; le32 keeps it right on
 * a big-endian host too. */
static uint32_t crc32c_sliced(uint32_t state, const unsigned char *p, size_t n) {
    while (n >= 8) {
        uint32_t lo = le32(p) ^ state;
        uint32_t hi = le32(p + 4);
        state = crc32c_table[7][lo & 0xff] ^ crc32c_table[6][(lo >> 8) & 0xff] ^
                crc32c_table[5][(lo >> 16) & 0xff] ^ crc32c_table[4][lo >> 24] ^ crc32c_table[3][hi & 0xff] ^
                crc32c_table[2][(hi >> 8) & 0xff] ^ crc32c_table[1][(hi >> 16) & 0xff] ^
                crc32c_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) {
        state = crc32c_table[0][(state ^ *p++) & 0xff] ^ (state >> 8);
    }
    return state;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define HAVE_CRC32C_INSTRUCTION 1

/* The crc32 instruction takes three cycles and can start one each cycle, so three streams run
 * side by side over three neighbouring stretches and are joined after: the state of A then B
 * is the state of A moved over len(B) zero bytes, xor the state of B started from zero (the
 * register is linear). Moving over a fixed number of zeros is a 32x32 matrix over GF(2),
 * applied a byte at a time through four tables (Mark Adler's crc32c.c, zlib's crc32_combine). */
#define CRC32C_LONG 8192
#define CRC32C_SHORT 256

static uint32_t crc32c_long[4][256];
static uint32_t crc32c_short[4][256];

static uint32_t gf2_times(const uint32_t *matrix, uint32_t vector) {
    uint32_t sum = 0;
    while (vector) {
        if (vector & 1) {
            sum ^= *matrix;
        }
        vector >>= 1;
        matrix++;
    }
    return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *matrix) {
    for (int n = 0; n < 32; n++) {
        square[n] = gf2_times(matrix, matrix[n]);
    }
}

/* The operator that moves a state over len zero bytes (len a power of two). */
static void crc32c_zeros_operator(uint32_t *even, size_t len) {
    uint32_t odd[32];
    uint32_t row = 1;
    odd[0] = 0x82f63b78u; /* one zero bit */
    for (int n = 1; n < 32; n++) {
        odd[n] = row;
        row <<= 1;
    }
    gf2_square(even, odd); /* two zero bits */
    gf2_square(odd, even); /* four */
    /* Each square doubles the bits: the first in the loop gives one zero byte. */
    do {
        gf2_square(even, odd);
        len >>= 1;
        if (len == 0) {
            return;
        }
        gf2_square(odd, even);
        len >>= 1;
    } while (len);
    memcpy(even, odd, sizeof odd);
}

static void crc32c_zeros(uint32_t zeros[4][256], size_t len) {
    uint32_t op[32];
    crc32c_zeros_operator(op, len);
    for (uint32_t n = 0; n < 256; n++) {
        zeros[0][n] = gf2_times(op, n);
        zeros[1][n] = gf2_times(op, n << 8);
        zeros[2][n] = gf2_times(op, n << 16);
        zeros[3][n] = gf2_times(op, n << 24);
    }
}

static uint32_t crc32c_shift(uint32_t zeros[4][256], uint32_t state) {
    return zeros[0][state & 0xff] ^ zeros[1][(state >> 8) & 0xff] ^ zeros[2][(state >> 16) & 0xff] ^
           zeros[3][state >> 24];
}

__attribute__((target("sse4.2"))) static uint64_t crc32c_three(uint64_t state, const unsigned char **at,
                                                              size_t *left, size_t stretch,
                                                              uint32_t zeros[4][256]) {
    const unsigned char *p = *at;
    size_t n = *left;
    while (n >= 3 * stretch) {
        uint64_t one = 0, two = 0, word;
        const unsigned char *end = p + stretch;
        do {
            memcpy(&word, p, 8);
            state = _mm_crc32_u64(state, word);
            memcpy(&word, p + stretch, 8);
            one = _mm_crc32_u64(one, word);
            memcpy(&word, p + 2 * stretch, 8);
            two = _mm_crc32_u64(two, word);
            p += 8;
        } while (p < end);
        state = crc32c_shift(zeros, (uint32_t)state) ^ (uint32_t)one;
        state = crc32c_shift(zeros, (uint32_t)state) ^ (uint32_t)two;
        p += 2 * stretch;
        n -= 3 * stretch;
    }
    *at = p;
    *left = n;
    return state;
}

/* Bytes up to an eight-byte boundary first, so the loads in the loops are aligned; three
 * streams over 3 x 8 KiB, then 3 x 256 bytes, then one over the rest. */
__attribute__((target("sse4.2"))) static uint32_t crc32c_instruction(uint32_t state, const unsigned char *p,
                                                                    size_t n) {
    while (n && ((uintptr_t)p & 7)) {
        state = _mm_crc32_u8(state, *p++);
        n--;
    }
    uint64_t wide = state;
    wide = crc32c_three(wide, &p, &n, CRC32C_LONG, crc32c_long);
    wide = crc32c_three(wide, &p, &n, CRC32C_SHORT, crc32c_short);
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, sizeof word);
        wide = _mm_crc32_u64(wide, word);
        p += 8;
        n -= 8;
    }
    state = (uint32_t)wide;
    while (n--) {
        state = _mm_crc32_u8(state, *p++);
    }
    return state;
}
#else
#define HAVE_CRC32C_INSTRUCTION 0
#endif

static int crc32c_instruction_usable;

static uint32_t crc32c_update(uint32_t crc, const unsigned char *p, size_t n) {
#if HAVE_CRC32C_INSTRUCTION
    if (crc32c_instruction_usable) {
        return ~crc32c_instruction(~crc, p, n);
    }
#endif
    return ~crc32c_sliced(~crc, p, n);
}

static uint32_t crc32c_update_sliced(uint32_t crc, const unsigned char *p, size_t n) {
    return ~crc32c_sliced(~crc, p, n);
}

static PyObject *crc32c_with(uint32_t (*update)(uint32_t, const unsigned char *, size_t), PyObject *args,
                             const char *format) {
    Py_buffer data;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, format, &data, &value)) {
        return NULL;
    }
    uint32_t crc;
    if (data.len > 5 * 1024) {
        Py_BEGIN_ALLOW_THREADS
        crc = update((uint32_t)value, data.buf, (size_t)data.len);
        Py_END_ALLOW_THREADS
    } else {
        crc = update((uint32_t)value, data.buf, (size_t)data.len);
    }
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

static PyObject *crc32c(PyObject *Py_UNUSED(module), PyObject *args) {
    return crc32c_with(crc32c_update, args, "y*|I:crc32c");
}

/* The table path alone: what a CPU without SSE4.2 (any ARM) runs, so that tests on x86 check it too. */
static PyObject *crc32c_tables(PyObject *Py_UNUSED(module), PyObject *args) {
    return crc32c_with(crc32c_update_sliced, args, "y*|I:crc32c_tables");
}

/* --- Kafka records (capella/kafka/records.py) -------------------------------------------- */

/* Kafka's varint: the value zigzagged, then 7 bits a byte, low first. */
static size_t varint_size(int64_t value) {
    uint64_t z = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    size_t n = 1;
    while (z >= 0x80) {
        z >>= 7;
        n++;
    }
    return n;
}

static void out_varint(Out *out, int64_t value) {
    uint64_t z = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    unsigned char *p = (unsigned char *)out->data + out->len;
    while (z >= 0x80) {
        *p++ = (unsigned char)(z | 0x80);
        z >>= 7;
    }
    *p++ = (unsigned char)z;
    out->len = (size_t)((char *)p - out->data);
}

#define KAFKA_MS_LIMIT ((int64_t)1 << 62)

/* An external time (s) as Kafka's CreateTime (ms): Python's round(t * 1000), clamped. */
static int64_t create_time(double seconds) {
    double ms = nearbyint(seconds * 1000.0);
    if (!(ms > -(double)KAFKA_MS_LIMIT)) { /* NaN too */
        return ms != ms ? 0 : -KAFKA_MS_LIMIT;
    }
    if (ms >= (double)KAFKA_MS_LIMIT) {
        return KAFKA_MS_LIMIT;
    }
    return (int64_t)ms;
}

/* One Kafka record to write: its key (length first), value (NULL: a null value), headers
 * (count first) and CreateTime; parts holds what slow() gave, if it was called. */
typedef struct {
    const char *key;
    Py_ssize_t key_len;
    const char *value;
    Py_ssize_t value_len; /* -1: null */
    const char *headers;
    Py_ssize_t headers_len;
    int64_t ms;
    PyObject *parts;
} KafkaRecord;

static void record_plain(KafkaRecord *r, const char *value, Py_ssize_t value_len, int64_t ms) {
    r->key = "\x01"; /* a null key: length -1 */
    r->key_len = 1;
    r->value = value;
    r->value_len = value_len;
    r->headers = "\x00"; /* no headers */
    r->headers_len = 1;
    r->ms = ms;
    r->parts = NULL;
}

/* A message with headers mapped by slow(headers, payload, ms) -> (key_part, value or None, ms,
 * header_part): 0, or 1 when Python must render the batch, -1 on a Python error. */
static int record_mapped(KafkaRecord *r, PyObject *slow, PyObject *h, PyObject *payload, int64_t ms) {
    PyObject *ms_object = PyLong_FromLongLong(ms);
    if (ms_object == NULL) {
        return -1;
    }
    PyObject *parts = PyObject_CallFunctionObjArgs(slow, h, payload, ms_object, NULL);
    Py_DECREF(ms_object);
    if (parts == NULL) {
        return -1;
    }
    r->parts = parts;
    PyObject *k, *v, *m, *hp;
    if (!PyTuple_Check(parts) || PyTuple_GET_SIZE(parts) != 4 || !PyBytes_Check(k = PyTuple_GET_ITEM(parts, 0)) ||
        !(PyBytes_Check(v = PyTuple_GET_ITEM(parts, 1)) || v == Py_None) ||
        !PyLong_Check(m = PyTuple_GET_ITEM(parts, 2)) || !PyBytes_Check(hp = PyTuple_GET_ITEM(parts, 3))) {
        PyErr_SetString(PyExc_TypeError, "kafka records: slow() must give (bytes, bytes | None, int, bytes)");
        return -1;
    }
    r->key = PyBytes_AS_STRING(k);
    r->key_len = PyBytes_GET_SIZE(k);
    r->headers = PyBytes_AS_STRING(hp);
    r->headers_len = PyBytes_GET_SIZE(hp);
    r->value = v == Py_None ? NULL : PyBytes_AS_STRING(v);
    r->value_len = v == Py_None ? -1 : PyBytes_GET_SIZE(v);
    int overflow = 0;
    r->ms = PyLong_AsLongLongAndOverflow(m, &overflow);
    return overflow ? 1 : 0;
}

/* The record at offset delta id - first_id, after the batch's base time: 0, 1 when a delta
 * does not fit Kafka's varlong (Python renders it), -1 on no memory. */
static int record_put(Out *out, const KafkaRecord *r, int64_t offset_delta, int64_t base_time) {
    int64_t time_delta;
    if (__builtin_sub_overflow(r->ms, base_time, &time_delta)) {
        return 1;
    }
    size_t body = 1 + varint_size(time_delta) + varint_size(offset_delta) + (size_t)r->key_len +
                  varint_size(r->value_len) + (r->value_len > 0 ? (size_t)r->value_len : 0) + (size_t)r->headers_len;
    if (out_reserve(out, body + 10) < 0) {
        return -1;
    }
    out_varint(out, (int64_t)body);
    out->data[out->len++] = 0; /* attributes */
    out_varint(out, time_delta);
    out_varint(out, offset_delta);
    out_put(out, r->key, (size_t)r->key_len);
    out_varint(out, r->value_len);
    if (r->value_len > 0) {
        out_put(out, r->value, (size_t)r->value_len);
    }
    out_put(out, r->headers, (size_t)r->headers_len);
    return 0;
}

/* What the two kernels answer: (records, base_time, max_time); None for Python to render. */
static PyObject *records_made(Out *out, int status, int64_t base_time, int64_t max_time) {
    PyObject *result = NULL;
    if (status > 0) {
        result = Py_NewRef(Py_None);
    } else if (status == 0) {
        PyObject *records = PyBytes_FromStringAndSize(out->data, (Py_ssize_t)out->len);
        result = records ? Py_BuildValue("NLL", records, (long long)base_time, (long long)max_time) : NULL;
    }
    PyMem_Free(out->data);
    return result;
}

/* kafka_records(ids, external_times, payloads, headers, start, stop, slow): the records of a
   Kafka batch for messages start..stop of a batch's columns. */
static PyObject *kafka_records(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *ids, *times, *payloads, *headers, *slow;
    Py_ssize_t start, stop;
    if (!PyArg_ParseTuple(args, "O!O!O!O!nnO:kafka_records", &PyList_Type, &ids, &PyList_Type, &times, &PyList_Type,
                          &payloads, &PyList_Type, &headers, &start, &stop, &slow)) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(ids);
    if (start < 0 || stop <= start || stop > n || PyList_GET_SIZE(times) < stop || PyList_GET_SIZE(payloads) < stop ||
        PyList_GET_SIZE(headers) < stop) {
        PyErr_SetString(PyExc_ValueError, "kafka_records: start and stop outside the columns");
        return NULL;
    }
    Out out = {NULL, 0, 0};
    int64_t first_id = 0, base_time = 0, max_time = 0;
    int status = 0;
    for (Py_ssize_t i = start; i < stop && status == 0; i++) {
        PyObject *id_object = PyList_GET_ITEM(ids, i);
        PyObject *time_object = PyList_GET_ITEM(times, i);
        PyObject *payload = PyList_GET_ITEM(payloads, i);
        PyObject *h = PyList_GET_ITEM(headers, i);
        int overflow = 0;
        int64_t id;
        if (!PyLong_Check(id_object) || !PyFloat_Check(time_object) || !PyBytes_Check(payload) || !PyDict_Check(h) ||
            ((id = PyLong_AsLongLongAndOverflow(id_object, &overflow)), overflow)) {
            status = 1;
            break;
        }
        int64_t ms = create_time(PyFloat_AS_DOUBLE(time_object));
        KafkaRecord r;
        record_plain(&r, PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload), ms);
        if (PyDict_GET_SIZE(h) != 0) {
            status = record_mapped(&r, slow, h, payload, ms);
        }
        if (status == 0) {
            if (i == start) {
                first_id = id;
                base_time = max_time = r.ms;
            } else if (r.ms > max_time) {
                max_time = r.ms;
            }
            int64_t offset_delta;
            status = __builtin_sub_overflow(id, first_id, &offset_delta) ? 1 : record_put(&out, &r, offset_delta, base_time);
        }
        Py_XDECREF(r.parts);
    }
    return records_made(&out, status, base_time, max_time);
}

/* kafka_batch_records(slow, data, body, end, flags, count, base_id, base_time): the records of
   a Kafka batch for every message of a stored record batch, read from its body as
   batch_messages reads it; None where Python reads it (a body that does not parse). */
static PyObject *kafka_batch_records(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *slow;
    Py_buffer data;
    Py_ssize_t body, end;
    unsigned int flags, count;
    unsigned long long base_id;
    double batch_time;
    if (!PyArg_ParseTuple(args, "Oy*nnIIKd:kafka_batch_records", &slow, &data, &body, &end, &flags, &count, &base_id,
                          &batch_time)) {
        return NULL;
    }
    Out out = {NULL, 0, 0};
    int64_t base_time = 0, max_time = 0;
    Columns c = {0};
    int parsed = read_batch(&c, &data, body, end, flags, count, base_id, "", 0);
    int status = parsed < 0 ? -1 : parsed == 0 ? 1 : 0;
    const unsigned char *header_at = c.headers;
    const unsigned char *payload_at = c.payloads;
    for (size_t i = 0; i < count && status == 0; i++) {
        size_t plen = le32(c.lengths + 4 * i);
        size_t hlen = c.header_lengths ? le32(c.header_lengths + 4 * i) : 0;
        double external_time = c.external_times ? le_double(c.external_times + 8 * i) : NAN;
        int64_t ms = create_time(external_time == external_time ? external_time : batch_time);
        KafkaRecord r;
        record_plain(&r, (const char *)payload_at, (Py_ssize_t)plen, ms);
        if (hlen) {
            PyObject *h = headers_of(header_at, hlen);
            if (h == NULL || h == Py_None) {
                status = h ? 1 : -1;
            } else if (PyDict_GET_SIZE(h) != 0) {
                PyObject *payload = PyBytes_FromStringAndSize((const char *)payload_at, (Py_ssize_t)plen);
                status = payload ? record_mapped(&r, slow, h, payload, ms) : -1;
                Py_XDECREF(payload);
            }
            Py_XDECREF(h);
            header_at += hlen;
        }
        if (status == 0) {
            if (i == 0) {
                base_time = max_time = r.ms;
            } else if (r.ms > max_time) {
                max_time = r.ms;
            }
            status = record_put(&out, &r, (int64_t)i, base_time);
        }
        Py_XDECREF(r.parts);
        payload_at += plen;
    }
    PyMem_Free(c.sources);
    PyBuffer_Release(&data);
    return records_made(&out, status, base_time, max_time);
}

static PyMethodDef methods[] = {
    {"batch_json", batch_json, METH_VARARGS,
     "Each message of a record batch as its StoredMessage JSON object; None where Python renders it."},
    {"batch_messages", batch_messages, METH_VARARGS,
     "Each message of a record batch made by a callable of its fields; None where Python makes them."},
    {"crc32", crc32, METH_VARARGS, "zlib.crc32's answer, folded with PCLMULQDQ where the CPU has it."},
    {"crc32c", crc32c, METH_VARARGS, "CRC-32C (Castagnoli), running like zlib.crc32; SSE4.2 where the CPU has it."},
    {"crc32c_tables", crc32c_tables, METH_VARARGS, "crc32c by its slicing-by-8 tables alone (for tests)."},
    {"kafka_records", kafka_records, METH_VARARGS, "The records of a Kafka batch from a run of messages' columns; None where Python renders them."},
    {"kafka_batch_records", kafka_batch_records, METH_VARARGS,
     "The records of a Kafka batch from a stored record batch; None where Python renders them."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "capella._kernels", "Optional C kernels (capella/kernels.py).", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kernels(void) {
    crc_table_init();
    crc32c_table_init();
#if HAVE_FOLD || HAVE_CRC32C_INSTRUCTION
    __builtin_cpu_init();
#endif
#if HAVE_FOLD
    fold_usable = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
#if HAVE_CRC32C_INSTRUCTION
    crc32c_instruction_usable = __builtin_cpu_supports("sse4.2");
    crc32c_zeros(crc32c_long, CRC32C_LONG);
    crc32c_zeros(crc32c_short, CRC32C_SHORT);
#endif
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddObjectRef(m, "FAST_CRC32", fold_usable ? Py_True : Py_False) < 0 ||
                      PyModule_AddObjectRef(m, "FAST_CRC32C", crc32c_instruction_usable ? Py_True : Py_False) < 0)) {
        Py_CLEAR(m);
    }
    return m;
}
