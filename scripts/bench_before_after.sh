#!/usr/bin/env bash
# Two builds of deft on one GPU in one run: the mid MLP's training step (bench_mlp_train --config mid) and
# ResNet-18's at batch 128 in bf16 (bench_resnet --batch 128 --precision bf16), each build's process alternating with
# the other's for ROUNDS rounds, so that clocks and temperature drift alike on both sides. Checks that a change
# leaves the step time where it was: prints each run's figure, each side's median over the rounds, and their ratio
# (new over old), as `<name> <value> <unit>` lines. The losses after the warm-up (a fixed number of steps, unlike
# the timed ones) are compared too: a change that changes no result gives the same ones on both sides
# (`<name>.same_warmup_loss 1`).
#
#   scripts/bench_before_after.sh OLD_BUILD NEW_BUILD [ROUNDS]      (ROUNDS: 5)
set -uo pipefail
old=${1:?usage: scripts/bench_before_after.sh OLD_BUILD NEW_BUILD [ROUNDS]}
new=${2:?usage: scripts/bench_before_after.sh OLD_BUILD NEW_BUILD [ROUNDS]}
rounds=${3:-5}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# bench name | arguments | the prefix of its figures: the first <prefix>.*_step_us and <prefix>.*_loss compared
benches=(
  "mlp_mid|bench_mlp_train --config mid|mlp_train.mid"
  "resnet_b128_bf16|bench_resnet --batch 128 --precision bf16|resnet.b128_bf16"
)

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }

for b in "${benches[@]}"; do
  IFS='|' read -r name cmd prefix <<< "$b"
  for r in $(seq 1 "$rounds"); do
    for side in old new; do
      dir=$old
      [ "$side" = new ] && dir=$new
      # shellcheck disable=SC2086
      "$dir"/$cmd > "$tmp/$name.$side.$r.txt" 2>&1 || echo "# $side: $cmd failed (round $r)"
      v=$(awk -v p="$prefix." 'index($1, p) == 1 && $1 ~ /_step_us$/ { print $2; exit }' "$tmp/$name.$side.$r.txt")
      l=$(awk -v p="$prefix." 'index($1, p) == 1 && $1 ~ /_loss_warmup$/ { print $2; exit }' "$tmp/$name.$side.$r.txt")
      echo "before_after.$name.$side.round$r ${v:-nan} us"
      echo "before_after.$name.$side.round$r.warmup_loss ${l:-nan} loss"
      echo "${v:-nan}" >> "$tmp/$name.$side.values"
      echo "${l:-nan}" >> "$tmp/$name.$side.losses"
    done
  done
  mo=$(median < "$tmp/$name.old.values")
  mn=$(median < "$tmp/$name.new.values")
  echo "before_after.$name.old_median $mo us"
  echo "before_after.$name.new_median $mn us"
  awk -v a="$mn" -v b="$mo" -v n="$name" 'BEGIN { if (b > 0) printf "before_after.%s.new_over_old %.4f x\n", n, a / b }'
  same=0
  if [ "$(sort -u "$tmp/$name.old.losses" "$tmp/$name.new.losses" | wc -l)" = 1 ] &&
     ! grep -q nan "$tmp/$name.old.losses"; then
    same=1
  fi
  echo "before_after.$name.same_warmup_loss $same bool"
done
