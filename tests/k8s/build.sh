#!/usr/bin/env bash
# Builds the Kubernetes binaries pinned by go.mod into a cache folder keyed by the inputs' hash,
# and prints that folder as the last stdout line. Go's output goes to stderr. Safe to run
# concurrently: callers are serialized by flock.
#
#   build.sh         the control plane of the API-server tests: kube-apiserver,
#                    kube-controller-manager, kubectl, etcd
#   build.sh node    and kube-scheduler and kubelet (tests/node/up.sh)
#   build.sh e2e     and upstream's end-to-end tests: e2e.test, the ginkgo runner, and agnhost
#                    (static, for its image; tests/node/e2e.sh)
#
# The binaries report the pinned release as their version (kubectl version, the Node's
# kubeletVersion), as a release build does.
set -euo pipefail

module=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$module"
cache=${ROADKEEPER_K8S_CACHE:-$HOME/.cache/roadkeeper/k8s}
out="$cache/$(cat go.mod go.sum build.sh | sha256sum | cut -c1-16)"
packages=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
    k8s.io/kubernetes/cmd/kubectl go.etcd.io/etcd/server/v3)
case ${1:-} in
    "") ;;
    node) packages+=(k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet) ;;
    e2e) packages+=(k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/test/e2e
        github.com/onsi/ginkgo/v2/ginkgo k8s.io/kubernetes/test/images/agnhost) ;;
    *) echo "build.sh: unknown set $1 (none, node or e2e)" >&2; exit 2 ;;
esac

# The binary a package builds: its last path element, but etcd's main package ends in its major
# version, and the end-to-end suite is a test binary.
binary() {
    case $1 in
        go.etcd.io/etcd/server/v3) echo etcd ;;
        k8s.io/kubernetes/test/e2e) echo e2e.test ;;
        *) basename "$1" ;;
    esac
}
missing() {
    for package in "${packages[@]}"; do [[ -x "$out/$(binary "$package")" ]] || echo "$package"; done
}

if [[ -n $(missing) ]]; then
    mkdir -p "$cache"
    exec 9>"$out.lock"
    flock 9
    # Another caller may have finished the build while we waited for the lock.
    mapfile -t todo < <(missing)
    if ((${#todo[@]})); then
        tmp=$(mktemp -d "$out.tmp.XXXXXX")
        trap 'rm -rf "$tmp"' EXIT
        export GOFLAGS=-buildvcs=false # the binaries must not depend on the state of the work tree
        release=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
        minor=${release#v*.}
        version=k8s.io/component-base/version
        ldflags="-X $version.gitVersion=$release -X $version.gitMajor=1 -X $version.gitMinor=${minor%%.*}"
        ldflags+=" -X $version.gitTreeState=clean"
        for package in "${todo[@]}"; do
            case $package in
                k8s.io/kubernetes/test/e2e) go test -c -ldflags "$ldflags" -o "$tmp/e2e.test" "$package" >&2 ;;
                # The version upstream's image of this release carries (test/images/agnhost/VERSION).
                */agnhost) CGO_ENABLED=0 go build -ldflags "$ldflags -X main.Version=2.56" -o "$tmp/agnhost" "$package" >&2 ;;
                *) go build -ldflags "$ldflags" -o "$tmp/$(binary "$package")" "$package" >&2 ;;
            esac
        done
        mkdir -p "$out"
        mv "$tmp"/* "$out/"
    fi
fi
echo "$out"
