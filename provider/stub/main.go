// The gpuhost plugin's stub as a small static binary: what provider/stub.py does, without a Python start.
//
// The engine starts a plugin once per provider instance - one per host - and pass; each start is a stub that asks
// the pass's one serving process (provider/__main__.py --serve) for an instance of its own, prints that instance's
// port for the engine and stays until the engine ends it (SIGINT, then SIGTERM), the serving process ends, or the CLI
// is gone. provider/stub.py's docstring tells the whole protocol; this file follows it step for step, and
// provider/pulumi-resource-gpuhost runs it when it was built from this source (tools/bootstrap.sh), else stub.py.
// A Python stub costs ~30 ms of CPU a start (the interpreter and its imports): three passes of an `up --refresh` paid
// it three times a host. Standard library only.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const (
	startS         = 60 * time.Second // how long a serving process (or a zygote) may take to answer
	zygoteAnswerS  = 20 * time.Second // how long the zygote may take to fork a pass's serving process
	passDirEnv     = "GPUHOST_PASS_DIR"
	detachArgument = "--gpuhost-detach" // this binary, run as the short-lived parent of a detached process
)

var (
	here   string // provider/ (this binary is provider/bin/gpuhost-stub)
	python string // the project's virtualenv's python, as provider/pulumi-resource-gpuhost runs stub.py
)

func connect(path string) net.Conn {
	c, err := net.Dial("unix", path)
	if err != nil {
		return nil
	}
	return c
}

// tempDir: Python's tempfile.gettempdir() - TMPDIR, TEMP, TMP, then /tmp, /var/tmp, /usr/tmp, the working
// directory: the first that is a directory this process may write - so that a pass's stubs agree whichever runs.
func tempDir() string {
	var dirs []string
	for _, k := range []string{"TMPDIR", "TEMP", "TMP"} {
		if v := os.Getenv(k); v != "" {
			dirs = append(dirs, v)
		}
	}
	dirs = append(dirs, "/tmp", "/var/tmp", "/usr/tmp")
	if wd, err := os.Getwd(); err == nil {
		dirs = append(dirs, wd)
	}
	for _, d := range dirs {
		if st, err := os.Stat(d); err == nil && st.IsDir() && syscall.Access(d, 2|1) == nil {
			abs, err := filepath.Abs(d)
			if err == nil {
				return abs
			}
		}
	}
	return "/tmp"
}

// base: provider/passdir.py base() - the operator's private directory.
func base() (string, error) {
	path := filepath.Join(tempDir(), fmt.Sprintf("gpuhost-rollout-%d", os.Getuid()))
	if err := os.MkdirAll(path, 0o700); err != nil {
		return "", err
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		return "", err
	}
	if int(st.Uid) != os.Getuid() || st.Mode&0o077 != 0 || st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return "", fmt.Errorf("%s is not the operator's own private directory (owner %d, mode %o)", path, st.Uid,
			st.Mode&0o777)
	}
	return path, nil
}

// startTime: field 22 of /proc/<pid>/stat (after the command's closing parenthesis, the 20th), or "".
func startTime(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndex(s, ")")+1:])
	if len(f) < 20 {
		return ""
	}
	return f[19]
}

// sweep: the pass directories of CLIs that are gone (or whose pid now names another process).
func sweep(root string) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, e := range entries {
		pid, rest, _ := strings.Cut(e.Name(), "-")
		start, _, _ := strings.Cut(rest, "-")
		if n, err := strconv.Atoi(pid); err == nil && pid != "" && strings.Trim(pid, "0123456789") == "" &&
			startTime(n) != start {
			os.RemoveAll(filepath.Join(root, e.Name()))
		}
	}
}

// engineAddress: the engine's address among the arguments (it passes it to every provider plugin).
func engineAddress() string {
	for _, a := range os.Args[1:] {
		i := strings.LastIndex(a, ":")
		if i < 0 {
			continue
		}
		host, port := a[:i], a[i+1:]
		if (host == "127.0.0.1" || host == "localhost" || host == "[::1]") && port != "" &&
			strings.Trim(port, "0123456789") == "" {
			return a
		}
	}
	return ""
}

// passDir: provider/passdir.py path() - this pass's directory, made (and the ended passes' swept).
func passDir() (string, error) {
	if given := os.Getenv(passDirEnv); given != "" {
		return given, nil
	}
	root, err := base()
	if err != nil {
		return "", err
	}
	sweep(root)
	cli := os.Getppid()
	engine := engineAddress()
	if engine == "" {
		engine = "none"
	}
	start := startTime(cli)
	if start == "" {
		start = "0"
	}
	dir := filepath.Join(root, fmt.Sprintf("%d-%s-%s", cli, start, engine[strings.LastIndex(engine, ":")+1:]))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	return dir, nil
}

// identity: provider/identity.py of() for this process - what a fork inherits from the zygote - read the same way
// (namespaces, root, cgroup, credentials, limits, scheduling); the zygote itself compares its own with its peer's.
func identity() (string, error) {
	read := func(name string) (string, error) {
		b, err := os.ReadFile("/proc/self/" + name)
		return string(b), err
	}
	entries, err := os.ReadDir("/proc/self/ns")
	if err != nil {
		return "", err
	}
	var ns []string
	for _, e := range entries {
		l, err := os.Readlink("/proc/self/ns/" + e.Name())
		if err != nil {
			return "", err
		}
		ns = append(ns, l)
	}
	sort.Strings(ns)
	root, err := os.Readlink("/proc/self/root")
	if err != nil {
		return "", err
	}
	parts := []string{"ns " + strings.Join(ns, " "), "root " + root}
	for _, name := range []string{"cgroup", "status", "stat", "oom_score_adj", "limits"} {
		text, err := read(name)
		if err != nil {
			return "", err
		}
		if name == "status" || name == "stat" {
			// Not the fields that change with the process's life (its pid, memory, times, state).
			text = stableFields(name, text)
		}
		parts = append(parts, name+" "+text)
	}
	return strings.Join(parts, "\n"), nil
}

var statusKeys = []string{"Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs",
	"Seccomp", "Seccomp_filters", "Cpus_allowed_list", "Mems_allowed_list"}

func stableFields(name, text string) string {
	if name == "stat" {
		f := strings.Fields(text[strings.LastIndex(text, ")")+1:])
		if len(f) < 39 {
			return "?"
		}
		return fmt.Sprintf("nice %s rt_priority %s policy %s", f[16], f[37], f[38])
	}
	values := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		k, v, _ := strings.Cut(line, ":")
		values[k] = strings.Join(strings.Fields(v), " ")
	}
	var out []string
	for _, k := range statusKeys {
		if v, ok := values[k]; ok {
			out = append(out, k+" "+v)
		}
	}
	return strings.Join(out, "\n")
}

// zygotePath: the zygote's socket for this virtualenv and plugin directory, the environment that decides what
// Python loads, and this process's identity, in the operator's private directory.
func zygotePath() (string, error) {
	id, err := identity()
	if err != nil {
		return "", err
	}
	var pyenv []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PYTHON") {
			pyenv = append(pyenv, kv)
		}
	}
	sort.Strings(pyenv)
	key, _ := json.Marshal([]any{"go-stub", python, here, pyenv, id})
	sum := sha256.Sum256(key)
	root, err := base()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "zygote-"+hex.EncodeToString(sum[:])[:16]+".sock"), nil
}

func readLine(c net.Conn, deadline time.Time) (string, bool) {
	c.SetReadDeadline(deadline)
	var got []byte
	buf := make([]byte, 64)
	for !strings.HasSuffix(string(got), "\n") {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil && !strings.HasSuffix(string(got), "\n") {
			return "", false
		}
	}
	return string(got), true
}

// askZygote: "ok" once the zygote forked this pass's serving process, "stale", "other", or "" (none answers).
func askZygote(path, dir, log string) string {
	c := connect(path)
	if c == nil {
		return ""
	}
	defer c.Close()
	umask := syscall.Umask(0o077)
	syscall.Umask(umask)
	env := map[string]string{}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	env[passDirEnv] = dir
	cwd, _ := os.Getwd()
	request, err := json.Marshal(map[string]any{"argv": os.Args[1:], "env": env, "cwd": cwd, "umask": umask,
		"log": log})
	if err != nil {
		return ""
	}
	c.SetWriteDeadline(time.Now().Add(zygoteAnswerS))
	if _, err := c.Write(request); err != nil {
		return ""
	}
	c.(*net.UnixConn).CloseWrite()
	line, ok := readLine(c, time.Now().Add(zygoteAnswerS))
	if !ok {
		return ""
	}
	return strings.TrimSpace(line)
}

func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o666)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// fromZygote: this pass's serving process forked by the zygote, which is started when none answers; false when that
// fails for any reason (the caller then starts one the plain way), or when the zygote answers `other`.
func fromZygote(dir, log string) bool {
	path, err := zygotePath()
	if err != nil {
		return false
	}
	if a := askZygote(path, dir, log); a == "ok" || a == "other" {
		return a == "ok"
	}
	stem := strings.TrimSuffix(path, ".sock")
	lock, err := lockFile(stem + ".lock")
	if err != nil {
		return false
	}
	defer lock.Close()
	if a := askZygote(path, dir, log); a == "ok" || a == "other" {
		return a == "ok"
	}
	// Its own session: neither the engine ending this stub nor the operator's Ctrl-C reaches it. Only what decides
	// how Python loads modules of its environment: a CLI's (its secrets among them) goes to that CLI's passes.
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "PATH" || k == "HOME" || k == "LANG" || k == "TZ" || k == "TMPDIR" || strings.HasPrefix(k, "LC_") ||
			strings.HasPrefix(k, "PYTHON") {
			env = append(env, kv)
		}
	}
	errf, err := os.OpenFile(stem+".log", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o666)
	if err != nil {
		return false
	}
	defer errf.Close()
	zygote := exec.Command(python, filepath.Join(here, "__main__.py"), "--zygote", path)
	zygote.Stderr, zygote.Dir, zygote.Env = errf, "/", env
	zygote.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := zygote.Start(); err != nil {
		return false
	}
	ended := make(chan struct{})
	go func() { zygote.Wait(); close(ended) }()
	deadline := time.Now().Add(startS)
	for time.Now().Before(deadline) {
		select {
		case <-ended:
			return false
		default:
		}
		if c := connect(path); c != nil {
			c.Close()
			return askZygote(path, dir, log) == "ok"
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// spawn: the serving process, detached - its own session, and not a child of this stub (the engine ends a stub's
// children with it): this binary runs it from a parent of its own that exits at once.
func spawn(dir, log string) {
	self, err := os.Executable()
	if err != nil {
		return
	}
	argv := append([]string{detachArgument, log, python, filepath.Join(here, "__main__.py"), "--serve"}, os.Args[1:]...)
	cmd := exec.Command(self, argv...)
	cmd.Env = append(os.Environ(), passDirEnv+"="+dir)
	cmd.Run()
}

// detach: (as the short-lived parent) start argv in a session of its own, stdin and stdout /dev/null, stderr
// appended to log, and exit.
func detach(log string, argv []string) {
	cmd := exec.Command(argv[0], argv[1:]...)
	if f, err := os.OpenFile(log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o666); err == nil {
		cmd.Stderr = f
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Start()
	os.Exit(0)
}

func serving(dir string) net.Conn {
	sock := filepath.Join(dir, "plugin.sock")
	log := filepath.Join(dir, "plugin.log")
	lock, err := lockFile(filepath.Join(dir, "plugin.lock"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpuhost: the provider plugin's lock: %v\n", err)
		os.Exit(1)
	}
	defer lock.Close()
	if c := connect(sock); c != nil {
		return c
	}
	if os.Getenv("GPUHOST_PLUGIN_ZYGOTE") == "0" || !fromZygote(dir, log) {
		spawn(dir, log)
	}
	deadline := time.Now().Add(startS)
	for time.Now().Before(deadline) {
		if c := connect(sock); c != nil {
			return c
		}
		time.Sleep(20 * time.Millisecond)
	}
	tail := ""
	if b, err := os.ReadFile(log); err == nil {
		if len(b) > 2000 {
			b = b[len(b)-2000:]
		}
		tail = strings.ToValidUTF8(string(b), "\uFFFD")
	}
	fmt.Fprintf(os.Stderr, "gpuhost: the provider plugin did not start within %d s: %s\n", int(startS.Seconds()), tail)
	os.Exit(1)
	return nil
}

// instance: (connection, port line) from the pass's serving process; nil when it ended before answering (it was
// ending after its last instance as this one asked: the next try starts another).
func instance(dir string) (net.Conn, string) {
	c := serving(dir)
	if _, err := c.Write([]byte("new\n")); err != nil {
		c.Close()
		return nil, ""
	}
	line, ok := readLine(c, time.Time{})
	if !ok {
		c.Close()
		return nil, ""
	}
	return c, line
}

func main() {
	if len(os.Args) > 3 && os.Args[1] == detachArgument {
		detach(os.Args[2], os.Args[3:])
	}
	// The CLI that started this stub, read first: a CLI that exits right after reading the port line must not leave
	// this stub taking its new parent for the CLI.
	cli := os.Getppid()
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpuhost: the provider plugin's stub cannot find itself: %v\n", err)
		os.Exit(1)
	}
	here = filepath.Dir(filepath.Dir(self))
	python = filepath.Join(filepath.Dir(here), ".venv", "bin", "python")
	if os.Getenv("GPUHOST_PLUGIN_SHARED") == "0" {
		argv := append([]string{python, filepath.Join(here, "__main__.py")}, os.Args[1:]...)
		err := syscall.Exec(python, argv, os.Environ())
		fmt.Fprintf(os.Stderr, "gpuhost: %s: %v\n", python, err)
		os.Exit(1)
	}
	dir, err := passDir()
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpuhost: %v\n", err)
		os.Exit(1)
	}
	var conn net.Conn
	var line string
	for try := 0; try < 3 && conn == nil; try++ {
		if try > 0 {
			time.Sleep(200 * time.Millisecond)
		}
		conn, line = instance(dir)
	}
	if conn == nil {
		fmt.Fprintf(os.Stderr, "gpuhost: the provider plugin ended before it served this instance (%s)\n",
			filepath.Join(dir, "plugin.log"))
		os.Exit(1)
	}
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() { <-signals; os.Exit(0) }()
	os.Stdout.WriteString(line)
	// Until the engine ends this stub, the serving process ends, or the CLI is gone (a CLI that exits without ending
	// its plugins leaves this stub to another parent).
	buf := make([]byte, 4096)
	for os.Getppid() == cli {
		conn.SetReadDeadline(time.Now().Add(time.Second))
		n, err := conn.Read(buf)
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			break
		}
		if n == 0 {
			break
		}
	}
	os.Exit(0)
}
