#!/usr/bin/env bash
# roadkeeper and upstream kube-proxy (the release pinned in bench/kube-proxy, the same as
# tests/k8s) side by side: one real kube-apiserver holding a synthetic cluster, each proxy in
# nftables and iptables mode in turn, every change timed from the API call to the first
# connection through the kernel's rules that shows it. Needs root, Go and the Rust toolchain.
#
#   sudo bench/vs-upstream.sh [--services 1000,10000] [--runs 20] [--out bench/results]
#                             [--proxies roadkeeper-nftables,kube-proxy-nftables,...]
#                             [--cold-limit SECONDS] [--iptables-max 10000]
#   sudo bench/vs-upstream.sh --replot DIR/vs-upstream.md    (the plots of a table, again)
#
# Writes a Markdown table to stdout and, with --out, vs-upstream.md and SVG plots there, after
# every row (a run stopped early keeps what it measured).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
services=1000 runs=20 out="" proxies="" cold_limit=900 iptables_max=10000 replot=""
while (($#)); do
    case $1 in
        --services) services=$2; shift 2 ;;
        --runs) runs=$2; shift 2 ;;
        --out) out=$(realpath -m "$2"); shift 2 ;;
        --proxies) proxies=$2; shift 2 ;;
        --cold-limit) cold_limit=$2; shift 2 ;;
        --iptables-max) iptables_max=$2; shift 2 ;;
        --replot) replot=$(realpath "$2"); shift 2 ;;
        -h|--help) sed -n '2,15p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "vs-upstream.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

# kube-proxy of the pinned release, built once into a cache folder keyed by its module.
module=$root/bench/kube-proxy
cache=${ROADKEEPER_K8S_CACHE:-$HOME/.cache/roadkeeper/k8s}
bin="$cache/kube-proxy-$(cat "$module/go.mod" "$module/go.sum" | sha256sum | cut -c1-16)"
if [[ ! -x $bin/kube-proxy ]]; then
    mkdir -p "$bin"
    release=$(cd "$module" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
    minor=${release#v*.}
    version=k8s.io/component-base/version
    ldflags="-X $version.gitVersion=$release -X $version.gitMajor=1 -X $version.gitMinor=${minor%%.*}"
    (cd "$module" && GOFLAGS=-buildvcs=false go build -ldflags "$ldflags" -o "$bin/kube-proxy.tmp" \
        k8s.io/kubernetes/cmd/kube-proxy >&2)
    mv "$bin/kube-proxy.tmp" "$bin/kube-proxy"
fi

export RK_KUBE_PROXY=$bin/kube-proxy RK_BENCH_SERVICES=$services RK_BENCH_RUNS=$runs
export RK_BENCH_COLD_LIMIT=$cold_limit RK_BENCH_IPTABLES_MAX=$iptables_max
[[ -n $out ]] && export RK_BENCH_OUT=$out
[[ -n $proxies ]] && export RK_BENCH_PROXIES=$proxies
[[ -n $replot ]] && export RK_BENCH_REPLOT=$replot
cd "$root"
exec cargo test --profile dist -q -p roadkeeper --test bench_upstream -- --ignored --nocapture
