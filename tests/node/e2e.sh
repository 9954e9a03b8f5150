#!/usr/bin/env bash
# Runs upstream's end-to-end tests of Service networking (e2e.test of the pinned Kubernetes
# release) against a node brought up by up.sh, with roadkeeper as its proxy and DNS; takes the
# node down afterwards. The JUnit report and the suite's log go to the report folder, and the
# last lines printed are the pass / fail / skip counts.
#
#   tests/node/e2e.sh [--proxy-mode nftables|iptables|ipvs|ebpf] [--nodes N] [--report-dir DIR]
#                     [--focus RE] [--skip RE] [--procs N] [--list]
#
# --nodes: how many nodes up.sh brings up (default 3, one zone each: some tests need two or
# three nodes, the traffic distribution tests three zones; 6 runs their three tests of two nodes
# per zone too). Default focus: every [sig-network] test (tests/node/e2e-focus) but those
# tests/node/e2e-skip names, each with its reason: 125 tests of v1.34.4. --procs runs the tests
# N at a time (ginkgo). --list prints the tests the focus and skip select (a dry run of the
# suite: no node) and their count. The default selection with --procs 2 takes about 30 minutes
# on 2 cores (1777 s in nftables mode; 33 minutes with up and down, builds cached; README.md,
# "Upstream's tests against it").
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=tests/node/lib.sh
source "$here/lib.sh"

proxy_mode=nftables
report=$PWD/e2e-report
focus=$(grep -v '^#' "$here/e2e-focus" | paste -sd '|')
skip=$(grep -v '^#' "$here/e2e-skip" | sed 's/ *#.*//' | grep . | paste -sd '|')
procs=1
nodes=3
list=0
while (($#)); do
    case $1 in
        --proxy-mode) proxy_mode=$2; shift 2 ;;
        --report-dir) report=$2; shift 2 ;;
        --focus) focus=$2; shift 2 ;;
        --skip) skip=$2; shift 2 ;;
        --procs) procs=$2; shift 2 ;;
        --nodes) nodes=$2; shift 2 ;;
        --list) list=1; shift ;;
        -h | --help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) node_fail "unknown argument $1 (see --help)" ;;
    esac
done
bin=$("$repo/tests/k8s/build.sh" e2e)
if ((list)); then
    # Each spec the dry run "runs" is printed after a rule, as its text and then its labels in
    # brackets; the suite's own nodes are not tests.
    "$bin/e2e.test" --ginkgo.dry-run --ginkgo.no-color --ginkgo.v --ginkgo.focus="$focus" --ginkgo.skip="$skip" 2>&1 |
        awk 'rule && /^\[/ && !/^\[(Report|Synchronized)(Before|After)Suite\]/ {print} {rule = /^-+$/}' |
        sed 's/ \[[^]]*\]$//' | sort | awk '{print} END {print NR " tests"}'
    exit 0
fi
mkdir -p "$report"
report=$(cd "$report" && pwd)
archives=$(node_images e2e)
admin=$("$here/up.sh" --proxy-mode "$proxy_mode" --nodes "$nodes" | tail -1)
trap '"$here/down.sh"' EXIT
node_log "importing the test images"
for i in $(seq "$(node_count)"); do
    for archive in $archives; do node_ctr "$i" images import "$archive" >/dev/null; done
done

node_log "e2e.test, focus: $focus"
node_log "skip: $skip"
# On the first node (its network namespace and cgroup): some tests reach node and pod addresses,
# and NodePorts of the node's own address, from the test itself.
args=(--kubeconfig="$admin" --provider=local --kubectl-path="$(dirname "$admin")/kubectl"
    --num-nodes="$nodes" --dns-domain="$CLUSTER_DOMAIN" --report-dir="$report" --ginkgo.no-color --ginkgo.v
    --ginkgo.focus="$focus" --ginkgo.skip="$skip" --ginkgo.timeout=3h)
started=$SECONDS
status=0
if ((procs > 1)); then
    on_node "$bin/ginkgo" --procs="$procs" --no-color "$bin/e2e.test" -- "${args[@]}" >"$report/e2e.log" 2>&1 || status=$?
else
    on_node "$bin/e2e.test" "${args[@]}" >"$report/e2e.log" 2>&1 || status=$?
fi
node_log "e2e.test exited $status after $((SECONDS - started)) s; log: $report/e2e.log"
grep -E '^(Ran [0-9]+ of|SUCCESS!|FAIL!)' "$report/e2e.log" || true
"$here/e2e-summary.py" "$report"/junit*.xml
exit "$status"
