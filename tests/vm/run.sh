#!/usr/bin/env bash
# Runs the proxy end-to-end suites (crates/roadkeeper/tests/proxy_*.rs) on another kernel, in a
# qemu virtual machine whose userland is this host's: only the kernel differs.
#
#   tests/vm/run.sh [--kernel PATH] [--backend nftables|iptables|ipvs|ebpf|all] [--timeout SECONDS]
#                   [--subset FILE] [--modules DIR] [--exec CMD] [--accel kvm|tcg] [--cpus N]
#                   [--memory SIZE] [--out DIR] [-- FILTER...]
#
#   --kernel PATH   a kernel: a linux-image .deb (unpacked into the cache), or a vmlinuz whose
#                   modules are in --modules DIR, else in ../lib/modules/<release> next to it
#                   (the layout `dpkg-deb -x` makes), or a name of tests/vm/kernels (a .deb
#                   fetched once by URL and checked: `debian-11` is Linux 5.10). Default: Debian
#                   12's linux-image-amd64 (6.1.x), fetched once with `apt-get download`.
#   --modules DIR   the kernel's /lib/modules/<release> folder (for a vmlinuz elsewhere).
#   --backend B     which per_backend! cases run: `B::*` of every proxy_*.rs binary (the tests of
#                   no backend module run with nftables). `ipvs` runs the IPVS smoke check
#                   (modules, a virtual server programmed and listed with ipvsadm), then the
#                   proxy crate's IPVS kernel tests (`roadkeeper-proxy`'s `ipvs::` unit tests),
#                   then the `ipvs::*` cases; both with --include-ignored, as they are ignored on
#                   hosts without IPVS. `ebpf` runs the loader's kernel tests (`roadkeeper-proxy`'s
#                   ebpf_kernel.rs: every BPF program through this kernel's verifier), then the
#                   `ebpf::*` cases and those of proxy_ebpf.rs; on a kernel older than 5.18, only
#                   a check that `proxy --proxy-mode ebpf` refuses it saying so. `all` (default)
#                   runs all four in one boot.
#   -- FILTER...    libtest-style substring filters (any of them) on top of the backend's.
#   --subset FILE   more filters, one a line ("#" comments): tests/vm/ci.subset is CI's subset.
#   --timeout S     bound on the VM's whole run (default 3600); --accel forces kvm or tcg.
#   --exec CMD      run `sh -c CMD` in the VM instead of the suites (nothing is built; for
#                   trying a command on that kernel, e.g. --exec 'modprobe ip_vs && ipvsadm -Ln').
#   --out DIR       a folder of this host that the VM can write, at the same path (everything
#                   else of the host is read-only there): for reports that must outlive the VM.
#
# Environment: ROADKEEPER_VM_CACHE (default ~/.cache/roadkeeper/vm), RUST_TEST_THREADS (passed
# to the tests in the VM; default: the VM's CPUs).
#
# How: the test binaries are built here (`cargo test -p roadkeeper --no-run`); a small initramfs
# (Debian's busybox-static, the kernel's virtio/9p/overlay modules) mounts this host's / read-only
# over virtio-9p with a tmpfs overlay on top, binds the VM kernel's modules on /lib/modules and
# switch_roots into it, so nft, iptables (both flavours), conntrack, ipvsadm, kmod and the binaries
# are the host's at their own paths (the test binaries and target/debug/roadkeeper as copied when
# the run starts, so a concurrent build changes nothing). br_netfilter is loaded as a node's
# prerequisites do; the kernel loads every other module itself (modprobe). The serial console
# carries the libtest report (streamed here as it runs), a writable 9p share the exit status.
# Real hardware KVM (kvm_intel/kvm_amd) is used when present; otherwise TCG (this machine's
# kvm_pvm boots no stock kernel). qemu is always killed on exit and the temp dir removed.
#
# Exit status: the tests' (0 when all passed), 1 on a harness error, 124 on timeout.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cache=${ROADKEEPER_VM_CACHE:-$HOME/.cache/roadkeeper/vm}
kernel="" modules="" exec="" out="" backend=all timeout=3600 accel="" cpus=2 memory=3G
filters=()

die() { echo "vm: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
    case $1 in
        --kernel) kernel=${2:?--kernel needs a path}; shift 2 ;;
        --modules) modules=${2:?--modules needs a folder}; shift 2 ;;
        --exec) exec=${2:?--exec needs a command}; shift 2 ;;
        --backend) backend=${2:?--backend needs a value}; shift 2 ;;
        --subset) [ -r "${2:?--subset needs a file}" ] || die "cannot read $2"
            mapfile -t -O "${#filters[@]}" filters < <(sed 's/#.*//; s/[[:space:]]*$//; /^$/d' "$2"); shift 2 ;;
        --timeout) timeout=${2:?--timeout needs seconds}; shift 2 ;;
        --accel) accel=${2:?--accel needs kvm or tcg}; shift 2 ;;
        --cpus) cpus=${2:?--cpus needs a number}; shift 2 ;;
        --memory) memory=${2:?--memory needs a size}; shift 2 ;;
        --out) out=${2:?--out needs a folder}; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        --) shift; filters+=("$@"); break ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done
case $backend in
    nftables | iptables | ipvs | ebpf) backends=("$backend") ;;
    all) backends=(nftables iptables ipvs ebpf) ;;
    *) die "--backend must be nftables, iptables, ipvs, ebpf or all, not $backend" ;;
esac
out_args=()
if [ -n "$out" ]; then
    mkdir -p "$out" && out=$(realpath "$out") || die "cannot make --out $out"
    out_args=(-virtfs "local,path=$out,mount_tag=vmout,security_model=none")
fi
case $accel in
    "" | kvm | tcg) ;;
    *) die "--accel must be kvm or tcg, not $accel" ;;
esac
for tool in qemu-system-x86_64 depmod modprobe dpkg-deb apt-get cargo jq curl sha256sum; do
    command -v "$tool" >/dev/null || die "$tool is missing: install tests/vm/packages"
done

# Unpacks a Debian package into the cache (once) and prints the folder.
unpack() {
    local deb=$1 dir
    dir="$cache/unpacked/$(basename "$deb" .deb)"
    if [ ! -e "$dir/.done" ]; then
        rm -rf "$dir" && mkdir -p "$dir"
        dpkg-deb -x "$deb" "$dir"
        touch "$dir/.done"
    fi
    echo "$dir"
}

# Downloads a package of the host's apt sources into the cache (once) and prints the .deb.
download() {
    local package=$1 version deb
    mkdir -p "$cache/debs"
    version=$(apt-cache show --no-all-versions "$package" | sed -n 's/^Version: //p' | head -n1)
    [ -n "$version" ] || die "apt knows no package $package (apt-get update?)"
    deb=$(find "$cache/debs" -name "${package}_${version//:/%3a}_*.deb" | head -n1)
    if [ -z "$deb" ]; then
        (cd "$cache/debs" && apt-get download "$package" >&2) || die "apt-get download $package failed"
        deb=$(find "$cache/debs" -name "${package}_${version//:/%3a}_*.deb" | head -n1)
    fi
    [ -n "$deb" ] || die "apt-get download $package left no .deb"
    echo "$deb"
}

# Downloads the kernel named in tests/vm/kernels into the cache (once, checked) and prints the .deb.
fetch_named() {
    local name=$1 url sum deb
    read -r url sum < <(awk -v n="$name" '$1 == n { print $2, $3 }' "$repo/tests/vm/kernels")
    [ -n "$url" ] || die "no kernel named $name in tests/vm/kernels"
    mkdir -p "$cache/debs"
    deb="$cache/debs/$(basename "$url")"
    if [ ! -e "$deb" ]; then
        curl -fsS --retry 3 -o "$deb.part" "$url" || die "cannot download $url"
        mv "$deb.part" "$deb"
    fi
    echo "$sum  $deb" | sha256sum -c --quiet >&2 || { rm -f "$deb"; die "$deb does not match its SHA-256"; }
    echo "$deb"
}

# The kernel: vmlinuz and its modules folder (lib/modules/<release>).
if [ -n "$kernel" ] && [ ! -e "$kernel" ] && [[ $kernel != */* ]]; then
    kernel=$(fetch_named "$kernel")
fi
if [ -z "$kernel" ]; then
    image=$(apt-cache depends linux-image-amd64 | sed -n 's/^ *Depends: \(linux-image-[^ ]*\)$/\1/p' | head -n1)
    [ -n "$image" ] || die "cannot resolve linux-image-amd64 (apt-get update?)"
    kernel=$(download "$image")
fi
[ -e "$kernel" ] || die "no kernel at $kernel"
if [[ $kernel == *.deb ]]; then
    root=$(unpack "$(realpath "$kernel")")
    kernel=$(find "$root/boot" -name 'vmlinuz-*' | head -n1)
    [ -n "$kernel" ] || die "no boot/vmlinuz-* in the package"
fi
kernel=$(realpath "$kernel")
if [ -z "$modules" ]; then
    release=$(basename "$kernel" | sed -n 's/^vmlinuz-//p')
    modules=$(dirname "$kernel")/../lib/modules/$release
    [ -n "$release" ] && [ -d "$modules" ] || die "no modules for $kernel: pass --modules DIR"
fi
modules=$(realpath "$modules")
release=$(basename "$modules")
moduleroot=${modules%/lib/modules/$release}
[ "$moduleroot" != "$modules" ] || die "--modules must end in lib/modules/<release>, not $modules"
# Debian's packages leave modules.dep to the postinst: make it (depmod writes into the cache).
[ -e "$modules/modules.dep" ] || depmod -b "$moduleroot" "$release" || die "depmod failed for $modules"

# Hardware KVM, unless it is PVM (which boots only PVM guest kernels) or absent: TCG then.
if [ -z "$accel" ]; then
    accel=tcg
    if [ -w /dev/kvm ] && [ ! -e /sys/module/kvm_pvm ] &&
        { [ -e /sys/module/kvm_intel ] || [ -e /sys/module/kvm_amd ]; }; then
        accel=kvm
    fi
fi
if [ "$accel" = kvm ]; then accel_args=(-accel kvm -cpu host); else accel_args=(-accel tcg,thread=multi -cpu max); fi

busybox=$(unpack "$(download busybox-static)")/bin/busybox
[ -x "$busybox" ] || die "busybox-static has no bin/busybox"

# The test binaries (built here: the VM runs them at the paths their env!() baked in).
binaries=() programs=()
[ -n "$exec" ] || echo "vm: building the proxy suites" >&2
[ -n "$exec" ] || artifacts=$(cd "$repo" && cargo test -p roadkeeper --no-run --message-format=json $(
    for f in crates/roadkeeper/tests/proxy_*.rs; do t=$(basename "$f" .rs); echo "--test $t"; done)) ||
    die "cargo test --no-run failed (above)"
[ -n "$exec" ] || mapfile -t binaries < <(jq -r 'select(.reason == "compiler-artifact" and .profile.test and .executable)
    | .executable' <<<"$artifacts")
[ -n "$exec" ] || mapfile -t programs < <(jq -r 'select(.reason == "compiler-artifact" and (.profile.test | not) and .executable)
    | .executable' <<<"$artifacts")
[ -n "$exec" ] || [ ${#binaries[@]} -gt 0 ] || die "cargo built no proxy test binaries"
# The proxy crate's unit tests, whose `ipvs::` ones program IPVS and kube-ipvs0 (for --backend ipvs).
proxy_unit=""
if [ -z "$exec" ] && [[ " ${backends[*]} " == *" ipvs "* ]]; then
    proxy_unit=$(cd "$repo" && cargo test -p roadkeeper-proxy --lib --no-run --message-format=json |
        jq -r 'select(.reason == "compiler-artifact" and .profile.test and .executable) | .executable') ||
        die "cargo test -p roadkeeper-proxy --no-run failed (above)"
    [ -n "$proxy_unit" ] || die "cargo built no roadkeeper-proxy test binary"
fi
# The loader's kernel tests, which load every BPF program (for --backend ebpf).
ebpf_kernel=""
if [ -z "$exec" ] && [[ " ${backends[*]} " == *" ebpf "* ]]; then
    ebpf_kernel=$(cd "$repo" && cargo test -p roadkeeper-proxy --features ebpf-kernel --test ebpf_kernel --no-run \
        --message-format=json | jq -r 'select(.reason == "compiler-artifact" and .profile.test and .executable) | .executable') ||
        die "cargo test -p roadkeeper-proxy --test ebpf_kernel --no-run failed (above)"
    [ -n "$ebpf_kernel" ] || die "cargo built no ebpf_kernel test binary"
fi

run=$(mktemp -d "${TMPDIR:-/tmp}/roadkeeper-vm.XXXXXX")
qemu_pid=""
cleanup() {
    if [ -n "$qemu_pid" ] && kill -0 "$qemu_pid" 2>/dev/null; then
        kill "$qemu_pid" 2>/dev/null || true
        wait "$qemu_pid" 2>/dev/null || true
    fi
    rm -rf "$run"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir -p "$run/share" "$run/snap" "$run/initramfs"/{bin,lower,rw,newroot,proc,sys,dev,mods}
# A snapshot of the binaries, bound over their paths in the VM: a build of the same checkout
# while the VM runs (cargo rewrites target/debug/roadkeeper) does not change what is tested.
for file in "${binaries[@]}" "${programs[@]}" ${proxy_unit:+"$proxy_unit"} ${ebpf_kernel:+"$ebpf_kernel"}; do
    mkdir -p "$run/snap$(dirname "$file")" && cp "$file" "$run/snap$file"
done

# The test selection: for each backend, the names each binary lists under `<backend>::` (and,
# with nftables, those under no backend module but proxy_ebpf.rs's, which are eBPF mode's),
# narrowed by the user's filters.
selected() {
    local binary=$1 backend=$2 own=nftables
    [[ $(basename "$binary") != proxy_ebpf-* ]] || own=ebpf
    "$binary" --list --format terse 2>/dev/null | sed -n 's/: test$//p' | while read -r name; do
        case $name in
            "$backend"::*) ;;
            nftables::* | iptables::* | ipvs::* | ebpf::*) continue ;;
            *) [ "$backend" = "$own" ] || continue ;;
        esac
        if [ ${#filters[@]} -gt 0 ]; then
            local hit=""
            for f in "${filters[@]}"; do [[ $name == *"$f"* ]] && hit=1; done
            [ -n "$hit" ] || continue
        fi
        echo "$name"
    done
}

# The script the VM runs as PID 1 in the host's userland (after switch_root).
{
    echo '#!/bin/sh'
    printf 'modules=%q repo=%q threads=%q out=%q\n' "$modules" "$repo" "${RUST_TEST_THREADS:-}" "$out"
    # Emulation is several times slower than hardware: the tests' wait for a first sync follows.
    printf 'export ROADKEEPER_TEST_SLOWDOWN=%q\n' "$([ "$accel" = tcg ] && echo 3 || echo 1)"
    cat <<'EOF'
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root RUST_BACKTRACE=1
mount -t proc proc /proc && mount -t sysfs sysfs /sys
mkdir -p /dev/pts /dev/shm && mount -t devpts devpts /dev/pts && mount -t tmpfs tmpfs /dev/shm
# What udev or systemd would make: bash's process substitution opens /dev/fd/N.
[ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
# /tmp stays the overlay's (writable, in memory): the repository or the cache may live under it.
mount -t tmpfs tmpfs /run
mkdir -p /run/netns /lib/modules && mount --bind "$(dirname "$modules")" /lib/modules
ip link set lo up
mkdir -p /run/snap && mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288,ro,cache=loose vmsnap /run/snap
(cd /run/snap && find . -type f) | while read -r file; do mount --bind "/run/snap/${file#./}" "/${file#./}"; done
[ -z "$out" ] || mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288,cache=none vmout "$out"
echo "vm: userland up at $(cut -d' ' -f1 /proc/uptime) s, kernel $(uname -r)"
# What a Kubernetes node loads before its proxy starts (kubeadm's prerequisites: br_netfilter, so
# that replies bridged between pods pass the node's conntrack); the kernel loads the rest itself.
modprobe -a crc32c_generic br_netfilter veth dummy || echo "vm: modprobe failed"
cd "$repo/crates/roadkeeper" && export CARGO_MANIFEST_DIR="$PWD"
status=0
. /.vm/tests.sh
echo "vm: done at $(cut -d' ' -f1 /proc/uptime) s"
echo "$status" > /.vm/status
sync
echo o > /proc/sysrq-trigger; sleep 60
EOF
} > "$run/share/stage2.sh"

# Whether the VM's kernel is one eBPF mode runs on (5.18+): on older ones, its refusal is checked.
ebpf_kernel_ok() {
    local major minor
    IFS=. read -r major minor _ <<<"$release"
    minor=${minor%%[!0-9]*}
    [ "$major" -gt 5 ] || { [ "$major" -eq 5 ] && [ "$minor" -ge 18 ]; }
}

# What runs: the fresh-kernel check (first: before anything loads nf_conntrack), the IPVS smoke
# check, then each binary with its selection.
{
    echo '# one line per step; "status" collects the first failure'
    echo 'step() { "$@" || { rc=$?; [ "$status" -ne 0 ] || status=$rc; echo "vm: FAILED ($rc): $*"; }; }'
    echo 'threads_args() { [ -n "$threads" ] && echo "--test-threads=$threads"; }'
    ipvs_cases=0
    [ -z "$exec" ] || { printf 'step sh -c %q\n' "$exec"; backends=(); }
    [ -n "$exec" ] || cat <<'EOF'
fresh_kernel() {
    # A node whose kernel has tracked no connection yet (no nf_conntrack, so no conntrack
    # sysctls): `proxy --init-only` still writes kube-proxy's conntrack settings.
    echo "vm: fresh-kernel check"
    if lsmod | grep -q '^nf_conntrack '; then echo "vm: nf_conntrack is loaded already"; return 1; fi
    mkdir -p /tmp/fresh-manifests
    "$repo/target/debug/roadkeeper" proxy --init-only --manifests /tmp/fresh-manifests --hostname-override vm ||
        return 1
    want=$(($(nproc) * 32768)); [ "$want" -ge 131072 ] || want=131072
    got=$(cat /proc/sys/net/netfilter/nf_conntrack_max) || return 1
    [ "$got" = "$want" ] || { echo "vm: nf_conntrack_max is $got, not $want"; return 1; }
    # The suites expect a limit kube-proxy would change (their node namespaces may not): put
    # back one that is not kube-proxy's, as a fresh node's would be.
    echo $((want / 2)) > /proc/sys/net/netfilter/nf_conntrack_max
    echo "vm: fresh-kernel check passed"
}
step fresh_kernel
# A backend's first sync on a fresh kernel makes the kernel load each netfilter module the rules
# use (nf_tables replays the batch after each one), which takes tens of seconds under emulation:
# run once here, in a throwaway namespace, so that it is measured and not paid inside a test's
# wait for its proxy.
sync_once() {
    ns=rk-vm-first-$1 dir=/tmp/first-sync-$1
    mkdir -p "$dir" && cat > "$dir/web.yaml" <<'YAML'
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: NodePort
  clusterIPs: [10.96.0.9, "fd00:96::9"]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
  sessionAffinity: ClientIP
  externalTrafficPolicy: Local
  ports:
  - {name: http, port: 80, targetPort: 8080, protocol: TCP, nodePort: 30009}
  - {name: dns, port: 53, targetPort: 5353, protocol: UDP, nodePort: 30009}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v4, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: [{addresses: [10.244.0.9], conditions: {ready: true}, nodeName: vm}]
ports: [{name: http, port: 8080, protocol: TCP}, {name: dns, port: 5353, protocol: UDP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v6, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
endpoints: [{addresses: ["fd00:244::9"], conditions: {ready: true}, nodeName: vm}]
ports: [{name: http, port: 8080, protocol: TCP}, {name: dns, port: 5353, protocol: UDP}]
YAML
    ip netns add "$ns" || return 1
    rc=0
    { ip -n "$ns" link add eth0 type dummy && ip -n "$ns" link set eth0 up &&
        ip -n "$ns" addr add 192.168.99.2/24 dev eth0 && ip -n "$ns" addr add fd00:99::2/64 dev eth0 nodad &&
        ip netns exec "$ns" "$repo/target/debug/roadkeeper" proxy --once --proxy-mode "$@" --manifests "$dir" \
            --hostname-override vm --cluster-cidr 10.244.0.0/16,fd00:244::/48 > "$dir/log" 2>&1; } || rc=$?
    ip netns del "$ns"
    return "$rc"
}
first_sync() {
    started=$(cut -d' ' -f1 /proc/uptime)
    sync_once "$1" || { rc=$?; cat "/tmp/first-sync-$1/log"; return "$rc"; }
    echo "vm: $1: the first sync on this kernel took $(echo "$started $(cut -d' ' -f1 /proc/uptime)" | awk '{printf "%.1f", $2 - $1}') s"
}
# On a kernel older than eBPF mode's, `proxy --proxy-mode ebpf` fails saying so and naming the
# modes that work.
ebpf_refused() {
    mkdir -p /tmp/ebpf-refused/bpf /tmp/ebpf-refused/cgroup && mount -t bpf bpf /tmp/ebpf-refused/bpf &&
        mount -t cgroup2 cgroup2 /tmp/ebpf-refused/cgroup || return 1
    if sync_once ebpf --bpf-root /tmp/ebpf-refused/bpf --cgroup-root /tmp/ebpf-refused/cgroup; then echo "vm: eBPF mode started on $(uname -r)"; return 1; fi
    cat /tmp/first-sync-ebpf/log
    grep -q "older than the 5.18 eBPF mode needs; nftables, iptables and ipvs modes run on it" /tmp/first-sync-ebpf/log ||
        { echo "vm: the refusal does not name the kernel's version and the modes that work"; return 1; }
    echo "vm: ebpf: refused on $(uname -r), as it should be"
}
EOF
    for b in "${backends[@]}"; do
        if [ "$b" = ipvs ]; then
            cat <<'EOF'
ipvs_smoke() {
    echo "vm: IPVS smoke check"
    modprobe -a ip_vs ip_vs_rr ip_vs_wrr ip_vs_sh || return 1
    ipvsadm -A -t 10.96.0.10:80 -s rr && ipvsadm -a -t 10.96.0.10:80 -r 10.244.0.2:8080 -m &&
        ipvsadm -Ln | tee /tmp/ipvs.txt && grep -q '10.244.0.2:8080' /tmp/ipvs.txt && ipvsadm -C &&
        echo "vm: IPVS smoke check passed"
}
step ipvs_smoke
EOF
            printf 'echo "vm: ipvs: the IPVS kernel tests of %s"\n' "$(basename "$proxy_unit")"
            printf 'step %q --color never $(threads_args) --include-ignored ipvs::\n' "$proxy_unit"
        fi
        if [ "$b" = ebpf ] && ! ebpf_kernel_ok; then
            echo 'step ebpf_refused'
            printf 'echo "vm: ebpf: Linux %s is older than eBPF mode'"'"'s 5.18: its cases do not run"\n' "$release"
            continue
        elif [ "$b" = ebpf ]; then
            printf 'echo "vm: ebpf: the BPF programs through this kernel'"'"'s verifier (%s)"\n' "$(basename "$ebpf_kernel")"
            printf 'step %q --color never $(threads_args)\n' "$ebpf_kernel"
        fi
        [ "$b" = ipvs ] || [ "$b" = ebpf ] || printf 'step first_sync %q\n' "$b"
        for binary in "${binaries[@]}"; do
            mapfile -t names < <(selected "$binary" "$b")
            [ ${#names[@]} -gt 0 ] || continue
            [ "$b" != ipvs ] || ipvs_cases=$((ipvs_cases + ${#names[@]}))
            printf 'echo "vm: %s: %s (%d tests)"\n' "$b" "$(basename "$binary")" ${#names[@]}
            # The ipvs:: cases are ignored on hosts without IPVS; this kernel has it.
            printf 'step %q --exact --color never $(threads_args)%s' "$binary" "$([ "$b" != ipvs ] || echo ' --include-ignored')"
            printf ' %q' "${names[@]}"
            echo
        done
        if [ "$b" = ipvs ] && [ "$ipvs_cases" = 0 ]; then
            echo 'echo "vm: no ipvs:: cases yet: the IPVS smoke check is all that ran for ipvs"'
        fi
    done
} > "$run/share/tests.sh.tmp"
mv "$run/share/tests.sh.tmp" "$run/share/tests.sh"
grep -q '^step ' "$run/share/tests.sh" || die "no test matches the backend and filters"

# The initramfs: busybox, the modules that reach the 9p root, and /init.
cp "$busybox" "$run/initramfs/bin/busybox"
: > "$run/initramfs/mods/order"
for m in virtio_pci 9pnet_virtio 9p overlay; do
    modprobe -d "$moduleroot" -S "$release" --show-depends "$m" |
        sed -n 's/^insmod \([^ ]*\).*/\1/p' | while read -r ko; do
            name=$(basename "$ko")
            grep -qx "$name" "$run/initramfs/mods/order" && continue
            case $ko in
                *.ko) cp "$ko" "$run/initramfs/mods/" ;;
                *.ko.xz) xz -dc "$ko" > "$run/initramfs/mods/${name%.xz}"; name=${name%.xz} ;;
                *.ko.zst) zstd -qdc "$ko" > "$run/initramfs/mods/${name%.zst}"; name=${name%.zst} ;;
                *) die "unknown module format $ko" ;;
            esac
            echo "$name" >> "$run/initramfs/mods/order"
        done
done
cat > "$run/initramfs/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc && mount -t sysfs sysfs /sys && mount -t devtmpfs devtmpfs /dev
fail() { echo "vm: init: $*"; echo o > /proc/sysrq-trigger; sleep 60; }
for m in $(cat /mods/order); do insmod "/mods/$m" || fail "insmod $m"; done
opts=trans=virtio,version=9p2000.L,msize=524288
mount -t 9p -o "$opts,ro,cache=loose" hostroot /lower || fail "cannot mount the host root"
mount -t tmpfs -o mode=0755 tmpfs /rw && mkdir /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work /newroot ||
    fail "cannot mount the overlay"
mkdir -p /newroot/.vm && mount -t 9p -o "$opts,cache=none" vmshare /newroot/.vm || fail "cannot mount the share"
umount /proc /sys
mount --move /dev /newroot/dev
exec switch_root /newroot /bin/sh /.vm/stage2.sh
EOF
chmod +x "$run/initramfs/init"
(cd "$run/initramfs" && find . | "$busybox" cpio -o -H newc 2>/dev/null) > "$run/initramfs.cpio"

# Control-plane binaries of the API-server cases are built (or found) here, not in the VM.
if grep -q 'proxy_kube' "$run/share/tests.sh"; then
    "$repo/tests/k8s/build.sh" > /dev/null || die "tests/k8s/build.sh failed"
fi

echo "vm: kernel $release ($kernel), accel $accel, $cpus CPUs, $memory, backends ${backends[*]}" >&2
start=$(date +%s%N)
: > "$run/console.log"
timeout -k 5 "$timeout" qemu-system-x86_64 -nodefaults -no-reboot -display none \
    "${accel_args[@]}" -smp "$cpus" -m "$memory" \
    -kernel "$kernel" -initrd "$run/initramfs.cpio" \
    -append "console=ttyS0 panic=-1 quiet loglevel=3" \
    -serial "file:$run/console.log" \
    -device virtio-rng-pci \
    -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
    -virtfs "local,path=$run/share,mount_tag=vmshare,security_model=none" \
    -virtfs "local,path=$run/snap,mount_tag=vmsnap,security_model=none,readonly=on" \
    "${out_args[@]}" &
qemu_pid=$!
# The stage-2 script writes its output to the console; stream it here as it comes.
tail -n +1 -f --pid="$qemu_pid" "$run/console.log" 2>/dev/null &
tail_pid=$!
rc=0
wait "$qemu_pid" || rc=$?
qemu_pid=""
sleep 0.2
kill "$tail_pid" 2>/dev/null || true
wait "$tail_pid" 2>/dev/null || true
elapsed=$((($(date +%s%N) - start) / 1000000000))

if [ "$rc" = 124 ]; then
    echo "vm: timed out after ${timeout}s" >&2
    exit 124
fi
[ -s "$run/share/status" ] || { echo "vm: the VM ended without a status (qemu exit $rc); console above" >&2; exit 1; }
status=$(cat "$run/share/status")
failed=$(grep -E '^test .* \.\.\. FAILED|^vm: FAILED' "$run/console.log" | tr -d '\r' | cut -c1-200 || true)
[ -z "$failed" ] || printf 'vm: failures:\n%s\n' "$failed" >&2
echo "vm: kernel $release, accel $accel: ${elapsed}s in all, tests exit status $status" >&2
exit "$status"
