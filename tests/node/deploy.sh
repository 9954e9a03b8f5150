#!/usr/bin/env bash
# Deploys roadkeeper onto the node from deploy/, as an operator would: the one ConfigMap the
# cluster must provide (the API server's address), then deploy/roadkeeper.yaml (the node proxy,
# in place of kube-proxy), deploy/dns.yaml (the cluster DNS, in place of CoreDNS) and
# deploy/ingress.yaml; waits until all of them are ready. With `coredns` last, the cluster DNS is
# CoreDNS as kubeadm installs it (tests/node/coredns.yaml) instead of deploy/dns.yaml.
#
#   tests/node/deploy.sh KUBECONFIG nftables|iptables|ipvs|ebpf [roadkeeper|coredns]
#
# The manifest gets the edits it documents: clusterCIDR (the cluster's pod range, as kubeadm
# sets kube-proxy's); for iptables mode, `mode: iptables` and NET_RAW in the DaemonSet's
# capabilities; for ipvs mode, `mode: ipvs` and the node's /lib/modules in the init container
# (which loads IPVS's modules); for ebpf mode, `mode: ebpf`, the capabilities, `--cgroup-root`
# and the cgroup and bpffs volumes (each node's own: below); and a `conntrack:` section for a node that is a network
# namespace (below).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=tests/node/lib.sh
source "$here/lib.sh"
admin=${1:?usage: deploy.sh KUBECONFIG nftables|iptables|ipvs}
mode=${2:?usage: deploy.sh KUBECONFIG nftables|iptables|ipvs}
dns=${3:-roadkeeper}
kubectl() { "$(dirname "$admin")/kubectl" --kubeconfig "$admin" "$@"; }

node_log "deploying roadkeeper (proxy in $mode mode, ingress) and the cluster DNS ($dns)"
kubectl -n kube-system create configmap kubernetes-services-endpoint \
    --from-literal=KUBERNETES_SERVICE_HOST="$NODE_IP" --from-literal=KUBERNETES_SERVICE_PORT="$APISERVER_PORT" \
    --dry-run=client -o yaml | kubectl apply -f - >/dev/null
# The optional edit deploy/roadkeeper.yaml marks, as kubeadm sets kube-proxy's clusterCIDR from
# its pod subnet: traffic to a ClusterIP from outside the pods is masqueraded.
original=$(cat "$repo/deploy/roadkeeper.yaml")
manifest=$(sed "s|^    # clusterCIDR: 10.244.0.0/16$|    clusterCIDR: $CLUSTER_CIDR|" <<<"$original")
[[ $manifest != "$original" ]] || node_fail "deploy/roadkeeper.yaml: cannot find '# clusterCIDR: 10.244.0.0/16' to set it"
if [[ $mode == iptables ]]; then
    edited=$(sed -e 's/^    mode: nftables$/    mode: iptables/' -e 's/add: \["NET_ADMIN"\]/add: ["NET_ADMIN", "NET_RAW"]/' <<<"$manifest")
    # Both edits or none: a manifest that changed shape must fail here, not deploy nftables.
    (($(diff <(echo "$manifest") <(echo "$edited") | grep -c '^>') == 2)) ||
        node_fail "deploy/roadkeeper.yaml: cannot find 'mode: nftables' and 'add: [\"NET_ADMIN\"]' to switch to iptables"
    manifest=$edited
elif [[ $mode == ipvs ]]; then
    modules='            - {name: lib-modules, mountPath: /lib/modules, readOnly: true}'
    volume='        - {name: lib-modules, hostPath: {path: /lib/modules}}'
    edited=$(sed -e 's/^    mode: nftables$/    mode: ipvs/' \
        -e "/^            #   - {name: lib-modules, mountPath: \/lib\/modules, readOnly: true}\$/a\\$modules" \
        -e "/^      volumes:\$/a\\$volume" <<<"$manifest")
    (($(diff <(echo "$manifest") <(echo "$edited") | grep -c '^>') == 3)) ||
        node_fail "deploy/roadkeeper.yaml: cannot find 'mode: nftables', the lib-modules comment and 'volumes:' to switch to ipvs"
    manifest=$edited
elif [[ $mode == ebpf ]]; then
    # The edits the manifest names for ebpf mode, with one difference: the nodes share this
    # machine, so each node's proxy mounts its own node's cgroup (the cgroup v2 hierarchy's
    # /roadkeeper-node/<node>, where its kubelet puts its pods) and its own folder of one bpffs,
    # by the pod's node name (subPathExpr), not the machine's root cgroup and /sys/fs/bpf.
    v2=$(cgroup_v2)
    [[ -n $v2 && -e $v2/$CGROUP_ROOT ]] || node_fail "no cgroup v2 hierarchy with $CGROUP_ROOT at $v2: eBPF mode needs one"
    mkdir -p "$NODE_DIR/bpf"
    mountpoint -q "$NODE_DIR/bpf" || mount -t bpf bpf "$NODE_DIR/bpf"
    arg='            - --cgroup-root=/run/roadkeeper/cgroup'
    mounts='            - {name: cgroup, mountPath: /run/roadkeeper/cgroup, subPathExpr: $(NODE_NAME)}\n            - {name: bpf, mountPath: /sys/fs/bpf, subPathExpr: $(NODE_NAME)}'
    volumes="        - {name: cgroup, hostPath: {path: $v2/$CGROUP_ROOT, type: Directory}}\\n        - {name: bpf, hostPath: {path: $NODE_DIR/bpf, type: Directory}}"
    edited=$(sed -e 's/^    mode: nftables$/    mode: ebpf/' \
        -e 's/add: \["NET_ADMIN"\]/add: ["NET_ADMIN", "BPF", "PERFMON", "SYS_ADMIN"]/' \
        -e "/^            #   - --cgroup-root=\/run\/roadkeeper\/cgroup\$/a\\$arg" \
        -e "/^            #   - {name: bpf, mountPath: \/sys\/fs\/bpf}\$/a\\$mounts" \
        -e "/^      volumes:\$/a\\$volumes" <<<"$manifest")
    (($(diff <(echo "$manifest") <(echo "$edited") | grep -c '^>') == 7)) ||
        node_fail "deploy/roadkeeper.yaml: cannot find 'mode: nftables', the capabilities, and the ebpf comments of the flag and the mounts, to switch to ebpf"
    manifest=$edited
fi
# The node is a network namespace of this machine, where nf_conntrack_max (node-wide) cannot be
# written: the init container that writes the conntrack settings leaves it alone, as kind sets
# kube-proxy's maxPerCore: 0 for the same reason. nftables mode gets liberal TCP tracking, as
# upstream's nftables CI sets conntrack.tcpBeLiberal: kube-proxy's nftables mode does not drop
# packets conntrack calls INVALID and leaves them to it (upstream's test of issue 74839).
conntrack="    conntrack: {maxPerCore: 0}"
[[ $mode == nftables ]] && conntrack="    conntrack: {maxPerCore: 0, tcpBeLiberal: true}"
edited=$(sed "/^    mode: $mode\$/a\\$conntrack" <<<"$manifest")
(($(diff <(echo "$manifest") <(echo "$edited") | grep -c '^>') == 1)) ||
    node_fail "deploy/roadkeeper.yaml: cannot find 'mode: $mode' to add the conntrack settings after it"
manifest=$edited
kubectl apply -f - <<<"$manifest" >/dev/null
case $dns in
    roadkeeper) kubectl apply -f "$repo/deploy/dns.yaml" >/dev/null; dns_deployment=roadkeeper-dns ;;
    # Created, not applied, as kubeadm creates its objects: no last-applied annotation.
    coredns) kubectl create -f "$here/coredns.yaml" >/dev/null; dns_deployment=coredns ;;
    *) node_fail "DNS $dns: not roadkeeper or coredns" ;;
esac
kubectl apply -f "$repo/deploy/ingress.yaml" >/dev/null
kubectl -n kube-system rollout status daemonset/roadkeeper --timeout=$((180 * NODE_SLOWDOWN))s >&2
kubectl -n kube-system rollout status "deployment/$dns_deployment" --timeout=$((180 * NODE_SLOWDOWN))s >&2
kubectl -n kube-system rollout status deployment/roadkeeper-ingress --timeout=$((180 * NODE_SLOWDOWN))s >&2
