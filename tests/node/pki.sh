#!/usr/bin/env bash
# Writes the credentials of a cluster of $2 nodes (default 1) into folder $1: a CA, the API server's serving certificate, its
# client certificate towards the kubelet, the service-account key pair, and a token file (with
# one bearer token per client: admin, kube-controller-manager, kube-scheduler and each node's
# kubelet; the uid column names each client's kubeconfig).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/node/lib.sh
source "$here/lib.sh"
dir=${1:?usage: pki.sh DIR [NODES]}
nodes=${2:-1}
mkdir -p "$dir"
cd "$dir"
umask 077

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
    -subj "/CN=roadkeeper-node-ca" -keyout ca.key -out ca.crt 2>/dev/null

# sign NAME SUBJECT [SANS]: NAME.key and NAME.crt signed by the CA.
sign() {
    local extensions="basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth"
    [[ -n ${3:-} ]] && extensions+=$'\n'"subjectAltName=$3"
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "$2" \
        -keyout "$1.key" -out "$1.csr" 2>/dev/null
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 \
        -extfile <(echo "$extensions") -out "$1.crt" 2>/dev/null
    rm "$1.csr"
}
sign apiserver "/CN=kube-apiserver" \
    "IP:$NODE_IP,IP:$KUBERNETES_SERVICE_IP,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.$CLUSTER_DOMAIN"
sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"

openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key 2>/dev/null
openssl pkey -in sa.key -pubout -out sa.pub

token() { openssl rand -hex 16; }
{
    echo "$(token),admin,admin,\"system:masters\""
    echo "$(token),system:kube-controller-manager,kube-controller-manager,"
    echo "$(token),system:kube-scheduler,kube-scheduler,"
    for i in $(seq "$nodes"); do
        echo "$(token),system:node:$(node_name "$i"),kubelet-$(node_name "$i"),\"system:nodes\""
    done
} >tokens.csv
chmod 644 ca.crt
