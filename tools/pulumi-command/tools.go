//go:build tools

// Package tools pins the provider's main package so `go mod tidy` keeps its dependencies.
package tools

import (
	_ "github.com/pulumi/pulumi-command/provider/cmd/pulumi-resource-command"
)
