#!/usr/bin/env bash
# Checks the library's layers from its includes: every #include "..." in a .c, .cu, .h or .cuh of a library folder
# is an edge from that folder to the folder holding the header. Fails on any edge against the pipeline's direction
# (a folder may include only itself, the folders before it in LAYERS, and include/) and on any cycle between
# folders. The CMake targets enforce the same order for what compiles; this also covers headers no target reaches.
#
# With a build directory it also reads the folders' objects (nm): a function one folder calls must be defined in that
# folder or one before it, so that a prototype written by hand cannot hide a call against the direction.
#
#   scripts/check_layers.sh [-v] [BUILD_DIR]      -v: print every edge with its count
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Lowest first: the order of the pipeline's dependencies (README, "Architecture").
LAYERS=(base mem ir plan ops passes runtime data dist testing)
verbose=""
build=""
for a in "$@"; do
    if [ "$a" = -v ]; then verbose=1; else build=$a; fi
done

files=$(for d in "${LAYERS[@]}" include; do
    [ -d "$d" ] && find "$d" -type f \( -name '*.c' -o -name '*.cu' -o -name '*.h' -o -name '*.cuh' \)
done | sort)

# Every header's folder (its first path component), by path and by file name: the build's include paths are the
# folders themselves, so "x.h" names the one header of that name (a name held twice is an error below).
headers=$(printf '%s\n' $files | grep -E '\.(h|cuh)$')

printf '%s\n' "${LAYERS[@]}" > /tmp/deft_layers.$$
printf '%s\n' $headers > /tmp/deft_headers.$$
for f in $files; do
    grep -oE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^"]+"' "$f" | sed -E 's/.*"([^"]+)"/\1/' |
        while read -r inc; do printf '%s %s\n' "$f" "$inc"; done
done > /tmp/deft_includes.$$ || true

awk -v verbose="$verbose" '
FILENAME == ARGV[1] { rank[$1] = ++nl; name[nl] = $1; next }
FILENAME == ARGV[2] {
    n = split($1, parts, "/"); base = parts[n]; bypath[$1] = parts[1]
    if (parts[1] == "include") next    # public headers are named by their path ("deft/core.h")
    if (base in owner && owner[base] != parts[1]) { dup[base] = owner[base] " and " parts[1] }
    owner[base] = parts[1]; next
}
{
    src = $1; split(src, sp, "/"); from = sp[1]; inc = $2
    dir = src; sub(/\/[^\/]*$/, "", dir)
    if ((dir "/" inc) in bypath) to = bypath[dir "/" inc]
    else {
        n = split(inc, ip, "/"); b = ip[n]
        if (inc in bypath) to = bypath[inc]
        else if (("include/" inc) in bypath) to = "include"
        else if (n > 1 && ((dir "/" inc) in bypath)) to = bypath[dir "/" inc]
        else if (b in owner) to = owner[b]
        else next                      # a system or toolkit header
    }
    if (from == to) next
    edges[from " " to]++
    if (to != "include" && rank[to] > rank[from]) { back[from " " to] = back[from " " to] " " src "->" inc }
}
END {
    bad = 0
    for (b in dup) { printf "two headers named %s (in %s): an include of it is ambiguous\n", b, dup[b]; bad = 1 }
    nedges = 0; nback = 0
    for (e in edges) {
        nedges++
        if (verbose != "") printf "edge %s (%d includes)\n", e, edges[e]
        split(e, p, " "); adj[p[1]] = adj[p[1]] " " p[2]
    }
    for (e in back) { nback++; printf "against the pipeline: %s:%s\n", e, back[e] }
    # Cycles: a depth-first search over the folder graph.
    ncyc = 0
    for (i = 1; i <= nl; i++) state[name[i]] = 0
    for (i = 1; i <= nl; i++) if (state[name[i]] == 0) ncyc += dfs(name[i], name[i])
    printf "layers: %d folders, %d edges between folders, %d against the pipeline, %d cycles\n", nl, nedges, nback, ncyc
    exit (bad || nback || ncyc) ? 1 : 0
}
function dfs(v, path,    m, k, w, found) {
    state[v] = 1; found = 0
    m = split(adj[v], nb, " ")
    for (k = 1; k <= m; k++) {
        w = nb[k]
        if (!(w in rank)) continue
        if (state[w] == 1) { printf "cycle: %s -> %s\n", path, w; found++ }
        else if (state[w] == 0) found += dfs(w, path " -> " w)
        m = split(adj[v], nb, " ")     # awk arrays are global: split again after the recursion
    }
    state[v] = 2
    return found
}
' /tmp/deft_layers.$$ /tmp/deft_headers.$$ /tmp/deft_includes.$$ && rc=0 || rc=$?
rm -f /tmp/deft_layers.$$ /tmp/deft_headers.$$ /tmp/deft_includes.$$

# Calls, from the objects of each folder's CMake target (deft_<folder>).
# The objects of a target's folder whose source still exists (a moved file leaves its old object behind).
layer_objects() {
    local o src
    find "$1" -name '*.o' | while read -r o; do
        src=${o#"$1"/}
        src=${src%.o}
        [ -f "$src" ] && printf '%s\n' "$o"
    done
}

if [ -n "$build" ]; then
    defs=$(mktemp) undefs=$(mktemp)
    for l in "${LAYERS[@]}"; do
        d="$build/CMakeFiles/deft_$l.dir"
        [ -d "$d" ] || continue
        layer_objects "$d" | xargs -r nm --defined-only 2>/dev/null | awk -v l="$l" '$2 ~ /^[TDBR]$/ { print $3, l }'
    done > "$defs"
    for l in "${LAYERS[@]}"; do
        d="$build/CMakeFiles/deft_$l.dir"
        [ -d "$d" ] || continue
        layer_objects "$d" | xargs -r nm -u 2>/dev/null | awk -v l="$l" 'NF == 2 { print l, $2 }' | sort -u
    done > "$undefs"
    awk -v order="${LAYERS[*]}" '
        BEGIN { n = split(order, o, " "); for (i = 1; i <= n; i++) rank[o[i]] = i }
        NR == FNR { def[$1] = $2; next }
        ($2 in def) && rank[def[$2]] > rank[$1] { printf "call against the pipeline: %s calls %s (%s)\n", $1, $2, def[$2]; bad++ }
        END { printf "calls: %d against the pipeline\n", bad; exit bad ? 1 : 0 }
    ' "$defs" "$undefs" || rc=1
    rm -f "$defs" "$undefs"
fi
exit $rc
