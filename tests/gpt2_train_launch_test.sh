#!/usr/bin/env bash
# gpt2_train under scripts/deft_launch on two GPUs, a small model on a generated text: each rank trains a replica,
# only rank 0 prints the progress, every rank writes its own state file (<state>.rank<R>), and a run resumed from
# the states saved at step 8 gives steps 9-16's losses and the validation loss of the uninterrupted run, as text;
# the same with --zero (ZeRO-1), and with --zero --param-copies (the step gathers the bf16 copies; every rank gathers
# the f32 weights before it saves, and the validation reads the copies), whose losses must be --zero's, bit for bit.
# Skips (exit 77) with fewer than two GPUs or a build without NCCL.
#
#   tests/gpt2_train_launch_test.sh SOURCE_DIR WORK_DIR GPT2_TRAIN
set -u
src=$1 work=$2 prog=$3
launch=$src/scripts/deft_launch
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -lt 2 ]; then
    echo "gpt2_train_launch_test: needs two GPUs ($gpus found): skipped"
    exit 77
fi
rm -rf "$work" && mkdir -p "$work" || exit 1
failures=0
fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}

# A text of some 40 KB that a small model learns something of.
for i in $(seq 1 800); do echo "line $i: the quick brown fox jumps over the lazy dog $((i % 7))"; done > "$work/text.txt"
args=(--text "$work/text.txt" --layers 1 --width 64 --heads 4 --seq 64 --batch 4 --steps 16 --log-every 1
      --val-every 0 --val-batches 1 --sample 0 --dist-timeout 60)

# launch NAME ARGS...: gpt2_train on two ranks, its stdout in $work/NAME.out, stderr in $work/NAME.err.
launch() {
    local name=$1; shift
    "$launch" -n 2 --grace-s 30 "$prog" "${args[@]}" "$@" > "$work/$name.out" 2> "$work/$name.err"
    local rc=$?
    if grep -q "needs NCCL and a GPU per rank" "$work/$name.err"; then
        echo "gpt2_train_launch_test: $(grep -m1 "needs NCCL" "$work/$name.err"): skipped"
        exit 77
    fi
    [ "$rc" = 0 ] || fail "$name: the launcher exited $rc: $(tail -5 "$work/$name.err")"
}

# The loss lines of steps 9-16 and the validation loss, rank 0's, without their rate.
losses() {
    grep -E '^\[rank 0\] (step (9|1[0-6])/16  loss|validation loss)' "$1" | sed 's/  [0-9]* tokens\/s$//'
}

for variant in plain zero zero_copies; do
    extra=()
    [ "$variant" = zero ] && extra=(--zero)
    [ "$variant" = zero_copies ] && extra=(--zero --param-copies --autocast bf16)
    launch "$variant" --state "$work/$variant" --save-every 8 "${extra[@]}"
    out=$work/$variant.out
    grep -q '^\[rank 0\] data parallel: 2 ranks' "$out" || fail "$variant: no 'data parallel: 2 ranks' line"
    grep -q '^\[rank 0\] step 16/16  loss' "$out" || fail "$variant: rank 0 printed no step 16"
    ! grep -q '^\[rank 1\] step' "$out" || fail "$variant: rank 1 printed progress: $(grep '^\[rank 1\]' "$out" | head -3)"
    for f in "$variant.rank0" "$variant.rank1" "$variant.step8.rank0" "$variant.step8.rank1"; do
        [ -s "$work/$f" ] || fail "$variant: no state file $f"
    done
    launch "$variant-resumed" --resume "$work/$variant.step8" "${extra[@]}"
    grep -q "^\[rank 0\] resumed from $work/$variant.step8.rank0 at step 8" "$work/$variant-resumed.out" ||
        fail "$variant: the resumed run did not start at step 8: $(head -5 "$work/$variant-resumed.out")"
    a=$(losses "$out") b=$(losses "$work/$variant-resumed.out")
    [ "$(echo "$a" | wc -l)" = 9 ] || fail "$variant: want 9 loss lines, got: $a"
    [ "$a" = "$b" ] || fail "$variant: resumed losses differ:
uninterrupted:
$a
resumed:
$b"
done

# The bf16 copies are the casts' values: ZeRO-1 gathering them trains as ZeRO-1 casting does, loss for loss.
all_losses() { grep -E '^\[rank 0\] (step [0-9]+/16  loss|validation loss)' "$1" | sed 's/  [0-9]* tokens\/s$//'; }
a=$(all_losses "$work/zero.out") b=$(all_losses "$work/zero_copies.out")
[ "$(echo "$a" | wc -l)" = 17 ] && [ "$a" = "$b" ] || fail "zero_copies: the losses differ from zero's:
zero:
$a
zero_copies:
$b"

if [ "$failures" -gt 0 ]; then
    echo "gpt2_train_launch_test: $failures failure(s)" >&2
    exit 1
fi
echo "gpt2_train_launch_test: 2 ranks, plain, ZeRO-1 and ZeRO-1 with bf16 copies: progress on rank 0 only, a state file per rank, resumed losses equal"
