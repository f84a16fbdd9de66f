/* The snapshot and the history: the JSON file parses (with a strict parser written here, and with python3 too when
 * there is one), and holds the segments, blocks, states, tags and events that a known sequence must produce. */
#include <stdint.h>

#include "check.h"
#include "deft_testing.h"
#include "read_file.h"

#define KiB ((size_t)1024)
#define MiB ((size_t)1024 * 1024)

/* ---- a strict JSON parser into a small tree (RFC 8259: no trailing commas, no leading zeros, no raw control
 * characters in strings, valid escapes and UTF-8) ---- */

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jval {
    jtype type;
    double num;
    char *str;               /* J_STR: decoded UTF-8 */
    int n;                   /* J_ARR, J_OBJ: members */
    struct jval *items;
    char **keys;             /* J_OBJ */
} jval;

typedef struct jparser {
    const char *s;
    int depth;
} jparser;

static int j_value(jparser *p, jval *out);

static void j_ws(jparser *p) {
    while (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r') p->s++;
}

static int j_hex4(const char *s, unsigned *out) {
    *out = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int v = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (v < 0) return 0;
        *out = *out * 16 + (unsigned)v;
    }
    return 1;
}

static char *j_put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) *o++ = (char)cp;
    else if (cp < 0x800) *o++ = (char)(0xC0 | cp >> 6), *o++ = (char)(0x80 | (cp & 0x3F));
    else *o++ = (char)(0xE0 | cp >> 12), *o++ = (char)(0x80 | ((cp >> 6) & 0x3F)), *o++ = (char)(0x80 | (cp & 0x3F));
    return o;
}

/* Length of a valid UTF-8 sequence starting at s (>= 0x80), or 0. */
static int j_utf8_len(const unsigned char *s) {
    int n = s[0] >= 0xC2 && s[0] <= 0xDF ? 2 : s[0] >= 0xE0 && s[0] <= 0xEF ? 3 : s[0] >= 0xF0 && s[0] <= 0xF4 ? 4 : 0;
    unsigned char lo = s[0] == 0xE0 ? 0xA0 : s[0] == 0xF0 ? 0x90 : 0x80;
    unsigned char hi = s[0] == 0xED ? 0x9F : s[0] == 0xF4 ? 0x8F : 0xBF;
    if (!n || s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return n;
}

static int j_escape(jparser *p, char **o) {
    char c = *p->s++;
    const char *simple = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
    const char *k = c ? strchr(simple, c) : NULL;
    if (k) {
        *(*o)++ = to[k - simple];
        return 1;
    }
    unsigned cp;
    if (c != 'u' || !j_hex4(p->s, &cp) || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;   /* no surrogates here */
    p->s += 4;
    *o = j_put_utf8(*o, cp);
    return 1;
}

static int j_string(jparser *p, char **out) {
    if (*p->s != '"') return 0;
    p->s++;
    char *buf = malloc(strlen(p->s) * 3 + 1), *o = buf;
    int ok = buf != NULL;
    while (ok && *p->s != '"') {
        unsigned char c = (unsigned char)*p->s;
        int n;
        if (c < 0x20) {
            ok = 0;   /* raw control characters (and the end of the text) are not allowed */
        } else if (c == '\\') {
            p->s++;
            ok = j_escape(p, &o);
        } else if (c < 0x80) {
            *o++ = *p->s++;
        } else if ((n = j_utf8_len((const unsigned char *)p->s))) {
            memcpy(o, p->s, (size_t)n), o += n, p->s += n;
        } else {
            ok = 0;
        }
    }
    if (!ok) {
        free(buf);
        return 0;
    }
    p->s++;
    *o = '\0';
    *out = buf;
    return 1;
}

static int j_digits(jparser *p) {
    const char *start = p->s;
    while (*p->s >= '0' && *p->s <= '9') p->s++;
    return p->s > start;
}

static int j_number(jparser *p, jval *out) {
    const char *start = p->s;
    if (*p->s == '-') p->s++;
    if (*p->s == '0') p->s++;
    else if (!j_digits(p)) return 0;
    if (*p->s == '.' && (p->s++, !j_digits(p))) return 0;
    if (*p->s == 'e' || *p->s == 'E') {
        p->s++;
        if (*p->s == '+' || *p->s == '-') p->s++;
        if (!j_digits(p)) return 0;
    }
    out->type = J_NUM;
    out->num = strtod(start, NULL);
    return 1;
}

static int j_push(jval *v, char *key) {
    jval *items = realloc(v->items, (size_t)(v->n + 1) * sizeof *items);
    if (!items) return 0;
    v->items = items;
    memset(&v->items[v->n], 0, sizeof *items);
    if (v->type == J_OBJ) {
        char **keys = realloc(v->keys, (size_t)(v->n + 1) * sizeof *keys);
        if (!keys) return 0;
        v->keys = keys;
        v->keys[v->n] = key;
    }
    v->n++;
    return 1;
}

/* Arrays and objects: members separated by commas, no trailing comma. */
static int j_container(jparser *p, jval *out, jtype type) {
    char close = type == J_ARR ? ']' : '}';
    out->type = type;
    p->s++;
    j_ws(p);
    if (*p->s == close) return p->s++, 1;
    for (;;) {
        char *key = NULL;
        if (type == J_OBJ) {
            if (!j_string(p, &key)) return 0;
            j_ws(p);
            if (*p->s++ != ':' || !j_push(out, key)) return free(key), 0;
        } else if (!j_push(out, NULL)) {
            return 0;
        }
        if (!j_value(p, &out->items[out->n - 1])) return 0;
        j_ws(p);
        if (*p->s == close) return p->s++, 1;
        if (*p->s++ != ',') return 0;
        j_ws(p);
    }
}

static int j_literal(jparser *p, const char *word, jtype type, jval *out) {
    size_t n = strlen(word);
    if (strncmp(p->s, word, n) != 0) return 0;
    p->s += n;
    out->type = type;
    out->num = word[0] == 't';
    return 1;
}

static int j_value(jparser *p, jval *out) {
    memset(out, 0, sizeof *out);
    if (++p->depth > 64) return 0;
    j_ws(p);
    int ok;
    switch (*p->s) {
    case '{': ok = j_container(p, out, J_OBJ); break;
    case '[': ok = j_container(p, out, J_ARR); break;
    case '"': out->type = J_STR, ok = j_string(p, &out->str); break;
    case 't': ok = j_literal(p, "true", J_BOOL, out); break;
    case 'f': ok = j_literal(p, "false", J_BOOL, out); break;
    case 'n': ok = j_literal(p, "null", J_NULL, out); break;
    default: ok = j_number(p, out);
    }
    p->depth--;
    return ok;
}

static void j_free(jval *v) {
    for (int i = 0; i < v->n; i++) {
        j_free(&v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->str);
}

/* The whole text must be one value. */
static int j_parse(const char *text, jval *out) {
    jparser p = {text, 0};
    int ok = j_value(&p, out);
    j_ws(&p);
    if (ok && *p.s == '\0') return 1;
    j_free(out);
    memset(out, 0, sizeof *out);
    return 0;
}

static const jval *j_get(const jval *v, const char *key) {
    if (!v || v->type != J_OBJ) return NULL;
    for (int i = 0; i < v->n; i++)
        if (strcmp(v->keys[i], key) == 0) return &v->items[i];
    return NULL;
}

static const jval *j_at(const jval *v, int i) { return v && v->type == J_ARR && i < v->n ? &v->items[i] : NULL; }

static double j_num(const jval *v, const char *key) {
    const jval *m = j_get(v, key);
    return m && m->type == J_NUM ? m->num : -1;
}

static const char *j_str(const jval *v, const char *key) {
    const jval *m = j_get(v, key);
    return m && m->type == J_STR ? m->str : "";
}

static int j_len(const jval *v) { return v && v->type == J_ARR ? v->n : -1; }

/* ---- tests ---- */

static int parse_file(const char *path, jval *out) {
    char *text = read_file(path);
    int ok = text && j_parse(text, out);
    CHECK_MSG(ok, "%s is not valid JSON:\n%s", path, text ? text : "(unreadable)");
    free(text);
    return ok;
}

/* A second opinion where python3 exists; the C parser above is the check that always runs. */
static void python_agrees(const char *path) {
    if (system("command -v python3 >/dev/null 2>&1") != 0) return;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "python3 -c 'import json,sys; json.load(open(sys.argv[1], encoding=\"utf-8\"))' %s",
             path);
    CHECK_MSG(system(cmd) == 0, "python3's json module rejects %s", path);
}

static void test_parser_rejects(void) {
    static const char *const bad[] = {"", "{", "[1,]", "{\"a\":1,}", "01", "1.", "\"a\nb\"", "\"\\x\"", "[1 2]",
                                      "{\"a\" 1}", "\"\xff\"", "\"\\ud800\"", "tru", "[] []", "-", "{1:2}"};
    static const char *const good[] = {"{}", "[]", "0", "-1.5e3", "\"\\u00e9\\n\"", "{\"a\":[true,false,null]}",
                                       "\"\xc3\xa9\""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        jval v;
        CHECK_MSG(!j_parse(bad[i], &v), "the parser accepts %s", bad[i]);
    }
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        jval v;
        int ok = j_parse(good[i], &v);
        CHECK_MSG(ok, "the parser rejects %s", good[i]);
        if (ok) j_free(&v);
    }
}

/* Fake events, so that one block is seen waiting on another stream. */
static int fake_done;
static deft_status fake_record(int index, void *stream, void **event) {
    (void)index, (void)stream;
    *event = &fake_done;
    return DEFT_OK;
}
static int fake_query(int index, void *event) {
    (void)index;
    return *(int *)event;
}
static void fake_wait(int index, void *event) {
    (void)index;
    *(int *)event = 1;
}
static void fake_destroy(int index, void *event) { (void)index, (void)event; }
static const deft_testing_event_hooks fake_hooks = {fake_record, fake_query, fake_wait, fake_destroy};

#define ODD_TAG "say \"hi\"\\ \n\t\x01 caf\xc3\xa9 \xff!"
#define ODD_TAG_DECODED "say \"hi\"\\ \n\t\x01 caf\xc3\xa9 \xef\xbf\xbd!"

static void *must_alloc(size_t bytes, void *stream, const char *tag) {
    void *p = NULL;
    CHECK_OK(deft_caching_alloc(deft_cpu(), bytes, stream, tag, &p));
    return p;
}

static void check_block(const jval *b, double offset, double size, double requested, const char *state,
                        const char *tag) {
    CHECK_MSG(j_num(b, "offset") == offset && j_num(b, "size") == size && j_num(b, "requested_size") == requested,
              "block at offset %.0f size %.0f requested %.0f; wanted %.0f %.0f %.0f", j_num(b, "offset"),
              j_num(b, "size"), j_num(b, "requested_size"), offset, size, requested);
    CHECK_MSG(strcmp(j_str(b, "state"), state) == 0, "state %s, wanted %s", j_str(b, "state"), state);
    CHECK_MSG(strcmp(j_str(b, "tag"), tag) == 0, "tag \"%s\", wanted \"%s\"", j_str(b, "tag"), tag);
}

static void check_devices(const jval *root, uintptr_t small_base, uintptr_t large_base) {
    const jval *cpu = j_at(j_get(root, "devices"), 0);
    CHECK(j_len(j_get(root, "devices")) == 1 && strcmp(j_str(cpu, "device"), "cpu") == 0);
    const jval *segs = j_get(cpu, "segments");
    CHECK(j_len(segs) == 2);
    const jval *small = j_at(segs, 0), *large = j_at(segs, 1);
    CHECK(j_num(small, "address") == (double)small_base && j_num(small, "total_size") == (double)(2 * MiB));
    CHECK(strcmp(j_str(small, "pool"), "small") == 0 && j_num(small, "stream") == 0);
    const jval *blocks = j_get(small, "blocks");
    CHECK(j_len(blocks) == 4);
    check_block(j_at(blocks, 0), 0, 1024, 0, "inactive", "");
    check_block(j_at(blocks, 1), 1024, 512, 100, "active_allocated", ODD_TAG_DECODED);
    check_block(j_at(blocks, 2), 1536, 512, 10, "active_pending_free", "waits");
    check_block(j_at(blocks, 3), 2048, (double)(2 * MiB - 2048), 0, "inactive", "");
    CHECK(j_num(j_at(blocks, 1), "address") == (double)(small_base + 1024));
    CHECK(j_num(large, "address") == (double)large_base && j_num(large, "total_size") == (double)(20 * MiB));
    CHECK(j_len(j_get(large, "blocks")) == 2);
    check_block(j_at(j_get(large, "blocks"), 0), 0, (double)(3 * MiB), (double)(3 * MiB), "active_allocated",
                "arena:cpu");
    const jval *stats = j_get(cpu, "stats");
    CHECK(j_num(j_get(stats, "allocated_bytes"), "current") == (double)(3 * MiB + 512));
    CHECK(j_num(j_get(stats, "active_bytes"), "current") == (double)(3 * MiB + 1024));
    CHECK(j_num(j_get(stats, "reserved_bytes"), "current") == (double)(22 * MiB));
    CHECK(j_num(j_get(stats, "requested_bytes"), "freed") == 1000 + 10);
    CHECK(j_num(stats, "num_device_alloc") == 2 && j_num(stats, "num_ooms") == 0);
}

static void check_event(const jval *e, const char *action, double size, const char *tag) {
    CHECK_MSG(strcmp(j_str(e, "action"), action) == 0 && j_num(e, "size") == size && strcmp(j_str(e, "tag"), tag) == 0,
              "event %s %.0f \"%s\", wanted %s %.0f \"%s\"", j_str(e, "action"), j_num(e, "size"), j_str(e, "tag"),
              action, size, tag);
    CHECK(strcmp(j_str(e, "device"), "cpu") == 0 && j_num(e, "time_us") >= 0);
}

static void check_history(const jval *root, uintptr_t first_block) {
    const jval *h = j_get(root, "history");
    CHECK(j_len(h) == 8);
    check_event(j_at(h, 0), "segment_alloc", (double)(2 * MiB), "");
    check_event(j_at(h, 1), "alloc", 1024, "layer1.weight");
    CHECK(j_num(j_at(h, 1), "address") == (double)first_block);
    check_event(j_at(h, 2), "segment_alloc", (double)(20 * MiB), "");
    check_event(j_at(h, 3), "alloc", (double)(3 * MiB), "arena:cpu");
    check_event(j_at(h, 4), "alloc", 512, ODD_TAG_DECODED);
    check_event(j_at(h, 5), "alloc", 512, "waits");
    check_event(j_at(h, 6), "free", 1024, "layer1.weight");
    check_event(j_at(h, 7), "free", 512, "waits");
    for (int i = 1; i < 8; i++) CHECK(j_num(j_at(h, i), "time_us") >= j_num(j_at(h, i - 1), "time_us"));
}

static void test_snapshot(void) {
    deft_device cpu = deft_cpu();
    CHECK_OK(deft_memory_record_history(100));
    CHECK_OK(deft_testing_caching_set_event_hooks(DEFT_CPU, &fake_hooks));
    char *a = must_alloc(1000, NULL, "layer1.weight");
    void *big = must_alloc(3 * MiB, NULL, "arena:cpu");
    void *odd = must_alloc(100, NULL, ODD_TAG);
    void *waits = must_alloc(10, NULL, "waits");
    CHECK_OK(deft_caching_record_stream(cpu, waits, (void *)0x77));
    CHECK_OK(deft_caching_free(cpu, a));
    CHECK_OK(deft_caching_free(cpu, waits));
    CHECK_OK(deft_memory_snapshot("test_memory_snapshot.json"));
    jval root;
    if (parse_file("test_memory_snapshot.json", &root)) {
        check_devices(&root, (uintptr_t)a, (uintptr_t)big);
        check_history(&root, (uintptr_t)a);
        j_free(&root);
    }
    python_agrees("test_memory_snapshot.json");

    /* A shorter history keeps the newest entries; an OOM is an event too (18 MiB: larger than the cached 17 MiB
     * block, and nothing cached can be given back, as both segments hold live blocks). */
    CHECK_OK(deft_memory_record_history(3));
    CHECK_OK(deft_memory_set_limit(cpu, 8 * MiB));
    void *none = NULL;
    CHECK_ERR(deft_caching_alloc(cpu, 18 * MiB, NULL, "too big", &none), DEFT_ERR_OOM, "out of memory on cpu");
    CHECK_OK(deft_memory_set_limit(cpu, 0));
    CHECK_OK(deft_memory_snapshot("test_memory_snapshot.json"));
    if (parse_file("test_memory_snapshot.json", &root)) {
        const jval *h = j_get(&root, "history");
        CHECK(j_len(h) == 3);
        check_event(j_at(h, 1), "free", 512, "waits");
        check_event(j_at(h, 2), "oom", (double)(18 * MiB), "too big");
        j_free(&root);
    }

    /* History off: none kept; the pool empties completely once the fake event is waited for. */
    CHECK_OK(deft_memory_record_history(0));
    CHECK_OK(deft_caching_free(cpu, odd));
    CHECK_OK(deft_caching_free(cpu, big));
    CHECK_OK(deft_memory_empty_cache(cpu));
    CHECK(fake_done == 1);
    CHECK_OK(deft_testing_caching_set_event_hooks(DEFT_CPU, NULL));
    CHECK_OK(deft_memory_snapshot("test_memory_snapshot.json"));
    if (parse_file("test_memory_snapshot.json", &root)) {
        CHECK(j_len(j_get(&root, "history")) == 0);
        CHECK(j_len(j_get(j_at(j_get(&root, "devices"), 0), "segments")) == 0);
        j_free(&root);
    }
    python_agrees("test_memory_snapshot.json");
    CHECK_OK(deft_caching_check(cpu));
    CHECK_ERR(deft_memory_snapshot("/nonexistent-deft-dir/x.json"), DEFT_ERR_IO, "cannot open");
    CHECK_ERR(deft_memory_snapshot(NULL), DEFT_ERR_INVALID, "path is NULL");
}

int main(void) {
    test_parser_rejects();
    test_snapshot();
    return deft_check_finish();
}
