#!/usr/bin/env bash
# scripts/text_to_tokens.py on a small UTF-8 text, its shards read back by the C reader (test_tokens
# --check-converted): as bytes and as characters, with small shards and a validation split, and with the defaults;
# --bpe gpt2 refused clearly where tiktoken is missing (and read back where it works). Skips without python3.
# Usage: text_to_tokens_test.sh SOURCE_DIR TEST_TOKENS_EXE WORK_DIR
set -euo pipefail
src=$1 exe=$2 work=$3
if ! command -v python3 >/dev/null 2>&1; then
    echo "python3 not found: the converter cannot run; skipped"
    exit 77
fi
script=$src/scripts/text_to_tokens.py
rm -rf "$work"
mkdir -p "$work"
text=$work/story.txt
for i in $(seq 1 40); do
    printf 'line %d: naïve café, ünïcödé ✓ 日本語 — %d%%\n' "$i" $((i * 37 % 101))
done >"$text"

python3 "$script" "$text" --out-dir "$work/bytes" --shard-size 500 --val-tokens 123
"$exe" --check-converted "$work/bytes" story "$text" bytes 123 500

python3 "$script" "$text" --out-dir "$work/chars" --tokens chars --shard-size 333 --val-tokens 77 --name tale
"$exe" --check-converted "$work/chars" tale "$text" chars 77 333

# The defaults: one validation shard of a tenth of the tokens, one training shard.
bytes=$(wc -c <"$text")
python3 "$script" "$text" --out-dir "$work/default"
"$exe" --check-converted "$work/default" story "$text" bytes $((bytes / 10)) 100000000

if python3 -c 'import tiktoken' >/dev/null 2>&1; then
    if python3 -c 'import tiktoken; tiktoken.get_encoding("gpt2")' >/dev/null 2>&1; then
        python3 "$script" "$text" --out-dir "$work/bpe" --bpe gpt2 --val-tokens 0
        "$exe" --check-converted "$work/bpe" story "$text" gpt2 0 100000000
    else
        echo "tiktoken cannot load the gpt2 encoding here (no network?): --bpe gpt2 not checked"
    fi
else
    status=0
    python3 "$script" "$text" --out-dir "$work/bpe" --bpe gpt2 2>"$work/bpe.err" || status=$?
    if [ "$status" -ne 2 ] || ! grep -q "needs tiktoken, which is not installed" "$work/bpe.err"; then
        echo "--bpe gpt2 without tiktoken: exit $status, wanted 2 with a clear message:" >&2
        cat "$work/bpe.err" >&2
        exit 1
    fi
    echo "--bpe gpt2 without tiktoken is refused clearly"
fi
echo "text_to_tokens: all checks passed"
