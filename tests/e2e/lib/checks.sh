# tests/e2e/lib/checks.sh - the pass/fail counters the plain e2e tests share
# (sourced, not run): K (the kvtop binary), S (the shared test data folder),
# tmp (a scratch folder removed at exit), ok WHAT, bad WHAT [GOT] (GOT shown
# cut to GOT_CHARS characters, 600 unless the script sets it) and finish
# (the closing "N passed, N failed" line; its status says whether all held).
K=${KVTOP_BIN:-./kvtop}
S=${KVTOP_SHARED:-../shared}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "  ok $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; [[ -n ${2:-} ]] && echo "     got: $(echo "$2" | head -c "${GOT_CHARS:-600}")"; }
finish() { echo "$pass passed, $fail failed"; ((fail == 0)); }
