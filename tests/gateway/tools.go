//go:build tools

// Package tools names the packages build.sh compiles: the conformance suite (a
// test binary, so its test files' imports are named too) and echo-basic, so
// that go mod tidy keeps go.mod and go.sum pinning everything they need.
package tools

import (
	_ "github.com/stretchr/testify/assert"
	_ "sigs.k8s.io/gateway-api/conformance"
	_ "sigs.k8s.io/gateway-api/conformance/echo-basic"
	_ "sigs.k8s.io/gateway-api/pkg/features"
)
