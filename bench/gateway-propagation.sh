#!/usr/bin/env bash
# Route propagation of `roadkeeper gateway` against one real kube-apiserver (the test control
# plane of tests/k8s): HTTPRoutes added one at a time with `kubectl apply`, each timed until its
# hostname answers 200 (404 until then), on a quiet gateway and under load on another route (no
# load request may fail); and the route compiler's cost of one change against a full build.
# Needs root, Go (the control plane and the Gateway API CRDs) and the Rust toolchain.
#
#   sudo bench/gateway-propagation.sh [--routes 3000] [--out bench/results]
#
# Prints Markdown tables; with --out, writes them to gateway-propagation.md there too.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
routes=3000 out=""
while (($#)); do
    case $1 in
        --routes) routes=$2; shift 2 ;;
        --out) out=$(realpath -m "$2"); shift 2 ;;
        -h|--help) sed -n '2,10p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "gateway-propagation.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

"$root/tests/k8s/build.sh" >/dev/null
export RK_BENCH_ROUTES=$routes
[[ -n $out ]] && export RK_BENCH_OUT=$out
cd "$root"
exec cargo test --profile dist -q -p roadkeeper --test bench_gateway -- --ignored --nocapture
