#!/usr/bin/env python3
"""Converts a text file into token shards in llm.c's format, which deft_tokens_open reads.

A shard is a header of 256 little-endian int32 (magic 20240520, version 1, the token count, the rest 0) followed by
the tokens as little-endian uint16. As llm.c's dev/data scripts do, the first tokens of the text become the
validation split, written first as NAME_val_000000.bin (and further _val_ shards if it is larger than a shard), and
the rest NAME_train_NNNNNN.bin, the shard numbers running on from the validation shards.

Tokens:
  --tokens bytes   each byte of the file is a token (vocabulary 256); the default.
  --tokens chars   each character (the file decoded as UTF-8) is a token, numbered in order of code point; the
                   vocabulary is written beside the shards as NAME_vocab.txt, line i holding the decimal code point
                   of token i.
  --bpe gpt2       GPT-2's BPE through tiktoken (pip install tiktoken), with the end-of-text token 50256 before the
                   text, as llm.c's scripts put it before every document.

Only the standard library is needed, unless --bpe is asked for.

Example:
  python3 scripts/text_to_tokens.py /usr/share/common-licenses/GPL-3 --out-dir data/gpl --tokens chars
  -> data/gpl/GPL-3_val_000000.bin, data/gpl/GPL-3_train_000001.bin, data/gpl/GPL-3_vocab.txt
"""
import argparse
import os
import struct
import sys
from array import array

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
MAX_TOKEN = 65535
GPT2_EOT = 50256


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Convert a text file into token shards in llm.c's format (read by deft_tokens_open).",
        epilog="Shards: NAME_val_000000.bin first (the validation split: the text's first tokens), then "
               "NAME_train_NNNNNN.bin.")
    p.add_argument("input", help="the text file")
    p.add_argument("--out-dir", default=".", help="where the shards go (created if missing; default: .)")
    p.add_argument("--name", help="the shards' name prefix (default: the input file's name without its extension)")
    p.add_argument("--tokens", choices=("bytes", "chars"), default="bytes",
                   help="bytes (vocabulary 256, the default) or characters (vocabulary written to NAME_vocab.txt)")
    p.add_argument("--bpe", choices=("gpt2",), help="GPT-2's BPE through tiktoken instead of --tokens")
    p.add_argument("--shard-size", type=int, default=100_000_000,
                   help="tokens per shard, at most (default 100000000, as llm.c's FineWeb shards)")
    split = p.add_mutually_exclusive_group()
    split.add_argument("--val-tokens", type=int, help="tokens in the validation split (0: none)")
    split.add_argument("--val-fraction", type=float, default=0.1,
                       help="the validation split as a fraction of the tokens (default 0.1)")
    a = p.parse_args(argv)
    if a.shard_size < 1:
        p.error("--shard-size must be at least 1")
    if a.val_tokens is not None and a.val_tokens < 0:
        p.error("--val-tokens must not be negative")
    if not 0.0 <= a.val_fraction < 1.0:
        p.error("--val-fraction must be in [0, 1)")
    return a, p


def tokenize_bpe(data, parser):
    try:
        import tiktoken
    except ImportError:
        parser.exit(2, "text_to_tokens: --bpe gpt2 needs tiktoken, which is not installed (pip install tiktoken)\n")
    try:
        enc = tiktoken.get_encoding("gpt2")
    except Exception as e:  # the encoding's files are downloaded on first use
        parser.exit(2, f"text_to_tokens: tiktoken could not load the gpt2 encoding: {e}\n")
    return [GPT2_EOT] + enc.encode_ordinary(data.decode("utf-8", errors="replace")), None


def tokenize_chars(data, parser, path):
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        parser.exit(2, f"text_to_tokens: {path} is not UTF-8 ({e}); use --tokens bytes\n")
    vocab = sorted(set(text))
    if len(vocab) > MAX_TOKEN + 1:
        parser.exit(2, f"text_to_tokens: {path} has {len(vocab)} distinct characters; a shard's tokens are uint16\n")
    index = {c: i for i, c in enumerate(vocab)}
    return [index[c] for c in text], vocab


def shard_bytes(tokens):
    header = [0] * HEADER_INTS
    header[0], header[1], header[2] = MAGIC, VERSION, len(tokens)
    body = array("H", tokens)
    if sys.byteorder != "little":
        body.byteswap()
    return struct.pack("<%di" % HEADER_INTS, *header) + body.tobytes()


def write_shards(tokens, val_count, a, name):
    os.makedirs(a.out_dir, exist_ok=True)
    written, number = [], 0
    for split, part in (("val", tokens[:val_count]), ("train", tokens[val_count:])):
        for start in range(0, len(part), a.shard_size):
            path = os.path.join(a.out_dir, "%s_%s_%06d.bin" % (name, split, number))
            chunk = part[start:start + a.shard_size]
            with open(path, "wb") as f:
                f.write(shard_bytes(chunk))
            written.append((path, len(chunk)))
            number += 1
    return written


def main(argv):
    a, parser = parse_args(argv)
    try:
        with open(a.input, "rb") as f:
            data = f.read()
    except OSError as e:
        parser.exit(2, f"text_to_tokens: {a.input}: {e.strerror}\n")
    name = a.name or os.path.splitext(os.path.basename(a.input))[0]
    if a.bpe:
        tokens, vocab = tokenize_bpe(data, parser)
    elif a.tokens == "chars":
        tokens, vocab = tokenize_chars(data, parser, a.input)
    else:
        tokens, vocab = list(data), None
    if len(tokens) < 2:
        parser.exit(2, f"text_to_tokens: {a.input} gives {len(tokens)} tokens; training needs at least 2\n")
    val = a.val_tokens if a.val_tokens is not None else int(len(tokens) * a.val_fraction)
    val = min(val, len(tokens))
    written = write_shards(tokens, val, a, name)
    if vocab is not None:
        vocab_path = os.path.join(a.out_dir, name + "_vocab.txt")
        with open(vocab_path, "w", encoding="ascii") as f:
            f.write("".join("%d\n" % ord(c) for c in vocab))
        print(f"{vocab_path}: {len(vocab)} characters")
    for path, count in written:
        print(f"{path}: {count} tokens")
    kind = "gpt2 BPE" if a.bpe else a.tokens
    print(f"{len(tokens)} tokens ({kind}), {val} for validation, in {len(written)} shards")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
