#!/usr/bin/env bash
# Builds the control-plane binaries pinned by go.mod (kube-apiserver, kube-controller-manager,
# kubectl, etcd) into a cache folder keyed by the inputs' hash, and prints that folder as the last
# stdout line. Go's output goes to stderr. Safe to run concurrently: callers are serialized by flock.
set -euo pipefail

module=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$module"
cache=${ROADKEEPER_K8S_CACHE:-$HOME/.cache/roadkeeper/k8s}
out="$cache/$(cat go.mod go.sum build.sh | sha256sum | cut -c1-16)"
binaries=(kube-apiserver kube-controller-manager kubectl etcd)

built() {
    for binary in "${binaries[@]}"; do [[ -x "$out/$binary" ]] || return 1; done
}

if ! built; then
    mkdir -p "$cache"
    exec 9>"$out.lock"
    flock 9
    # Another caller may have finished the build while we waited for the lock.
    if ! built; then
        tmp=$(mktemp -d "$out.tmp.XXXXXX")
        trap 'rm -rf "$tmp"' EXIT
        export GOFLAGS=-buildvcs=false # the binaries must not depend on the state of the work tree
        go build -o "$tmp/" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
            k8s.io/kubernetes/cmd/kubectl >&2
        # The etcd main package's path ends in its major version, so name the binary explicitly.
        go build -o "$tmp/etcd" go.etcd.io/etcd/server/v3 >&2
        rm -rf "$out" # an incomplete folder (a binary deleted by hand): mv cannot replace it
        mv -T "$tmp" "$out"
    fi
fi
echo "$out"
