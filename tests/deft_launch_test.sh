#!/usr/bin/env bash
# scripts/deft_launch on small commands: every rank sees its own RANK 0..N-1 and the same WORLD_SIZE and MASTER_*;
# output and errors come back prefixed "[rank r] "; a rank that exits 3 (or is killed) makes the launcher exit
# non-zero naming it; a rank that hangs is terminated after --grace-s; SIGTERM reaches every rank; bad options are
# refused. With test_dist_env's path it also checks that deft_dist_options_from_env reads what the launcher sets.
#
#   tests/deft_launch_test.sh SOURCE_DIR WORK_DIR [TEST_DIST_ENV]
set -u
src=$1 work=$2 dist_env=${3:-}
launch=$src/scripts/deft_launch
rm -rf "$work" && mkdir -p "$work" || exit 1
cd "$work" || exit 1
failures=0
fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}

# Runs the launcher with the rest of the arguments; leaves out, err, rc and the seconds it took.
run() {
    local t0=$SECONDS
    "$launch" "$@" >out 2>err
    rc=$?
    took=$((SECONDS - t0))
}
has() { grep -qF -- "$2" "$1" || fail "$1 of '$case' lacks '$2': $(cat "$1")"; }

case="three ranks"
run -n 3 sh -c 'echo "R=$RANK W=$WORLD_SIZE L=$LOCAL_RANK LW=$LOCAL_WORLD_SIZE M=$MASTER_ADDR:$MASTER_PORT"
               echo "e$RANK" >&2'
[ "$rc" = 0 ] || fail "$case: status $rc"
for r in 0 1 2; do
    [ "$(grep -c "^\[rank $r\] R=$r W=3 L=$r LW=3 M=127.0.0.1:[0-9]*$" out)" = 1 ] || fail "$case: rank $r: $(cat out)"
    [ "$(grep -c "^\[rank $r\] e$r$" err)" = 1 ] || fail "$case: rank $r's stderr: $(cat err)"
done
[ "$(wc -l <out)" = 3 ] || fail "$case: lines: $(cat out)"
[ "$(sed 's/.* M=//' out | sort -u | wc -l)" = 1 ] || fail "$case: MASTER_* differ: $(cat out)"
port=$(sed -n 's/.*M=127.0.0.1:\([0-9]*\)$/\1/p' out | head -1)
[ -n "$port" ] && ((port >= 1 && port <= 65535)) || fail "$case: port '$port'"

case="two hosts"   # this one is host 1 of 2: ranks 2 and 3 of 4
run -n 2 --nnodes 2 --node-rank=1 --master-addr h0 --master-port 29511 \
    sh -c 'echo "$RANK $WORLD_SIZE $LOCAL_RANK $MASTER_ADDR $MASTER_PORT"'
[ "$rc" = 0 ] || fail "$case: status $rc"
has out "[rank 2] 2 4 0 h0 29511"
has out "[rank 3] 3 4 1 h0 29511"

case="a rank exits 3"
run -n 3 sh -c 'if [ "$RANK" = 1 ]; then echo dying; exit 3; fi; sleep 1; echo done'
[ "$rc" = 3 ] || fail "$case: status $rc, wanted 3"
has err "deft_launch: rank 1 exited with status 3"
has err "deft_launch: rank 1 failed first"
has out "[rank 1] dying"
has out "[rank 0] done"   # the others finished on their own, inside the grace period
has out "[rank 2] done"

case="a rank killed"
run -n 2 sh -c 'if [ "$RANK" = 1 ]; then kill -9 $$; fi; sleep 1'
[ "$rc" != 0 ] || fail "$case: status 0"
has err "rank 1 exited with status 137 (signal 9, SIGKILL)"
grep -q "Killed" err && fail "$case: bash's job report leaked: $(cat err)"

case="a rank hangs"   # rank 0 fails, rank 1 (and the sleep it started) would run 60 s: terminated after 1 s
run -n 2 --grace-s 1 sh -c 'if [ "$RANK" = 0 ]; then exit 5; fi; echo $$ >pid.$RANK; sleep 60; echo never'
[ "$rc" = 5 ] || fail "$case: status $rc, wanted 5"
((took <= 10)) || fail "$case: took $took s"
has err "rank 0 exited with status 5"
has err "terminating rank(s) 1, still running 1 s later"
has err "rank 0 failed first"
grep -q never out && fail "$case: rank 1 finished"
[ -s pid.1 ] && kill -0 "$(cat pid.1)" 2>/dev/null && fail "$case: rank 1 is still running"

case="SIGTERM"   # passed on to every rank, which exit 7 on it
"$launch" -n 2 sh -c 'trap "echo got TERM; exit 7" TERM; echo up >up.$RANK; sleep 60 & wait' >out 2>err &
lp=$!
for _ in $(seq 100); do [ -e up.0 ] && [ -e up.1 ] && break; sleep 0.1; done
kill -TERM "$lp"
wait "$lp"
rc=$?
[ "$rc" = 7 ] || fail "$case: status $rc, wanted 7"
has err "got SIGTERM: passing it on to every rank"
has out "[rank 0] got TERM"
has out "[rank 1] got TERM"

case="bad options"
for bad in "-n 0 true" "-n x true" "--nnodes 2 true" "--nnodes 2 --master-addr h true" "--node-rank 1 true" \
    "--master-port 70000 true" "--grace-s -1 true" "--bogus true" "-n 2"; do
    # shellcheck disable=SC2086
    run $bad
    [ "$rc" = 2 ] || fail "$case: '$bad': status $rc"
    grep -q "^deft_launch: " err || fail "$case: '$bad': no message: $(cat err)"
done
run --help
[ "$rc" = 0 ] && grep -q "usage: deft_launch" out || fail "--help: status $rc"

if [ -n "$dist_env" ]; then
    case="deft_dist_options_from_env under the launcher"
    run -n 2 --master-port 29512 "$dist_env" --print
    [ "$rc" = 0 ] || fail "$case: status $rc: $(cat err)"
    has out "[rank 0] rank 0 world 2 device 0 rendezvous tcp:127.0.0.1:29512"
    has out "[rank 1] rank 1 world 2 device 1 rendezvous tcp:127.0.0.1:29512"
fi

if ((failures)); then
    echo "$failures failure(s)" >&2
    exit 1
fi
echo "deft_launch: all cases passed"
