// Command pulumi-language-python is a small Python language host for the Pulumi engine.
//
// Why it exists: the upstream host lives in its own Go module
// (github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3), which has no version
// tags and whose pseudo-versions the Go module proxy reachable from our build machines
// refuses ("This module version is not available."). Everything it needs to talk to the
// engine is in the served sdk/v3 module, and the Python side of running a program is
// upstream's own `pulumi-language-python-exec` script, installed beside this binary. So
// this host only does the part that is Go: serve the LanguageRuntime gRPC API, resolve the
// project's virtualenv, and start the exec script with the engine's settings.
//
// On a machine with a real Pulumi installation this binary is not used: bootstrap prefers
// the `pulumi` already on PATH and its own language host.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pulumi/pulumi/sdk/v3/go/common/util/rpcutil"
	"github.com/pulumi/pulumi/sdk/v3/go/common/version"
	pulumirpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"
)

// exitCodeUserActionable is what pulumi-language-python-exec exits with after it has
// already shown the user an actionable error; the engine should not add a stack trace.
const exitCodeUserActionable = 32

type host struct {
	pulumirpc.UnimplementedLanguageRuntimeServer
	engineAddress string
	execScript    string
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: pulumi-language-python <engine-address>")
		os.Exit(2)
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot locate own executable:", err)
		os.Exit(1)
	}
	h := &host{
		engineAddress: os.Args[len(os.Args)-1],
		execScript:    filepath.Join(filepath.Dir(self), "pulumi-language-python-exec"),
	}
	cancel := make(chan bool)
	handle, err := rpcutil.ServeWithOptions(rpcutil.ServeOptions{
		Cancel: cancel,
		Init: func(srv *grpc.Server) error {
			pulumirpc.RegisterLanguageRuntimeServer(srv, h)
			return nil
		},
		Options: rpcutil.OpenTracingServerInterceptorOptions(nil),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "could not start language host RPC server:", err)
		os.Exit(1)
	}
	// The engine reads the port from our first line of stdout.
	fmt.Printf("%d\n", handle.Port)
	if err := <-handle.Done; err != nil {
		fmt.Fprintln(os.Stderr, "language host RPC stopped:", err)
		os.Exit(1)
	}
}

func (h *host) Handshake(_ context.Context, req *pulumirpc.LanguageHandshakeRequest) (*pulumirpc.LanguageHandshakeResponse, error) {
	if req.EngineAddress != "" {
		h.engineAddress = req.EngineAddress
	}
	return &pulumirpc.LanguageHandshakeResponse{}, nil
}

func (h *host) GetPluginInfo(context.Context, *emptypb.Empty) (*pulumirpc.PluginInfo, error) {
	return &pulumirpc.PluginInfo{Version: strings.TrimPrefix(version.Version, "v")}, nil
}

// Plugins are installed by the project's bootstrap, not discovered from site-packages.
func (h *host) GetRequiredPlugins(context.Context, *pulumirpc.GetRequiredPluginsRequest) (*pulumirpc.GetRequiredPluginsResponse, error) {
	return &pulumirpc.GetRequiredPluginsResponse{}, nil
}

func (h *host) GetRequiredPackages(context.Context, *pulumirpc.GetRequiredPackagesRequest) (*pulumirpc.GetRequiredPackagesResponse, error) {
	return &pulumirpc.GetRequiredPackagesResponse{}, nil
}

func (h *host) GetProgramDependencies(context.Context, *pulumirpc.GetProgramDependenciesRequest) (*pulumirpc.GetProgramDependenciesResponse, error) {
	return &pulumirpc.GetProgramDependenciesResponse{}, nil
}

func (h *host) About(_ context.Context, req *pulumirpc.AboutRequest) (*pulumirpc.AboutResponse, error) {
	python, err := pythonFor(req.Info)
	if err != nil {
		return nil, err
	}
	out, err := exec.Command(python, "--version").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --version: %w", python, err)
	}
	return &pulumirpc.AboutResponse{
		Executable: python,
		Version:    strings.TrimPrefix(strings.TrimSpace(string(out)), "Python "),
	}, nil
}

// InstallDependencies creates the project's virtualenv and installs requirements.txt into it,
// streaming pip's output to the engine.
func (h *host) InstallDependencies(req *pulumirpc.InstallDependenciesRequest, srv grpc.ServerStreamingServer[pulumirpc.InstallDependenciesResponse]) error {
	venv := virtualenvDir(req.Info)
	if venv == "" {
		return errors.New("Pulumi.yaml runtime.options.virtualenv is not set; this host only runs virtualenv projects")
	}
	w := streamWriter{srv}
	steps := [][]string{}
	if _, err := os.Stat(filepath.Join(venv, "bin", "python")); err != nil {
		steps = append(steps, []string{"python3", "-m", "venv", venv})
	}
	steps = append(steps, []string{filepath.Join(venv, "bin", "python"), "-m", "pip", "install", "-r",
		filepath.Join(req.Info.GetProgramDirectory(), "requirements.txt")})
	for _, argv := range steps {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Stdout, cmd.Stderr = w, w
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s: %w", strings.Join(argv, " "), err)
		}
	}
	return nil
}

type streamWriter struct {
	srv grpc.ServerStreamingServer[pulumirpc.InstallDependenciesResponse]
}

func (w streamWriter) Write(p []byte) (int, error) {
	if err := w.srv.Send(&pulumirpc.InstallDependenciesResponse{Stdout: p}); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (h *host) Run(ctx context.Context, req *pulumirpc.RunRequest) (*pulumirpc.RunResponse, error) {
	python, err := pythonFor(req.Info)
	if err != nil {
		return &pulumirpc.RunResponse{Error: err.Error()}, nil
	}
	program := req.Info.GetEntryPoint()
	if program == "" {
		program = "."
	}
	args := []string{"-u", h.execScript,
		"--monitor", req.MonitorAddress,
		"--engine", h.engineAddress,
		"--project", req.Project,
		"--stack", req.Stack,
		"--pwd", req.Pwd,
		"--dry_run", strconv.FormatBool(req.DryRun),
		"--parallel", strconv.Itoa(int(req.Parallel)),
		"--organization", req.Organization,
		"--root_directory", req.Info.GetRootDirectory(),
		program,
	}
	args = append(args, req.Args...)

	// The exec script iterates both; JSON null (Go's nil map/slice) would crash it.
	if req.Config == nil {
		req.Config = map[string]string{}
	}
	if req.ConfigSecretKeys == nil {
		req.ConfigSecretKeys = []string{}
	}
	config, err := json.Marshal(req.Config)
	if err != nil {
		return nil, err
	}
	secretKeys, err := json.Marshal(req.ConfigSecretKeys)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, python, args...)
	cmd.Dir = req.Info.GetProgramDirectory()
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(),
		"PULUMI_CONFIG="+string(config),
		"PULUMI_CONFIG_SECRET_KEYS="+string(secretKeys),
	)
	if venv := virtualenvDir(req.Info); venv != "" {
		cmd.Env = append(cmd.Env, "VIRTUAL_ENV="+venv,
			"PATH="+filepath.Join(venv, "bin")+string(os.PathListSeparator)+os.Getenv("PATH"))
	}
	if err := cmd.Run(); err != nil {
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			if exitErr.ExitCode() == exitCodeUserActionable {
				return &pulumirpc.RunResponse{Bail: true}, nil
			}
			return &pulumirpc.RunResponse{Error: fmt.Sprintf("Program exited with non-zero exit code: %d", exitErr.ExitCode())}, nil
		}
		return &pulumirpc.RunResponse{Error: fmt.Sprintf("Problem executing program (could not run language executor): %v", err)}, nil
	}
	return &pulumirpc.RunResponse{}, nil
}

func (h *host) Cancel(context.Context, *emptypb.Empty) (*emptypb.Empty, error) {
	return &emptypb.Empty{}, nil
}

// virtualenvDir resolves Pulumi.yaml's runtime.options.virtualenv against the project root.
func virtualenvDir(info *pulumirpc.ProgramInfo) string {
	if info == nil || info.Options == nil {
		return ""
	}
	v, ok := info.Options.Fields["virtualenv"]
	if !ok || v.GetStringValue() == "" {
		return ""
	}
	dir := v.GetStringValue()
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(info.RootDirectory, dir)
	}
	return dir
}

func pythonFor(info *pulumirpc.ProgramInfo) (string, error) {
	venv := virtualenvDir(info)
	if venv == "" {
		if p := os.Getenv("PULUMI_PYTHON_CMD"); p != "" {
			return p, nil
		}
		return exec.LookPath("python3")
	}
	python := filepath.Join(venv, "bin", "python")
	if _, err := os.Stat(python); err != nil {
		return "", fmt.Errorf("the virtualenv %s from Pulumi.yaml has no bin/python; run `make bootstrap` (or `pulumi install`) to create it", venv)
	}
	return python, nil
}
