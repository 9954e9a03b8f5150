//go:build tools

// Package tools names the main package bench/vs-upstream.sh compiles, so that go mod tidy keeps
// go.mod and go.sum pinning everything it needs.
package tools

import _ "k8s.io/kubernetes/cmd/kube-proxy"
