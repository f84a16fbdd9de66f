/* Token shards (llm.c's format): one shard and sets of many (a directory, a glob pattern) read back against the
 * tokens written, every span [a, b) across the shard boundaries (empty shards among them) equal to the reference;
 * the set in byte order of the paths; every corruption (empty, short header, foreign magic, Llama 3 magic, other
 * version, negative count, truncated tokens, trailing bytes, a directory named *.bin, a missing file, a pattern
 * matching nothing, an empty pattern) DEFT_ERR_IO naming the file and the problem, with nothing kept; the writer
 * byte for byte equal to the independent one here, its refusals.
 *
 * `test_tokens --check-converted DIR NAME TEXT MODE VAL SHARD` (MODE bytes, chars or gpt2) is run by
 * tests/text_to_tokens_test.sh after scripts/text_to_tokens.py: it reads the shards the script made and checks them
 * against the text. */
#define _POSIX_C_SOURCE 200809L /* getpid, mkdir */
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "read_file.h"
#include "token_shards.h"

static char dir[128];

static void path_in(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", dir, name); }

static deft_tokens *open_ok(const char *pattern) {
    deft_tokens *t = NULL;
    CHECK_OK(deft_tokens_open(pattern, &t));
    return t;
}

/* Every span [a, b) of t (b - a up to `longest`, or all when 0) equals ref[a, b). */
static void check_spans(const deft_tokens *t, const int32_t *ref, int64_t n, int64_t longest, const char *what) {
    int32_t *got = malloc((size_t)(n + 1) * sizeof *got);
    int bad = 0;
    for (int64_t a = 0; a <= n && !bad; a++)
        for (int64_t b = a; b <= n && (!longest || b - a <= longest) && !bad; b++) {
            got[b - a] = -7;   /* a read past the span would change it */
            if (deft_tokens_read(t, a, b - a, got) != DEFT_OK) bad = 1;
            for (int64_t k = a; k < b && !bad; k++) bad = got[k - a] != ref[k];
            bad |= got[b - a] != -7;
            if (bad) fprintf(stderr, "%s: span [%lld, %lld) differs (%s)\n", what, (long long)a, (long long)b,
                             deft_errmsg());
        }
    CHECK_MSG(!bad, "%s: spans", what);
    free(got);
}

static void test_one_shard(void) {
    enum { N = 1000 };
    int32_t ref[N];
    shard_random_tokens(ref, N, 42);
    char p[256], q[256];
    path_in(p, sizeof p, "one.bin");
    CHECK(shard_write(p, shard_ok(N), ref, N) == 0);
    deft_tokens *t = open_ok(p);
    CHECK(deft_tokens_count(t) == N && deft_tokens_shards(t) == 1);
    CHECK(deft_tokens_shard_path(t, 0) && strcmp(deft_tokens_shard_path(t, 0), p) == 0);
    CHECK(deft_tokens_shard_path(t, 1) == NULL && deft_tokens_shard_path(t, -1) == NULL);
    check_spans(t, ref, N, 40, "one shard");
    int32_t all[N];
    CHECK_OK(deft_tokens_read(t, 0, N, all));
    CHECK(memcmp(all, ref, sizeof all) == 0);
    CHECK_ERR(deft_tokens_read(t, N - 3, 4, all), DEFT_ERR_INVALID, "out of the stream's [0, 1000)");
    CHECK_ERR(deft_tokens_read(t, -1, 1, all), DEFT_ERR_INVALID, "out of the stream");
    CHECK_ERR(deft_tokens_read(t, 0, -1, all), DEFT_ERR_INVALID, "out of the stream");
    CHECK_ERR(deft_tokens_read(t, INT64_MAX, 2, all), DEFT_ERR_INVALID, "out of the stream");
    CHECK_ERR(deft_tokens_read(t, 0, 1, NULL), DEFT_ERR_INVALID, "out is NULL");
    CHECK_ERR(deft_tokens_read(NULL, 0, 1, all), DEFT_ERR_INVALID, "NULL");
    CHECK_OK(deft_tokens_read(t, N, 0, NULL));
    deft_tokens_close(t);

    /* The library's writer makes the same bytes as the one here. */
    path_in(q, sizeof q, "one_written.bin");
    CHECK_OK(deft_tokens_write(q, ref, N));
    char *a = read_file(p), *b = read_file(q);
    CHECK(a && b && memcmp(a, b, SHARD_HEADER + 2 * N) == 0);
    free(a);
    free(b);
    CHECK(deft_tokens_count(NULL) == 0 && deft_tokens_shards(NULL) == 0);
    deft_tokens_close(NULL);
}

/* Shards of 5, 0, 300, 17, 1 and 0 tokens, written out of name order; a file that is not *.bin beside them. */
static const int64_t set_sizes[] = {5, 0, 300, 17, 1, 0};
static const char *set_names[] = {"s_b.bin", "s_c.bin", "s_d.bin", "s_e.bin", "s_f.bin", "s_g.bin"};
#define SET_SHARDS 6
#define SET_TOKENS 323

static void write_set(const char *sub, int32_t *ref) {
    char d[200], p[300];
    snprintf(d, sizeof d, "%s/%s", dir, sub);
    CHECK(mkdir(d, 0755) == 0);
    shard_random_tokens(ref, SET_TOKENS, 7);
    int64_t at = SET_TOKENS;
    for (int i = SET_SHARDS - 1; i >= 0; i--) {
        at -= set_sizes[i];
        snprintf(p, sizeof p, "%s/%s", d, set_names[i]);
        CHECK(shard_write(p, shard_ok(set_sizes[i]), ref + at, set_sizes[i]) == 0);
    }
    snprintf(p, sizeof p, "%s/README.txt", d);
    FILE *f = fopen(p, "w");
    CHECK(f && fputs("not a shard\n", f) >= 0 && fclose(f) == 0);
}

static void test_many_shards(void) {
    int32_t ref[SET_TOKENS];
    write_set("set", ref);
    char pattern[256];
    path_in(pattern, sizeof pattern, "set");
    deft_tokens *t = open_ok(pattern);   /* the directory */
    CHECK(deft_tokens_count(t) == SET_TOKENS && deft_tokens_shards(t) == SET_SHARDS);
    for (int i = 0; t && i < SET_SHARDS; i++)
        CHECK_MSG(strstr(deft_tokens_shard_path(t, i), set_names[i]) != NULL, "shard %d is %s", i,
                  deft_tokens_shard_path(t, i));
    check_spans(t, ref, SET_TOKENS, 0, "directory");
    deft_tokens_close(t);

    path_in(pattern, sizeof pattern, "set/s_[b-e].bin");
    t = open_ok(pattern);
    CHECK(deft_tokens_count(t) == 322 && deft_tokens_shards(t) == 4);
    check_spans(t, ref, 322, 0, "glob pattern");
    deft_tokens_close(t);

    path_in(pattern, sizeof pattern, "set/s_d.bin");
    t = open_ok(pattern);
    CHECK(deft_tokens_count(t) == 300 && deft_tokens_shards(t) == 1);
    check_spans(t, ref + 5, 300, 8, "one of the set");
    deft_tokens_close(t);
}

/* Opening must fail with DEFT_ERR_IO, a message naming `named` and saying `problem`, and *out NULL. */
static void check_refused(const char *pattern, const char *named, const char *problem) {
    deft_tokens *t = (deft_tokens *)&t;
    deft_status s = deft_tokens_open(pattern, &t);
    CHECK_MSG(s == DEFT_ERR_IO, "%s: %s (%s)", pattern, deft_status_name(s), deft_errmsg());
    CHECK_MSG(strstr(deft_errmsg(), named) && strstr(deft_errmsg(), problem), "%s: message \"%s\" lacks \"%s\" or "
              "\"%s\"", pattern, deft_errmsg(), named, problem);
    CHECK(t == NULL);
    if (t && t != (deft_tokens *)&t) deft_tokens_close(t);
}

/* A shard `name` written from spec, refused with `problem`; also inside a set of good shards. */
static void check_corrupt(const char *name, shard_spec spec, int64_t n, const char *problem) {
    int32_t tok[64];
    shard_random_tokens(tok, 64, 3);
    char p[256];
    path_in(p, sizeof p, name);
    CHECK(shard_write(p, spec, tok, n) == 0);
    check_refused(p, p, problem);
    char d[200], q[300], pattern[300];
    snprintf(d, sizeof d, "%s/bad_%s", dir, name);
    CHECK(mkdir(d, 0755) == 0);
    for (int i = 0; i < 3; i++) {
        snprintf(q, sizeof q, "%s/%c_good.bin", d, "acz"[i]);
        CHECK(shard_write(q, shard_ok(10), tok, 10) == 0);
    }
    snprintf(q, sizeof q, "%s/b_bad.bin", d);
    CHECK(shard_write(q, spec, tok, n) == 0);
    check_refused(d, q, problem);
    snprintf(pattern, sizeof pattern, "%s/*_*.bin", d);
    check_refused(pattern, q, problem);
}

static void test_corruption(void) {
    shard_spec s = shard_ok(20);
    check_corrupt("empty.bin", (shard_spec){.keep = 0}, 0, "the file is empty");
    s.keep = 2;
    check_corrupt("two_bytes.bin", s, 20, "truncated: the file has 2 bytes, a token shard's header alone has 1024");
    s.keep = 1000;
    check_corrupt("short_header.bin", s, 20, "truncated: the file has 1000 bytes");
    s = shard_ok(20);
    s.magic = 0x46464952;
    check_corrupt("magic.bin", s, 20, "bad magic 1179011410");
    s.magic = 20240801;
    check_corrupt("llama3.bin", s, 20, "Llama 3 shard");
    s = shard_ok(20);
    s.version = 2;
    check_corrupt("version.bin", s, 20, "version 2; deft reads version 1");
    s = shard_ok(20);
    s.count = -5;
    check_corrupt("negative.bin", s, 20, "-5 tokens");
    s = shard_ok(21);
    check_corrupt("truncated.bin", s, 20, "truncated: the header says 21 tokens (1066 bytes with the header), the "
                  "file has 1064 bytes");
    s = shard_ok(20);
    s.keep = SHARD_HEADER + 39;
    check_corrupt("odd.bin", s, 20, "truncated: the header says 20 tokens");
    s = shard_ok(20);
    s.extra = 1;
    check_corrupt("long.bin", s, 20, "too long: the header says 20 tokens (1064 bytes with the header), the file has "
                  "1065 bytes");
    s = shard_ok(INT32_MAX);
    check_corrupt("huge.bin", s, 20, "truncated: the header says 2147483647 tokens");

    char p[256];
    path_in(p, sizeof p, "no_such.bin");
    check_refused(p, p, "cannot open: No such file");
    path_in(p, sizeof p, "nothing_*.bin");
    check_refused(p, p, "no file matches the pattern");
    path_in(p, sizeof p, "emptydir");
    CHECK(mkdir(p, 0755) == 0);
    check_refused(p, p, "the directory has no *.bin shards");
    path_in(p, sizeof p, "emptydir/dir.bin");
    CHECK(mkdir(p, 0755) == 0);
    char pattern[256];
    path_in(pattern, sizeof pattern, "emptydir/*.bin");
    check_refused(pattern, p, "not a regular file (a directory)");
    check_refused("", "\"\"", "the pattern is empty");
    deft_tokens *t = NULL;
    CHECK_ERR(deft_tokens_open(NULL, &t), DEFT_ERR_INVALID, "pattern is NULL");
    CHECK_ERR(deft_tokens_open(p, NULL), DEFT_ERR_INVALID, "out is NULL");
}

static void test_write_refusals(void) {
    char p[256];
    path_in(p, sizeof p, "refused.bin");
    int32_t tok[3] = {1, 65536, 2};
    CHECK_ERR(deft_tokens_write(p, tok, 3), DEFT_ERR_INVALID, "token 1 is 65536");
    tok[1] = -1;
    CHECK_ERR(deft_tokens_write(p, tok, 3), DEFT_ERR_INVALID, "token 1 is -1");
    struct stat st;
    CHECK(stat(p, &st) != 0);   /* nothing written */
    CHECK_ERR(deft_tokens_write(p, tok, -1), DEFT_ERR_INVALID, "-1 tokens");
    CHECK_ERR(deft_tokens_write(p, NULL, 3), DEFT_ERR_INVALID, "tokens is NULL");
    CHECK_ERR(deft_tokens_write(NULL, tok, 1), DEFT_ERR_INVALID, "path is NULL");
    CHECK_ERR(deft_tokens_write("/nonexistent-deft-dir/x.bin", tok, 1), DEFT_ERR_IO,
              "/nonexistent-deft-dir/x.bin: cannot open for writing");
    /* An empty shard is a valid one. */
    CHECK_OK(deft_tokens_write(p, NULL, 0));
    deft_tokens *t = open_ok(p);
    CHECK(deft_tokens_count(t) == 0);
    deft_tokens_close(t);
    /* The extreme token values survive. */
    int32_t ends[4] = {0, 65535, 256, 255};
    CHECK_OK(deft_tokens_write(p, ends, 4));
    t = open_ok(p);
    int32_t back[4];
    CHECK(t && deft_tokens_read(t, 0, 4, back) == DEFT_OK && memcmp(back, ends, sizeof back) == 0);
    deft_tokens_close(t);
}

/* ---- the converter's output (scripts/text_to_tokens.py) ---- */

/* The UTF-8 bytes of code point c into b; their count. */
static int utf8_put(uint32_t c, unsigned char *b) {
    if (c < 0x80) return b[0] = (unsigned char)c, 1;
    if (c < 0x800) return b[0] = (unsigned char)(0xC0 | c >> 6), b[1] = (unsigned char)(0x80 | (c & 0x3F)), 2;
    if (c < 0x10000) {
        b[0] = (unsigned char)(0xE0 | c >> 12), b[1] = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
        b[2] = (unsigned char)(0x80 | (c & 0x3F));
        return 3;
    }
    b[0] = (unsigned char)(0xF0 | c >> 18), b[1] = (unsigned char)(0x80 | ((c >> 12) & 0x3F));
    b[2] = (unsigned char)(0x80 | ((c >> 6) & 0x3F)), b[3] = (unsigned char)(0x80 | (c & 0x3F));
    return 4;
}

/* The bytes the tokens [0, n) of t stand for: themselves (bytes), or their characters from the vocabulary in UTF-8.
 * NULL when a token has no meaning. */
static unsigned char *decode(const deft_tokens *t, const char *mode, const uint32_t *vocab, int n_vocab,
                             size_t *len) {
    int64_t n = deft_tokens_count(t);
    int32_t *tok = malloc((size_t)(n + 1) * sizeof *tok);
    unsigned char *out = malloc((size_t)(n + 1) * 4);
    CHECK_OK(deft_tokens_read(t, 0, n, tok));
    size_t at = 0;
    for (int64_t i = 0; i < n && out; i++) {
        if (strcmp(mode, "bytes") == 0 && tok[i] < 256) out[at++] = (unsigned char)tok[i];
        else if (strcmp(mode, "chars") == 0 && tok[i] < n_vocab) at += (size_t)utf8_put(vocab[tok[i]], out + at);
        else free(out), out = NULL;
    }
    free(tok);
    *len = at;
    return out;
}

static int load_vocab(const char *path, uint32_t *vocab, int cap) {
    FILE *f = fopen(path, "r");
    int n = 0;
    unsigned long c;
    while (f && n < cap && fscanf(f, "%lu", &c) == 1) vocab[n++] = (uint32_t)c;
    if (f) fclose(f);
    return n;
}

/* The shards of one split: their number, and each but the last `shard` tokens, the last at most that. */
static deft_tokens *open_split(const char *d, const char *name, const char *split, int64_t shard) {
    char pattern[600];
    snprintf(pattern, sizeof pattern, "%s/%s_%s_*.bin", d, name, split);
    deft_tokens *t = open_ok(pattern);
    for (int i = 0; t && i < deft_tokens_shards(t); i++) {
        deft_tokens *one = open_ok(deft_tokens_shard_path(t, i));
        int64_t c = deft_tokens_count(one);
        CHECK_MSG(i + 1 < deft_tokens_shards(t) ? c == shard : c >= 1 && c <= shard, "%s: %lld tokens, shards of %lld",
                  deft_tokens_shard_path(t, i), (long long)c, (long long)shard);
        deft_tokens_close(one);
    }
    return t;
}

/* GPT-2's BPE (no validation split): the end-of-text token first, every token in its vocabulary of 50257. */
static int check_bpe(const char *d, const char *name, int64_t shard) {
    deft_tokens *tr = open_split(d, name, "train", shard);
    int64_t n = deft_tokens_count(tr);
    int32_t *tok = malloc((size_t)(n + 1) * sizeof *tok);
    CHECK(tok && n > 1 && deft_tokens_read(tr, 0, n, tok) == DEFT_OK);
    int ok = tok && n > 1 && tok[0] == 50256;
    for (int64_t i = 1; ok && i < n; i++) ok = tok[i] >= 0 && tok[i] < 50257;
    CHECK_MSG(ok, "gpt2: the shards do not start with <|endoftext|> or hold tokens outside GPT-2's vocabulary");
    printf("gpt2: %lld tokens in %d shards\n", (long long)n, deft_tokens_shards(tr));
    free(tok);
    deft_tokens_close(tr);
    return deft_check_finish();
}

static int check_converted(char **argv) {
    const char *d = argv[2], *name = argv[3], *text_path = argv[4], *mode = argv[5];
    const int64_t val = atoll(argv[6]), shard = atoll(argv[7]);
    FILE *f = fopen(text_path, "rb");
    CHECK(f != NULL);
    if (!f) return deft_check_finish();
    static unsigned char text[1 << 20];
    size_t text_len = fread(text, 1, sizeof text, f);
    fclose(f);
    static uint32_t vocab[65536];
    int n_vocab = 0;
    if (strcmp(mode, "chars") == 0) {
        char p[600];
        snprintf(p, sizeof p, "%s/%s_vocab.txt", d, name);
        n_vocab = load_vocab(p, vocab, 65536);
        CHECK(n_vocab > 0);
    }
    if (strcmp(mode, "gpt2") == 0) return check_bpe(d, name, shard);
    deft_tokens *v = open_split(d, name, "val", shard), *tr = open_split(d, name, "train", shard);
    CHECK(deft_tokens_count(v) == val);
    size_t vlen = 0, tlen = 0;
    unsigned char *vb = v ? decode(v, mode, vocab, n_vocab, &vlen) : NULL;
    unsigned char *tb = tr ? decode(tr, mode, vocab, n_vocab, &tlen) : NULL;
    CHECK_MSG(vb && tb && vlen + tlen == text_len && memcmp(vb, text, vlen) == 0 &&
              memcmp(tb, text + vlen, tlen) == 0, "%s: the shards decode to other text than %s", mode, text_path);
    printf("%s: %lld validation and %lld training tokens in %d + %d shards decode to the %zu bytes of %s\n", mode,
           (long long)deft_tokens_count(v), (long long)deft_tokens_count(tr), deft_tokens_shards(v),
           deft_tokens_shards(tr), text_len, text_path);
    free(vb);
    free(tb);
    deft_tokens_close(v);
    deft_tokens_close(tr);
    return deft_check_finish();
}

int main(int argc, char **argv) {
    if (argc == 8 && strcmp(argv[1], "--check-converted") == 0) return check_converted(argv);
    if (argc != 1) {
        fprintf(stderr, "usage: %s [--check-converted DIR NAME TEXT bytes|chars|gpt2 VAL_TOKENS SHARD_SIZE]\n",
                argv[0]);
        return 2;
    }
    CHECK(shard_dir_make(dir, sizeof dir, "test_tokens") == 0);
    test_one_shard();
    test_many_shards();
    test_corruption();
    test_write_refusals();
    CHECK(shard_dir_remove(dir) == 0);
    return deft_check_finish();
}
