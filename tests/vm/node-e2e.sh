#!/usr/bin/env bash
# Runs upstream's end-to-end tests of Service networking (tests/node/e2e.sh) on another kernel:
# the whole cluster of tests/node (etcd, the API server, the kubelets, containerd, roadkeeper as
# the proxy and the DNS) runs in a qemu VM booted by tests/vm/run.sh, so that the node's kernel
# is the VM's. For IPVS mode, which this machine's kernel lacks.
#
#   tests/vm/node-e2e.sh [--kernel K] [--cpus N] [--memory SIZE] [--timeout SECONDS]
#                        [--report-dir DIR] [-- E2E-ARGS...]
#
# E2E-ARGS go to tests/node/e2e.sh (default: --proxy-mode ipvs --nodes 1 and its default
# focus); --kernel, --cpus, --memory (default 10G: the nodes' images live in the VM's memory)
# and --timeout (default 14400) to tests/vm/run.sh. The JUnit report and the suite's log land in
# --report-dir (default ./e2e-report-vm) on this machine.
#
# Here, first: the Kubernetes binaries (tests/k8s/build.sh e2e), a release build of roadkeeper
# (snapshotted, so a later build changes nothing) and every image (the VM has neither Go nor a
# package mirror: tests/node reads the lists of archives, ROADKEEPER_NODE_PREBUILT). In the VM: cgroup v1 hierarchies (as this machine has them, and as the pinned kubelet
# runs on), a tmpfs for the node's state (containerd's overlayfs snapshots cannot live on the
# VM's overlay root), then tests/node/e2e.sh. Under TCG the waits of tests/node scale with
# ROADKEEPER_TEST_SLOWDOWN, which tests/vm/run.sh sets.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

# In the VM (tests/vm/run.sh --exec runs this again with --in-vm): set the node's machine up.
if [[ ${1:-} == --in-vm ]]; then
    shift
    prebuilt=${1:?}
    report=${2:?}
    shift 2
    umount /sys/fs/cgroup 2>/dev/null || true
    mount -t tmpfs -o mode=0755 cgroup /sys/fs/cgroup
    for controllers in cpu,cpuacct cpuset memory devices freezer blkio pids; do
        mkdir -p "/sys/fs/cgroup/$controllers"
        mount -t cgroup -o "$controllers" cgroup "/sys/fs/cgroup/$controllers"
    done
    mkdir -p /sys/fs/cgroup/systemd /sys/fs/cgroup/unified
    mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd
    mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified
    mkdir -p /var/tmp/roadkeeper-node /run/lock
    mount -t tmpfs tmpfs /var/tmp/roadkeeper-node
    echo "vm: $(nproc) CPUs, $(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo) MiB; tests/node/e2e.sh $*"
    ROADKEEPER_NODE_DIR=/var/tmp/roadkeeper-node/node ROADKEEPER_NODE_PREBUILT=$prebuilt \
        exec "$repo/tests/node/e2e.sh" --report-dir "$report" "$@"
fi

vm_args=(--memory 10G --timeout 14400)
report=$PWD/e2e-report-vm
while (($#)); do
    case $1 in
        --kernel | --cpus | --memory | --timeout) vm_args+=("$1" "${2:?$1 needs a value}"); shift 2 ;;
        --report-dir) report=${2:?--report-dir needs a folder}; shift 2 ;;
        -h | --help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        --) shift; break ;;
        *) echo "node-e2e: unknown argument $1 (see --help)" >&2; exit 1 ;;
    esac
done
e2e_args=("$@")
((${#e2e_args[@]})) || e2e_args=(--proxy-mode ipvs --nodes 1)

mkdir -p "$report"
report=$(cd "$report" && pwd)
snapshot=$(mktemp -d "${TMPDIR:-/tmp}/roadkeeper-node-e2e.XXXXXX")
trap 'rm -rf "$snapshot"' EXIT
"$repo/tests/k8s/build.sh" e2e >/dev/null
echo "node-e2e: cargo build --release -p roadkeeper" >&2
(cd "$repo" && cargo build --release --locked -p roadkeeper >&2)
cp "$repo/target/release/roadkeeper" "$snapshot/roadkeeper"
ROADKEEPER_BINARY=$snapshot/roadkeeper "$repo/tests/node/images.sh" >"$snapshot/node"
"$repo/tests/node/images.sh" e2e >"$snapshot/e2e"
"$repo/tests/node/images.sh" coredns >"$snapshot/coredns"

printf -v command '%q ' "$here/node-e2e.sh" --in-vm "$snapshot" "$report" "${e2e_args[@]}"
"$here/run.sh" "${vm_args[@]}" --out "$report" --exec "$command"
