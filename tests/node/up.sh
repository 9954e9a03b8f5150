#!/usr/bin/env bash
# Brings up a real Kubernetes cluster of one or more nodes on this machine, inside network
# namespaces of its own, with roadkeeper deployed from deploy/ as its node proxy (in place of
# kube-proxy), its cluster DNS (in place of CoreDNS) and its Ingress controller. The last line on stdout is the path of the
# admin kubeconfig; a kubectl binary sits in the same folder. tests/node/down.sh undoes it all.
#
#   tests/node/up.sh [--proxy-mode nftables|iptables|ipvs|ebpf] [--nodes N] [--dns roadkeeper|coredns] [--no-deploy]
#
# --nodes N (default 1, at most 9) adds worker nodes roadkeeper-node-2... (a kubelet and a
# containerd each, in network namespaces rkn-node-2...) beside the first, which also runs the
# control plane. The nodes are spread over three zones in turn (label topology.kubernetes.io/zone:
# zone-1, zone-2, zone-3, zone-1, ...): with 3 nodes one zone each, with 6 two nodes per zone, as
# upstream's tests of topology hints and traffic distribution need.
# --dns coredns: the cluster DNS is CoreDNS as kubeadm installs it (tests/node/coredns.yaml), not
# deploy/dns.yaml: where docs/replacing-coredns.md starts.
# --no-deploy stops after the node is Ready (no roadkeeper): the node then has no Service proxy
# and no DNS. Needs root, and the Debian packages containerd, runc, containernetworking-plugins,
# debootstrap, buildah, iptables, iproute2, openssl, curl, socat (see tests/node/packages). Builds
# (cached): the Kubernetes binaries (tests/k8s/build.sh), the images (tests/node/images.sh).
# Environment: ROADKEEPER_NODE_DIR (state folder, default /var/tmp/roadkeeper-node).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=tests/node/lib.sh
source "$here/lib.sh"

proxy_mode=nftables
dns=roadkeeper
deploy=1
nodes=1
while (($#)); do
    case $1 in
        --proxy-mode) proxy_mode=${2:?--proxy-mode needs nftables, iptables, ipvs or ebpf}; shift 2 ;;
        --proxy-mode=*) proxy_mode=${1#*=}; shift ;;
        --nodes) nodes=${2:?--nodes needs a number}; shift 2 ;;
        --nodes=*) nodes=${1#*=}; shift ;;
        --no-deploy) deploy=0; shift ;;
        --dns) dns=${2:?--dns needs roadkeeper or coredns}; shift 2 ;;
        --dns=*) dns=${1#*=}; shift ;;
        -h | --help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) node_fail "unknown argument $1 (see --help)" ;;
    esac
done
case $proxy_mode in nftables | iptables | ipvs | ebpf) ;; *) node_fail "--proxy-mode $proxy_mode: not nftables, iptables, ipvs or ebpf" ;; esac
case $dns in roadkeeper | coredns) ;; *) node_fail "--dns $dns: not roadkeeper or coredns" ;; esac
[[ $nodes =~ ^[1-9]$ ]] || node_fail "--nodes $nodes: not a number from 1 to 9"
((EUID == 0)) || node_fail "needs root (network namespaces, cgroups, containerd)"
for tool in containerd runc ctr buildah debootstrap openssl nsenter ip iptables curl socat; do
    command -v "$tool" >/dev/null || node_fail "$tool not found: install the packages in tests/node/packages"
done
[[ -x /usr/lib/cni/bridge ]] || node_fail "/usr/lib/cni/bridge not found: install containernetworking-plugins"
if ip netns list | grep -qw "$OUT_NETNS"; then
    node_fail "a node is already up (network namespace $OUT_NETNS); tests/node/down.sh first"
fi
# Held by up.sh and inherited by the daemons it starts: released when they are all gone.
exec 8>/run/lock/roadkeeper-node.lock
flock -n 8 || node_fail "another tests/node/up.sh is running, or the daemons of a node it started"

if [[ -n $(ss -ltnH "sport = :$APISERVER_PORT") ]]; then
    node_fail "port $APISERVER_PORT is taken on this machine: the node's API server is forwarded there"
fi

# Builds first: nothing of the node exists while they run.
bin=$("$repo/tests/k8s/build.sh" node)
archives=$(node_images)
if [[ $dns == coredns ]]; then archives+=$'\n'$(node_images coredns); fi

# What a failed up.sh kept (its logs) goes now; a folder up.sh did not make is never removed.
if [[ -e $NODE_DIR ]]; then
    [[ -e $NODE_DIR/$NODE_DIR_MARK ]] || node_fail "$NODE_DIR exists and is not a node's folder: set ROADKEEPER_NODE_DIR"
    rm -rf "$NODE_DIR"
fi
mkdir -p "$NODE_DIR"
touch "$NODE_DIR/$NODE_DIR_MARK"
NODE_DIR=$(cd "$NODE_DIR" && pwd)
# From here on, a failure leaves a half-built node: take it down again.
trap 'status=$?; if ((status)); then node_log "failed; logs in $NODE_DIR/logs"; "$here/down.sh" --keep-logs >&2 || true; fi' EXIT
mkdir -p "$NODE_DIR"/{logs,pki,etc,bin}
echo "$nodes" >"$NODE_DIR/node-count"
cp "$bin/kubectl" "$NODE_DIR/bin/kubectl"

# --- network ----------------------------------------------------------------------------------
# rkn-out holds a bridge every node's eth0 is plugged into, and routes the pod and Service ranges
# to the nodes, as a router in front of a cluster would; pods hang off a bridge in their node
# (CNI), and each node routes the other nodes' pod ranges to them.
node_log "network namespaces $OUT_NETNS and $(for i in $(seq "$nodes"); do printf '%s ' "$(node_netns "$i")"; done)"
ip netns add "$OUT_NETNS"
in_out ip link set lo up
in_out ip link add br0 type bridge
in_out ip addr add "$OUT_IP/24" dev br0
in_out ip link set br0 up
in_out ip route add "$SERVICE_CIDR" via "$NODE_IP"
for i in $(seq "$nodes"); do
    netns=$(node_netns "$i")
    ip netns add "$netns"
    ip link add "rkn-eth$i" netns "$OUT_NETNS" type veth peer name eth0 netns "$netns"
    in_out ip link set "rkn-eth$i" master br0 up
    in_netns "$netns" ip link set lo up
    in_netns "$netns" ip addr add "$(node_ip "$i")/24" dev eth0
    in_netns "$netns" ip link set eth0 up
    in_netns "$netns" ip route add default via "$OUT_IP"
    in_netns "$netns" sysctl -qw net.ipv4.ip_forward=1
done
# Bridged pod traffic must pass netfilter (Service rules for pod-to-pod through a ClusterIP).
modprobe br_netfilter 2>/dev/null || true
for i in $(seq "$nodes"); do
    in_netns "$(node_netns "$i")" sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true
done

# --- cgroups ----------------------------------------------------------------------------------
# The daemons run in /roadkeeper-node/daemons (with the containerd shims they start); each
# node's kubelet puts its pods under /roadkeeper-node/<node>. down.sh kills whatever is left in
# the subtree.
while read -r hierarchy; do
    mkdir -p "$hierarchy/$CGROUP_ROOT/daemons"
    for i in $(seq "$nodes"); do mkdir -p "$hierarchy/$CGROUP_ROOT/$(node_name "$i")"; done
    # cpuset: a new cgroup starts with no CPUs or memory nodes; inherit them.
    for file in cpuset.cpus cpuset.mems; do
        if [[ -e "$hierarchy/$file" ]]; then
            cat "$hierarchy/$file" >"$hierarchy/$CGROUP_ROOT/$file"
            cat "$hierarchy/$file" >"$hierarchy/$CGROUP_ROOT/daemons/$file"
            for i in $(seq "$nodes"); do cat "$hierarchy/$file" >"$hierarchy/$CGROUP_ROOT/$(node_name "$i")/$file"; done
        fi
    done
done < <(cgroup_hierarchies)

# Starts daemon $1 (the rest is its command) in the first node's network namespace (or that
# NETNS names; none: the machine's), in the daemons cgroup, marked, logging to logs/$1.log; its
# pid goes to logs/$1.pid. With UTS=NAME, in a UTS namespace of its own whose hostname is NAME
# (what a node's host-network pods see as their hostname, as on a machine of that name).
start_daemon() {
    local name=$1
    shift
    local netns=${NETNS-$NODE_NETNS}
    local enter=(nsenter --net="/run/netns/$netns" --)
    [[ -z $netns ]] && enter=()
    if [[ -n ${UTS:-} ]]; then
        # shellcheck disable=SC2016 # $0 and $@ belong to the inner shell
        enter+=(unshare --uts -- sh -c 'hostname "$0" && exec "$@"' "$UTS")
    fi
    (
        while read -r hierarchy; do echo "$BASHPID" >"$hierarchy/$CGROUP_ROOT/daemons/cgroup.procs"; done < <(cgroup_hierarchies)
        export "$DAEMON_MARK=1"
        exec "${enter[@]}" "$@"
    ) </dev/null >>"$NODE_DIR/logs/$name.log" 2>&1 &
    echo $! >"$NODE_DIR/logs/$name.pid"
}

# Waits up to $1 seconds (times NODE_SLOWDOWN) for the command in the rest to succeed; fails
# naming $what.
wait_for() {
    local seconds=$(($1 * NODE_SLOWDOWN)) what=$2
    shift 2
    local deadline=$((SECONDS + seconds))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || node_fail "no $what after ${seconds}s (logs in $NODE_DIR/logs)"
        sleep 0.5
    done
}

# --- credentials ------------------------------------------------------------------------------
"$here/pki.sh" "$NODE_DIR/pki" "$nodes" >&2

# kubeconfig NAME TOKEN [SERVER]: a kubeconfig for the API server (default: at 127.0.0.1, which
# is the API server in the first node and its forwarder on the machine).
kubeconfig() {
    cat >"$NODE_DIR/etc/$1.kubeconfig" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
  - name: roadkeeper-node
    cluster:
      server: ${3:-https://127.0.0.1:$APISERVER_PORT}
      certificate-authority: $NODE_DIR/pki/ca.crt
users:
  - name: $1
    user:
      token: $2
contexts:
  - name: roadkeeper-node
    context: {cluster: roadkeeper-node, user: $1}
current-context: roadkeeper-node
KUBECONFIG
}
# The kubelets reach the API server at the first node's address, from any node.
while IFS=, read -r token _ uid _; do
    case $uid in kubelet-*) kubeconfig "$uid" "$token" "https://$NODE_IP:$APISERVER_PORT" ;; *) kubeconfig "$uid" "$token" ;; esac
done <"$NODE_DIR/pki/tokens.csv"
admin="$NODE_DIR/bin/admin.kubeconfig"
mv "$NODE_DIR/etc/admin.kubeconfig" "$admin"
kubectl() { "$NODE_DIR/bin/kubectl" --kubeconfig "$admin" "$@"; }

# --- control plane ----------------------------------------------------------------------------
node_log "etcd, kube-apiserver, kube-controller-manager, kube-scheduler"
start_daemon etcd "$bin/etcd" --name=node --data-dir="$NODE_DIR/etcd" \
    --listen-client-urls=http://127.0.0.1:2379 --advertise-client-urls=http://127.0.0.1:2379 \
    --listen-peer-urls=http://127.0.0.1:2380 --initial-advertise-peer-urls=http://127.0.0.1:2380 \
    --initial-cluster=node=http://127.0.0.1:2380 --log-level=warn --unsafe-no-fsync
start_daemon kube-apiserver "$bin/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
    --bind-address=0.0.0.0 --advertise-address="$NODE_IP" --secure-port="$APISERVER_PORT" \
    --service-cluster-ip-range="$SERVICE_CIDR" --service-node-port-range=30000-32767 \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --token-auth-file="$NODE_DIR/pki/tokens.csv" --client-ca-file="$NODE_DIR/pki/ca.crt" \
    --tls-cert-file="$NODE_DIR/pki/apiserver.crt" --tls-private-key-file="$NODE_DIR/pki/apiserver.key" \
    --kubelet-client-certificate="$NODE_DIR/pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$NODE_DIR/pki/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types=InternalIP \
    --service-account-issuer=https://kubernetes.default.svc."$CLUSTER_DOMAIN" \
    --service-account-key-file="$NODE_DIR/pki/sa.pub" --service-account-signing-key-file="$NODE_DIR/pki/sa.key" \
    --allow-privileged=true --profiling=false
# The kubeconfigs name https://127.0.0.1:6443, which is the API server in the node and, through
# a forwarder on the machine's loopback (over a unix socket, so the machine's network stays as
# it was), also outside it: kubectl works from both.
start_daemon apiserver-forward-node socat "UNIX-LISTEN:$NODE_DIR/apiserver.sock,fork" "TCP:127.0.0.1:$APISERVER_PORT"
NETNS='' start_daemon apiserver-forward-host socat \
    "TCP-LISTEN:$APISERVER_PORT,bind=127.0.0.1,reuseaddr,fork" "UNIX-CONNECT:$NODE_DIR/apiserver.sock"
wait_for 60 "API server" curl -sf --cacert "$NODE_DIR/pki/ca.crt" "https://127.0.0.1:$APISERVER_PORT/readyz"
start_daemon kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig="$NODE_DIR/etc/kube-controller-manager.kubeconfig" --use-service-account-credentials=true \
    --service-account-private-key-file="$NODE_DIR/pki/sa.key" --root-ca-file="$NODE_DIR/pki/ca.crt" \
    --cluster-signing-cert-file="$NODE_DIR/pki/ca.crt" --cluster-signing-key-file="$NODE_DIR/pki/ca.key" \
    --allocate-node-cidrs=true --cluster-cidr="$CLUSTER_CIDR" --node-cidr-mask-size=24 \
    --service-cluster-ip-range="$SERVICE_CIDR" --leader-elect=false --secure-port=0 --profiling=false
start_daemon kube-scheduler "$bin/kube-scheduler" --kubeconfig="$NODE_DIR/etc/kube-scheduler.kubeconfig" \
    --leader-elect=false --secure-port=0 --profiling=false

# --- nodes: containerd and the kubelet -------------------------------------------------------
# Pods resolve through the cluster DNS; dnsPolicy Default pods get this resolv.conf, whose
# nameserver (the outside host) answers nothing: the machine's own resolvers stay out of it.
echo "nameserver $OUT_IP" >"$NODE_DIR/etc/resolv.conf"
pause_image=$(cat "$here/images/pause/NAME")

# pod_cidr NODE: the pod CIDR kube-controller-manager gave NODE; fails while it has none.
pod_cidr() {
    local cidr
    cidr=$(kubectl get node "$1" -o jsonpath='{.spec.podCIDR}' 2>/dev/null) && [[ -n $cidr ]] && echo "$cidr"
}

# start_node I: containerd and the kubelet of node I, which registers; then its CNI config,
# from the pod CIDR kube-controller-manager gave it.
start_node() {
    local i=$1 name netns ip dir
    name=$(node_name "$i") netns=$(node_netns "$i") ip=$(node_ip "$i") dir=$(node_dir "$i")
    node_log "node $name ($ip): containerd $(containerd --version | awk '{print $3}'), runc, kubelet"
    mkdir -p "$dir"/{cni,containerd,kubelet,pod-logs}
    cat >"$dir/containerd/config.toml" <<TOML
version = 2
root = "$dir/containerd/root"
state = "$dir/containerd/state"
[grpc]
  address = "$dir/containerd/containerd.sock"
[ttrpc]
  address = "$dir/containerd/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause_image"
  disable_apparmor = true
  # Lowering a process's oom_score_adj needs CAP_SYS_RESOURCE, which a sandboxed machine (a
  # container, a microVM agent) may not give even to root: never ask for less than containerd's.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$dir/containerd/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/cni"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$dir/containerd/certs.d"
TOML
    NETNS=$netns UTS=$name start_daemon "containerd-$name" containerd --config "$dir/containerd/config.toml"
    wait_for 30 "containerd of $name" node_ctr "$i" version
    for archive in $archives; do node_ctr "$i" images import "$archive" >/dev/null; done

    cat >"$dir/kubelet.yaml" <<KUBELET
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP_ROOT/$name
clusterDNS: [$CLUSTER_DNS]
clusterDomain: $CLUSTER_DOMAIN
resolvConf: $NODE_DIR/etc/resolv.conf
podLogsDir: $dir/pod-logs
containerRuntimeEndpoint: unix://$dir/containerd/containerd.sock
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $NODE_DIR/pki/ca.crt}
authorization:
  mode: Webhook
address: $ip
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
failSwapOn: false
# A test node on a shared machine: never evict for disk or memory pressure.
evictionHard: {memory.available: "0%", nodefs.available: "0%", imagefs.available: "0%"}
imageGCHighThresholdPercent: 100
serializeImagePulls: false
maxPods: 250
KUBELET
    NETNS=$netns UTS=$name start_daemon "kubelet-$name" "$bin/kubelet" --config="$dir/kubelet.yaml" \
        --kubeconfig="$NODE_DIR/etc/kubelet-$name.kubeconfig" --root-dir="$dir/kubelet" \
        --cert-dir="$dir/kubelet/pki" --hostname-override="$name" --node-ip="$ip" \
        --node-labels="topology.kubernetes.io/zone=zone-$(((i - 1) % 3 + 1))" \
        --pod-infra-container-image="$pause_image"
    wait_for 60 "pod CIDR of node $name" pod_cidr "$name"
    local cidr
    cidr=$(pod_cidr "$name")
    echo "$cidr" >"$dir/pod-cidr"
    # The CNI bridge, made here with its MAC set: one the bridge plugin makes takes the lowest
    # MAC of its ports, so a new pod could change the gateway's MAC under the others (their
    # frames to the old one are then bridged past IPVS mode, which rewrites on local input).
    in_netns "$netns" ip link add cni0 address "0a:58:00:00:00:$(printf %02x "$i")" type bridge
    # The bridge masquerades nothing: traffic between pods keeps its source, on one node or
    # across nodes; what leaves the cluster's pod range is masqueraded below.
    cat >"$dir/cni/10-bridge.conflist" <<CNI
{
  "cniVersion": "1.0.0",
  "name": "roadkeeper-node",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$dir/cni/ipam",
        "ranges": [[{"subnet": "$cidr"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "loopback"}
  ]
}
CNI
    # Pod traffic leaving the cluster's pod range takes the node's address, as a CNI plugin's
    # masquerading does; a table of its own, apart from the node proxy's rules.
    in_netns "$netns" nft -f - <<NFT
table ip rkn-podnet {
    chain postrouting {
        type nat hook postrouting priority srcnat + 10; policy accept;
        ip saddr $cidr ip daddr != $CLUSTER_CIDR masquerade
    }
}
NFT
}

for i in $(seq "$nodes"); do start_node "$i"; done
# Every node routes the others' pod ranges to them; the outside host routes each to its node.
for i in $(seq "$nodes"); do
    cidr=$(cat "$(node_dir "$i")/pod-cidr")
    in_out ip route add "$cidr" via "$(node_ip "$i")"
    for j in $(seq "$nodes"); do
        ((i == j)) || in_netns "$(node_netns "$j")" ip route add "$cidr" via "$(node_ip "$i")"
    done
done
for i in $(seq "$nodes"); do
    wait_for 120 "Ready node $(node_name "$i")" kubectl wait --for=condition=Ready "node/$(node_name "$i")" --timeout=5s
done
node_log "$nodes node(s) Ready"

if ((deploy)); then
    "$here/deploy.sh" "$admin" "$proxy_mode" "$dns" >&2
fi
trap - EXIT
echo "$admin"
