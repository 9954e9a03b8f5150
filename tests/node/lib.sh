# shellcheck shell=bash disable=SC2034 # sourced: the names below are used by the scripts
# Shared by the scripts of tests/node: where the nodes live and how to reach them. Sourced, not run.
#
# One node per machine at a time (up.sh takes a lock). Everything it makes carries its name:
#   network namespaces  rkn-node (the first node: control plane, kubelet, containerd,
#                       host-network pods), rkn-node-2... (more nodes, with --nodes) and rkn-out
#                       (a host outside the nodes, for requests from outside); pods get their
#                       own namespaces from CNI, under containerd's state folder
#   state               $ROADKEEPER_NODE_DIR (default /var/tmp/roadkeeper-node)
#   cgroups             /roadkeeper-node in every hierarchy: the daemons in
#                       /roadkeeper-node/daemons, each node's pods under /roadkeeper-node/<node>
#   processes           environment variable ROADKEEPER_NODE_DAEMON=1 (the daemons and the
#                       containerd shims; the containers are found by their cgroup)

NODE_DIR=${ROADKEEPER_NODE_DIR:-/var/tmp/roadkeeper-node}
# The file that marks NODE_DIR as made by up.sh: down.sh removes no folder without it.
NODE_DIR_MARK=.roadkeeper-node
NODE_NETNS=rkn-node
OUT_NETNS=rkn-out
CGROUP_ROOT=roadkeeper-node
NODE_NAME=roadkeeper-node
NODE_IP=192.168.234.10
OUT_IP=192.168.234.1
CLUSTER_CIDR=10.244.0.0/16
SERVICE_CIDR=10.96.0.0/12
KUBERNETES_SERVICE_IP=10.96.0.1
CLUSTER_DNS=10.96.0.10
CLUSTER_DOMAIN=cluster.local
APISERVER_PORT=6443
# The addresses roadkeeper's Gateway API implementation gives Gateways (deploy/gateway.yaml),
# local on the node; gateway-conformance.sh routes them to the node in rkn-out.
GATEWAY_POOL=192.168.235.0/24
DAEMON_MARK=ROADKEEPER_NODE_DAEMON

# How many times slower than this machine the node's machine is (an emulated VM: tests/vm sets
# ROADKEEPER_TEST_SLOWDOWN): the scripts' waits for daemons and rollouts grow by this factor.
NODE_SLOWDOWN=${ROADKEEPER_TEST_SLOWDOWN:-1}

node_log() { echo "node: $*" >&2; }
node_fail() { echo "node: error: $*" >&2; exit 1; }

# Node I (1 is the first, which also runs the control plane): its name, network namespace,
# address and state folder.
node_name() { if (($1 == 1)); then echo "$NODE_NAME"; else echo "$NODE_NAME-$1"; fi; }
node_netns() { if (($1 == 1)); then echo "$NODE_NETNS"; else echo "$NODE_NETNS-$1"; fi; }
node_ip() { echo "192.168.234.$((9 + $1))"; }
node_dir() { echo "$NODE_DIR/nodes/$(node_name "$1")"; }
# How many nodes up.sh brought up.
node_count() { cat "$NODE_DIR/node-count"; }

# Runs a command in a network namespace, in the machine's mount namespace (so the kubelet's
# volume mounts are the ones containerd's containers see).
in_netns() {
    local netns=$1
    shift
    nsenter --net="/run/netns/$netns" -- "$@"
}
in_node() { in_netns "$NODE_NETNS" "$@"; }
in_out() { in_netns "$OUT_NETNS" "$@"; }

# The cgroup hierarchies mounted on this machine (v1: one folder per controller set; v2: one).
cgroup_hierarchies() {
    local dir
    for dir in /sys/fs/cgroup/*/; do
        [[ -e "$dir/cgroup.procs" ]] && echo "${dir%/}"
    done
    if [[ -e /sys/fs/cgroup/cgroup.procs ]]; then echo /sys/fs/cgroup; fi
}

# The cgroup v2 hierarchy: /sys/fs/cgroup on a v2 host, /sys/fs/cgroup/unified on a hybrid one
# (none on a v1-only host). Each node's pods are in its /roadkeeper-node/<node> there too (runc
# joins it in hybrid mode), where eBPF mode's socket programs attach.
cgroup_v2() {
    if [[ -e /sys/fs/cgroup/cgroup.controllers ]]; then
        echo /sys/fs/cgroup
    elif [[ -e /sys/fs/cgroup/unified/cgroup.controllers ]]; then
        echo /sys/fs/cgroup/unified
    fi
}

# Runs a command as a host process of the first node: in its network namespace and, where the
# machine has a cgroup v2 hierarchy, in the node's cgroup there (the other hierarchies are left
# as they are), as a process of a real node is below the root its proxy attaches to in eBPF mode.
on_node() {
    local v2
    v2=$(cgroup_v2)
    if [[ -n $v2 ]]; then
        in_node sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$v2/$CGROUP_ROOT/$NODE_NAME" "$@"
    else
        in_node "$@"
    fi
}

# Built images, as docker archives (tests/node/images.sh), imported into containerd by up.sh.
IMAGES_CACHE=${ROADKEEPER_NODE_IMAGES:-$HOME/.cache/roadkeeper/node-images}

# node_images [SET]: the archives of `images.sh SET` (building what is missing), one a line; or,
# where ROADKEEPER_NODE_PREBUILT names a folder, its file SET (default `node`), which lists what
# images.sh printed beforehand on a machine that could build (tests/vm/node-e2e.sh: its VM has
# neither Go nor a package mirror).
node_images() {
    if [[ -n ${ROADKEEPER_NODE_PREBUILT:-} ]]; then
        cat "$ROADKEEPER_NODE_PREBUILT/${1:-node}"
    else
        "$(dirname "${BASH_SOURCE[0]}")/images.sh" "$@"
    fi
}

# node_ctr I ARGS...: ctr against node I's containerd, in the namespace the kubelet uses.
node_ctr() {
    local socket
    socket="$(node_dir "$1")/containerd/containerd.sock"
    shift
    ctr --address "$socket" --namespace k8s.io "$@"
}
