#!/usr/bin/env bash
# Builds what tests/node/gateway-conformance.sh needs of the Gateway API release pinned by go.mod
# into a cache folder keyed by the inputs' hash, and prints that folder as the last stdout line.
# Go's output goes to stderr. Safe to run concurrently: callers are serialized by flock.
#
#   tests/gateway/build.sh
#
# The folder holds:
#   conformance.test  upstream's conformance suite (go test -c of sigs.k8s.io/gateway-api/conformance)
#   echo-basic        the suite's backend (conformance/echo-basic), static, for its image
#   coredns           CoreDNS $COREDNS_VERSION (below), static, for the image of the suite's UDP
#                     backend; built from its own go.mod and go.sum (go install module@version)
#   crds/             the standard channel's CRDs (config/crd/standard of sigs.k8s.io/gateway-api)
# Needs Go and the Go module proxy (or the modules in the module cache).
# Environment: ROADKEEPER_GATEWAY_CACHE (default ~/.cache/roadkeeper/gateway).
set -euo pipefail

module=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$module"
# The release registry.k8s.io/coredns/coredns:v1.12.2 of the suite's base manifests was built from.
COREDNS_VERSION=v1.12.2
cache=${ROADKEEPER_GATEWAY_CACHE:-$HOME/.cache/roadkeeper/gateway}
out="$cache/$(cat go.mod go.sum build.sh | sha256sum | cut -c1-16)"
products=(conformance.test echo-basic coredns crds)
missing() {
    for product in "${products[@]}"; do [[ -e "$out/$product" ]] || echo "$product"; done
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
        for product in "${todo[@]}"; do
            echo "build.sh: $product" >&2
            case $product in
                conformance.test) go test -c -o "$tmp/conformance.test" sigs.k8s.io/gateway-api/conformance >&2 ;;
                # As upstream's image builds it (docker/Dockerfile.echo-basic), from this module's pins.
                echo-basic) CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$tmp/echo-basic" \
                    sigs.k8s.io/gateway-api/conformance/echo-basic >&2 ;;
                coredns)
                    mkdir -p "$tmp/gobin"
                    CGO_ENABLED=0 GOBIN="$tmp/gobin" go install -trimpath -ldflags='-s -w' \
                        "github.com/coredns/coredns@$COREDNS_VERSION" >&2
                    mv "$tmp/gobin/coredns" "$tmp/coredns"
                    rmdir "$tmp/gobin"
                    ;;
                crds)
                    dir=$(go mod download -json sigs.k8s.io/gateway-api | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
                    [[ -d $dir/config/crd/standard ]] || { echo "build.sh: no config/crd/standard in '$dir'" >&2; exit 1; }
                    mkdir "$tmp/crds"
                    cp "$dir"/config/crd/standard/*.yaml "$tmp/crds/"
                    chmod u+w "$tmp"/crds/*.yaml
                    ;;
            esac
        done
        mkdir -p "$out"
        mv "$tmp"/* "$out/"
    fi
fi
echo "$out"
