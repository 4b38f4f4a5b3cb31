//go:build tools

// Package tools pins the two main packages built from this module - the Pulumi CLI and
// upstream's Python language host - so `go mod tidy` keeps their dependencies.
package tools

import (
	_ "github.com/pulumi/pulumi/pkg/v3/cmd/pulumi"
	_ "github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3"
)
