// Package testkit runs the real idemgate binary for the tests that need whole processes (the
// process tests of package main, the browser tests in e2e/ and the history checker in
// e2e/history/): it builds the binary once, starts `idemgate serve` on a free loopback port,
// waits for /healthz, and puts a TCP proxy that can cut or stall the connection between a
// server and PostgreSQL (proxy.go). Being internal, it is for this repository's tests only.
package testkit

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// MainPackage is the import path of the idemgate command.
const MainPackage = "github.com/idemgate/idemgate"

// HealthTimeout bounds how long Start waits for /healthz: migrations of a fresh database and,
// under -race on a loaded 2-core machine, the start itself can take seconds.
const HealthTimeout = 30 * time.Second

// BuildMain builds the idemgate binary into a temporary folder, sets *binary to its path, runs
// the package's tests and removes the folder: use it from TestMain, as
// os.Exit(testkit.BuildMain(m, &binary)). A failed build fails the package before any test.
func BuildMain(m *testing.M, binary *string) int {
	dir, err := os.MkdirTemp("", "idemgate-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if *binary, err = Build(dir); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		return 1
	}
	return m.Run()
}

// Build builds the idemgate binary into dir and returns its path.
func Build(dir string) (string, error) {
	bin := filepath.Join(dir, "idemgate")
	if out, err := exec.Command("go", "build", "-o", bin, MainPackage).CombinedOutput(); err != nil {
		return "", fmt.Errorf("build idemgate: %v\n%s", err, out)
	}
	return bin, nil
}

// FreeAddr returns a loopback address ("127.0.0.1:port") that was free a moment ago.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	addr, err := PickAddr()
	if err != nil {
		tb.Fatalf("free address: %v", err)
	}
	return addr
}

// PickAddr is FreeAddr for callers without a test (TestMain).
func PickAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// MinimalEnv is the environment a server process starts from unless a test gives it more:
// PATH and HOME, nothing of the test's own environment (no DATABASE_URL, no IDEMGATE_*).
func MinimalEnv() []string {
	return []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
}

// Log collects a process's output; a test may read it while the process writes.
type Log struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Tail is the last n bytes of the log.
func (l *Log) Tail(n int) string {
	s := l.String()
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// Proc is `idemgate serve` at a fixed address, which a test may stop and start again: every
// run appends to the same Log.
type Proc struct {
	Binary string
	Addr   string   // 127.0.0.1:port
	Env    []string // the whole environment; Start adds IDEMGATE_ADDR
	Dir    string   // working directory; "" is the test's
	Log    *Log

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when the current run has exited and err is set
	err    error
}

// NewProc returns a stopped Proc of binary at a free address with environment env. It does
// not start it.
func NewProc(binary, addr string, env ...string) *Proc {
	return &Proc{Binary: binary, Addr: addr, Env: env, Log: &Log{}}
}

// Serve starts `idemgate serve` with MinimalEnv and env (a later entry wins) and waits until
// it answers /healthz, failing tb if it does not. When tb ends the process is killed and, if
// tb failed, the tail of its log is logged.
func Serve(tb testing.TB, binary string, env ...string) *Proc {
	tb.Helper()
	p := NewProc(binary, FreeAddr(tb), append(MinimalEnv(), env...)...)
	p.Dir = tb.TempDir()
	tb.Cleanup(func() {
		p.Kill()
		if tb.Failed() {
			tb.Logf("server %s log (tail):\n%s", p.Addr, p.Log.Tail(8000))
		}
	})
	if err := p.Start(); err != nil {
		tb.Fatal(err)
	}
	return p
}

// URL is the server's base URL, "http://127.0.0.1:port".
func (p *Proc) URL() string { return "http://" + p.Addr }

// Start runs the binary's serve command (Launch) and waits until it answers GET /healthz with
// 200, for HealthTimeout at most. An error says why it did not (it exited, or never answered),
// with its log; a process that never answered is killed.
func (p *Proc) Start() error {
	if err := p.Launch(); err != nil {
		return err
	}
	if err := WaitHealthy(p.URL(), HealthTimeout, p.Exited()); err != nil {
		p.Kill()
		return fmt.Errorf("server %s: %w; log:\n%s", p.Addr, err, p.Log.String())
	}
	return nil
}

// Launch runs the binary's serve command and returns at once, without waiting for /healthz.
func (p *Proc) Launch() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("server %s is already running", p.Addr)
	}
	if p.Log == nil {
		p.Log = &Log{}
	}
	cmd := exec.Command(p.Binary, "serve")
	cmd.Dir = p.Dir
	cmd.Env = append(append([]string(nil), p.Env...), "IDEMGATE_ADDR="+p.Addr)
	cmd.Stdout, cmd.Stderr = p.Log, p.Log
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	p.cmd, p.exited = cmd, exited
	go func() {
		err := cmd.Wait() // also waits for the copying of the output into Log
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(exited)
	}()
	return nil
}

// Exited is closed when the current run has exited (nil when stopped: a receive blocks).
func (p *Proc) Exited() <-chan struct{} {
	_, exited := p.running()
	return exited
}

// WaitHealthy polls url+"/healthz" until it answers 200, timeout passes, or exited (when not
// nil) is closed: the process died before answering.
func WaitHealthy(url string, timeout time.Duration, exited <-chan struct{}) error {
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	for {
		if resp, err := client.Get(url + "/healthz"); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-poll.C:
		case <-exited:
			return errors.New("exited before answering /healthz")
		case <-deadline.C:
			return fmt.Errorf("did not answer /healthz within %v", timeout)
		}
	}
}

// running returns the current run's command and exit channel, nil if not started.
func (p *Proc) running() (*exec.Cmd, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd, p.exited
}

// Pid is the process id of the current run (0 when stopped).
func (p *Proc) Pid() int {
	if cmd, _ := p.running(); cmd != nil {
		return cmd.Process.Pid
	}
	return 0
}

// Signal sends sig to the current run.
func (p *Proc) Signal(sig os.Signal) error {
	cmd, _ := p.running()
	if cmd == nil {
		return fmt.Errorf("server %s is not running", p.Addr)
	}
	return cmd.Process.Signal(sig)
}

// Wait waits for the current run to exit and returns its exit error (nil for a clean exit),
// and marks the Proc stopped so that Start may run it again. Any number of callers may wait.
func (p *Proc) Wait() error {
	cmd, exited := p.running()
	if cmd == nil {
		return nil
	}
	<-exited
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == cmd {
		p.cmd = nil
	}
	return p.err
}

// Kill sends SIGKILL (kill -9) to the current run, if any, and waits for it.
func (p *Proc) Kill() {
	_ = p.Signal(syscall.SIGKILL)
	_ = p.Wait()
}

// Stop sends SIGTERM, waits up to grace for a clean exit, then kills. It returns the exit
// error of the run (nil for a clean exit), or an error saying it had to be killed.
func (p *Proc) Stop(grace time.Duration) error {
	cmd, exited := p.running()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		return p.Wait()
	case <-time.After(grace):
		p.Kill()
		return fmt.Errorf("server %s did not exit within %v of SIGTERM; killed", p.Addr, grace)
	}
}
