#!/usr/bin/env bash
# Runs upstream's Gateway API conformance suite (sigs.k8s.io/gateway-api/conformance, the release
# tests/gateway/go.mod pins) against roadkeeper's Gateway API implementation on a node brought up
# by up.sh, from rkn-out (a client outside the cluster), in the profile GATEWAY-HTTP; takes the
# node down afterwards. Writes the suite's conformance report and log; the last lines printed are
# each profile's result and counts (from the report), the failed tests, and the number of tests
# passed and failed. Exits non-zero if any test failed (or the suite could not run).
#
#   tests/node/gateway-conformance.sh [--report FILE] [--log FILE] [--run-test NAME]
#       [--supported-features LIST] [--skip-tests LIST] [--proxy-mode nftables|iptables]
#       [--keep-up] [-- SUITE-FLAG...]
#
# --report FILE: the conformance report (default ./gateway-conformance-report.yaml), replaced only
# if the suite wrote one. --log FILE: the suite's output (default ./gateway-conformance.log).
# --run-test NAME: only the test of that short name (e.g. HTTPRouteSimpleSameNamespace).
# --supported-features LIST: the features to test, comma-separated (e.g.
# Gateway,HTTPRoute,ReferenceGrant,HTTPRouteQueryParamMatching; the profile's core features are
# always in); without it (and without --run-test) the suite takes them from the GatewayClass's
# status.supportedFeatures.
# --skip-tests LIST: short names of tests not to run, comma-separated.
# --keep-up: leave the node up, with the suite's base resources (never cleaned up: the node goes
# away or stays to be looked at); tests/node/down.sh takes it down.
# SUITE-FLAGs go to the suite as they are, after the script's (e.g. -debug, -fail-fast,
# -timeout-config-overrides=GatewayMustHaveCondition:60, -test.timeout=1h).
#
# Builds (cached): the suite and the backends' binaries (tests/gateway/build.sh), their images
# (images.sh gateway). Then up.sh (one node, roadkeeper deployed), the images imported, the
# standard channel's CRDs of the pinned release installed (the suite checks their bundle-version
# annotation against its own), deploy/gateway.yaml applied (GatewayClass `roadkeeper`, controller
# roadkeeper.dev/gateway), the Gateways' address pool routed to the node in rkn-out, and the suite
# run there with the API server at the node's address. Without deploy/gateway.yaml the script
# creates the GatewayClass itself and, unless told otherwise, names the profile's core features
# (nothing accepts the class: the suite fails in its setup; its report lists no test).
# Needs what up.sh and images.sh need, Go and its module proxy.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=tests/node/lib.sh
source "$here/lib.sh"

report=$PWD/gateway-conformance-report.yaml
log=$PWD/gateway-conformance.log
run_test=''
supported_features=''
skip_tests=''
proxy_mode=nftables
keep_up=0
extra=()
while (($#)); do
    case $1 in
        --report) report=${2:?--report needs a file}; shift 2 ;;
        --log) log=${2:?--log needs a file}; shift 2 ;;
        --run-test) run_test=${2:?--run-test needs a test name}; shift 2 ;;
        --supported-features) supported_features=${2:?--supported-features needs a list}; shift 2 ;;
        --skip-tests) skip_tests=${2:?--skip-tests needs a list}; shift 2 ;;
        --proxy-mode) proxy_mode=${2:?--proxy-mode needs nftables or iptables}; shift 2 ;;
        --keep-up) keep_up=1; shift ;;
        --) shift; extra=("$@"); break ;;
        -h | --help) sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) node_fail "unknown argument $1 (see --help)" ;;
    esac
done
((EUID == 0)) || node_fail "needs root (up.sh, network namespaces)"
mkdir -p "$(dirname "$report")" "$(dirname "$log")"
report=$(cd "$(dirname "$report")" && pwd)/$(basename "$report")
log=$(cd "$(dirname "$log")" && pwd)/$(basename "$log")
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' "$repo/Cargo.toml")
[[ -n $version ]] || node_fail "no version in [workspace.package] of Cargo.toml"

started=$SECONDS
bin=$("$repo/tests/gateway/build.sh")
archives=$("$here/images.sh" gateway)
node_log "builds ready after $((SECONDS - started)) s"

work=$(mktemp -d)
node_up=0
# shellcheck disable=SC2317 # run by the EXIT trap
finish() {
    local status=$?
    rm -rf "$work"
    if ((node_up && !keep_up)); then
        "$here/down.sh" || status=1
    elif ((node_up)); then
        node_log "the node stays up (--keep-up): kubeconfig $admin; tests/node/down.sh takes it down"
    fi
    exit "$status"
}
trap finish EXIT
admin=$("$here/up.sh" --proxy-mode "$proxy_mode" | tail -1)
node_up=1
kubectl() { "$(dirname "$admin")/kubectl" --kubeconfig "$admin" "$@"; }

node_log "importing the suite's backend images"
for i in $(seq "$(node_count)"); do
    for archive in $archives; do node_ctr "$i" images import "$archive" >/dev/null; done
done

node_log "Gateway API CRDs (standard channel, $(grep -h -m1 'bundle-version:' "$bin"/crds/*.yaml | head -1 | awk '{print $2}'))"
# Server-side: the CRDs are too large for the annotation client-side apply keeps.
kubectl apply --server-side -f "$bin/crds/" >/dev/null
mapfile -t crds < <(kubectl get crd -o name | grep '\.gateway\.networking\.k8s\.io$')
kubectl wait --for=condition=Established --timeout=60s "${crds[@]}" >/dev/null

if [[ -e $repo/deploy/gateway.yaml ]]; then
    node_log "deploying the Gateway API implementation (deploy/gateway.yaml)"
    objects=$(kubectl apply -f "$repo/deploy/gateway.yaml" \
        -o jsonpath='{range .items[*]}{.kind} {.metadata.name} {.metadata.namespace}{"\n"}{end}')
    while read -r kind name namespace; do
        case $kind in
            Deployment | DaemonSet)
                if ! kubectl -n "$namespace" rollout status "${kind,,}/$name" --timeout=180s >&2; then
                    kubectl -n "$namespace" get pods -o wide >&2 || true
                    kubectl -n "$namespace" logs "${kind,,}/$name" --all-containers --tail=30 >&2 || true
                    node_fail "$kind $namespace/$name of deploy/gateway.yaml is not ready"
                fi
                ;;
        esac
    done <<<"$objects"
else
    node_log "warning: no deploy/gateway.yaml: creating GatewayClass roadkeeper, which nothing will accept"
    kubectl apply -f - >/dev/null <<'GATEWAYCLASS'
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata:
  name: roadkeeper
spec:
  controllerName: roadkeeper.dev/gateway
GATEWAYCLASS
    # Nothing publishes the class's supported features, and without them the suite stops before
    # it writes a report: name the profile's core features.
    if [[ -z $supported_features && -z $run_test ]]; then supported_features=Gateway,HTTPRoute,ReferenceGrant; fi
fi

# The suite is a client outside the cluster: in rkn-out, reaching the Gateways' addresses through
# the node (which the implementation makes them local on) and the API server at the node's address.
in_out ip route replace "$GATEWAY_POOL" via "$NODE_IP"
sed "s|server: https://127.0.0.1:$APISERVER_PORT\$|server: https://$NODE_IP:$APISERVER_PORT|" "$admin" >"$work/kubeconfig"
grep -q "server: https://$NODE_IP:$APISERVER_PORT\$" "$work/kubeconfig" || node_fail "cannot point $admin at $NODE_IP"

args=(-test.v -test.run='^TestConformance$' -test.timeout=6h
    -gateway-class=roadkeeper -conformance-profiles=GATEWAY-HTTP
    -organization=roadkeeper -project=roadkeeper -url=https://github.com/roadkeeper/roadkeeper
    -version="$version" -contact=https://github.com/roadkeeper/roadkeeper/issues/new
    -report-output="$work/report.yaml"
    # The node goes away afterwards, or stays up (--keep-up) to be looked at.
    -cleanup-base-resources=false)
if [[ -n $run_test ]]; then args+=(-run-test="$run_test"); fi
if [[ -n $supported_features ]]; then args+=(-supported-features="$supported_features"); fi
if [[ -n $skip_tests ]]; then args+=(-skip-tests="$skip_tests"); fi
args+=("${extra[@]}")
node_log "conformance.test ${args[*]}"
node_log "log: $log"
started=$SECONDS
status=0
(cd "$work" && in_out env -u HTTP_PROXY -u HTTPS_PROXY -u http_proxy -u https_proxy \
    KUBECONFIG="$work/kubeconfig" "$bin/conformance.test" "${args[@]}") >"$log" 2>&1 || status=$?
node_log "conformance.test exited $status after $((SECONDS - started)) s"
if [[ -s $work/report.yaml ]]; then
    install -m 644 "$work/report.yaml" "$report"
    node_log "report: $report"
else
    node_log "the suite wrote no report"
fi

# The verdicts of go test on each conformance test (the subtests of TestConformance), then the
# report's per profile and level (core, extended).
verdicts=$(sed -n 's/^    --- \(PASS\|FAIL\|SKIP\): TestConformance\/\([^/ ]*\) .*/\1 \2/p' "$log")
count() { grep -c "^$1 " <<<"$verdicts" || true; }
if [[ -z $verdicts ]]; then
    echo "no conformance test ran: the suite stopped before them"
    grep -E '^\s+Messages:' "$log" | sed 's/^\s*Messages:\s*/  /' | head -3 || true
fi
if [[ -s $work/report.yaml ]]; then
    # sigs.k8s.io/yaml sorts keys: each profile's core and extended come before its name.
    awk '/^- core:$|^  core:$/ { level = "core"; next }
        /^  extended:$/ { level = "extended"; next }
        /^    result: / { result[level] = $2 }
        /^      (Passed|Failed|Skipped): / { n[level, $1] = $2 }
        /^  name: / {
            for (i = 1; i <= 2; i++) {
                level = i == 1 ? "core" : "extended"
                if (level in result) printf "%s %s: %s (%d passed, %d failed, %d skipped)\n", $2, level,
                    result[level], n[level, "Passed:"], n[level, "Failed:"], n[level, "Skipped:"]
            }
            delete result; delete n
        }' "$report"
fi
grep '^FAIL ' <<<"$verdicts" | sed 's/^FAIL /failed: /' || true
echo "gateway conformance: $(count PASS) passed, $(count FAIL) failed (exit $status)"
exit "$status"
