#!/usr/bin/env bash
# Builds every image the node runs, with buildah (no daemon) and no registry, into
# $IMAGES_CACHE (default ~/.cache/roadkeeper/node-images) as docker archives that up.sh imports
# into containerd. Each archive is keyed by the hash of its inputs, so a second run rebuilds only
# what changed. Prints the archives' paths, one per line.
#
#   tests/node/images.sh         the node's images (below)
#   tests/node/images.sh e2e     the images upstream's [sig-network] tests run, under the names
#                                they expect (agnhost with CoreDNS, jessie-dnsutils, nginx,
#                                busybox, distroless-iptables, regression-issue-74839)
#   tests/node/images.sh coredns CoreDNS v1.12.2 as registry.k8s.io/coredns/coredns:v1.12.2 (images/
#                                coredns, from the binary below), for up.sh --dns coredns
#   tests/node/images.sh gateway the backends of the Gateway API conformance suite, under the
#                                names its manifests use (images/echo-basic/NAME: one build
#                                tagged as each release they name; images/coredns/NAME), from
#                                the binaries tests/gateway/build.sh builds
#
#   debian:bookworm-slim                 debootstrap --variant=minbase (the base of the others)
#   registry.k8s.io/pause:3.10.1         images/pause: pause.c, static, on an empty base
#   ghcr.io/roadkeeper/roadkeeper:0.1.0  deploy/Dockerfile with BUILD=prebuilt: the binary in
#                                        $ROADKEEPER_BINARY, or a `dist` build (fat LTO) of the workspace
#   docker.io/library/nginx:1.27         images/web: Debian's nginx, for examples/hello
#
# Needs root, buildah, debootstrap, gcc, and Debian's package mirror; the e2e, coredns and gateway
# images also Go and its module proxy (tests/k8s/build.sh, tests/gateway/build.sh, CoreDNS below).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=tests/node/lib.sh
source "$here/lib.sh"

mkdir -p "$IMAGES_CACHE"
exec 9>"$IMAGES_CACHE/lock"
flock 9
buildah=(buildah --root "$IMAGES_CACHE/storage" --runroot "$IMAGES_CACHE/run" --storage-driver overlay)
work=$(mktemp -d)
# buildah keeps the working containers of a build (and their overlay mounts): none may outlive it.
trap '"${buildah[@]}" rm --all >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
current=()

# key: a short hash of stdin.
key() { sha256sum | cut -c1-16; }

# The base, debian:bookworm-slim, from debootstrap (minbase: apt, no docs stripped). Its key
# changes only with this description: bump it to rebuild the base.
base_key=$(echo "debootstrap --variant=minbase bookworm, apt caches removed" | key)
if [[ ! -e "$IMAGES_CACHE/base-$base_key.done" ]]; then
    node_log "debootstrap bookworm (minbase) for debian:bookworm-slim"
    debootstrap --variant=minbase bookworm "$work/rootfs" http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 ||
        { tail -20 "$work/debootstrap.log" >&2; node_fail "debootstrap failed"; }
    rm -rf "$work"/rootfs/var/cache/apt/archives/*.deb "$work"/rootfs/var/lib/apt/lists/*
    tar --numeric-owner -C "$work/rootfs" --exclude='./dev/*' -cf "$work/base.tar" .
    rm -rf "$work/rootfs"
    container=$("${buildah[@]}" from scratch)
    "${buildah[@]}" add "$container" "$work/base.tar" / >/dev/null
    "${buildah[@]}" config --cmd bash "$container"
    "${buildah[@]}" commit -q --rm "$container" docker.io/library/debian:bookworm-slim >/dev/null
    rm "$work/base.tar"
    touch "$IMAGES_CACHE/base-$base_key.done"
fi

# image NAME CONTEXT DOCKERFILE [BUILD-ARG...]: builds NAME unless its archive for these inputs
# (and this base) exists.
image() {
    local name=$1 context=$2 dockerfile=$3
    shift 3
    local hash
    hash=$(cd "$context" && find . -type f -print0 | sort -z | xargs -0 sha256sum | cat - "$dockerfile" "$here/images.sh" <(echo "$base_key $*") | key)
    local file archive
    file=$(echo "$name" | tr '/:' '__')
    archive="$IMAGES_CACHE/$file-$hash.tar"
    if [[ ! -e "$archive" ]]; then
        node_log "building $name"
        local args=()
        for arg in "$@"; do args+=(--build-arg "$arg"); done
        "${buildah[@]}" bud -q --isolation chroot --pull=never --layers "${args[@]}" -f "$dockerfile" -t "$name" "$context" >/dev/null
        rm -f "$IMAGES_CACHE/$file"-*.tar
        "${buildah[@]}" push -q "$name" "docker-archive:$archive.tmp:$name"
        mv "$archive.tmp" "$archive"
    fi
    current+=("$archive")
}

# CoreDNS, from its own go.mod and go.sum (go install module@version), static; built once per
# version. Prints the binary's path.
coredns_binary() {
    local version=v1.12.2
    local coredns="$IMAGES_CACHE/coredns-$version/coredns"
    if [[ ! -x $coredns ]]; then
        node_log "go install github.com/coredns/coredns@$version"
        mkdir -p "$work/gobin"
        CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOBIN="$work/gobin" go install -trimpath -ldflags='-s -w' \
            "github.com/coredns/coredns@$version" >&2
        mkdir -p "${coredns%/*}"
        mv "$work/gobin/coredns" "$coredns"
    fi
    echo "$coredns"
}

if [[ ${1:-} == coredns ]]; then
    mkdir -p "$work/coredns"
    cp "$(coredns_binary)" "$work/coredns/coredns"
    image "$(cat "$here/images/coredns/NAME")" "$work/coredns" "$here/images/coredns/Dockerfile"
elif [[ ${1:-} == gateway ]]; then
    bin=$("$repo/tests/gateway/build.sh")
    for name in echo-basic coredns; do
        mkdir -p "$work/$name"
        cp "$bin/$name" "$work/$name/$name"
        # One build, one archive per name: a docker archive written by buildah holds one tag.
        mapfile -t tags <"$here/images/$name/NAME"
        for tag in "${tags[@]}"; do image "$tag" "$work/$name" "$here/images/$name/Dockerfile"; done
    done
elif [[ ${1:-} == e2e ]]; then
    # First what needs no build of the pinned release's binaries (which may still be under way).
    image "$(cat "$here/images/web/NAME")" "$here/images/web" "$here/images/web/Dockerfile"
    for name in jessie-dnsutils e2e-nginx busybox distroless-iptables; do
        image "$(cat "$here/images/$name/NAME")" "$here/images/$name" "$here/images/$name/Dockerfile"
    done
    # As upstream builds it: the program of the pinned Kubernetes module (tests/k8s), static.
    mkdir -p "$work/regression-issue-74839"
    (cd "$repo/tests/k8s" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath \
        -o "$work/regression-issue-74839/" k8s.io/kubernetes/test/images/regression-issue-74839 >&2)
    image "$(cat "$here/images/regression-issue-74839/NAME")" "$work/regression-issue-74839" \
        "$here/images/regression-issue-74839/Dockerfile"
    # CoreDNS for agnhost's /coredns (upstream's image holds a release of it).
    coredns=$(coredns_binary)
    bin=$("$repo/tests/k8s/build.sh" e2e)
    mkdir -p "$work/agnhost"
    strip -o "$work/agnhost/agnhost" "$bin/agnhost"
    cp "$coredns" "$work/agnhost/coredns"
    # porter's TLS ports serve this pair (the tests do not verify it). Made once, so that the
    # image's inputs stay the same.
    if [[ ! -e "$IMAGES_CACHE/porter/localhost.key" ]]; then
        mkdir -p "$IMAGES_CACHE/porter"
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 -subj /CN=localhost \
            -addext "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1" \
            -keyout "$IMAGES_CACHE/porter/localhost.key" -out "$IMAGES_CACHE/porter/localhost.crt" 2>/dev/null
    fi
    cp "$IMAGES_CACHE"/porter/localhost.{crt,key} "$work/agnhost/"
    image "$(cat "$here/images/agnhost/NAME")" "$work/agnhost" "$here/images/agnhost/Dockerfile"
else
    mkdir -p "$work/pause"
    gcc -O2 -static -o "$work/pause/pause" "$here/images/pause/pause.c"
    strip "$work/pause/pause"
    image "$(cat "$here/images/pause/NAME")" "$work/pause" "$here/images/pause/Dockerfile"

    image "$(cat "$here/images/web/NAME")" "$here/images/web" "$here/images/web/Dockerfile"

    mkdir -p "$work/roadkeeper"
    binary=${ROADKEEPER_BINARY:-}
    if [[ -z $binary ]]; then
        node_log "cargo build --profile dist -p roadkeeper"
        (cd "$repo" && cargo build --profile dist --locked -p roadkeeper >&2)
        binary="$repo/target/dist/roadkeeper"
    fi
    # Debug information is most of the binary's size, and none of the image's purpose.
    strip -o "$work/roadkeeper/roadkeeper" "$binary"
    image ghcr.io/roadkeeper/roadkeeper:0.1.0 "$work/roadkeeper" "$repo/deploy/Dockerfile" BUILD=prebuilt
fi

printf '%s\n' "${current[@]}"
