package testkit

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// MCPSDKVersion is the version of the npm package @modelcontextprotocol/sdk, the reference
// TypeScript SDK of the Model Context Protocol, that the MCP tests use as client and as the
// upstream server of idemgate mcp-gateway: an implementation no one here wrote.
const MCPSDKVersion = "1.32.2"

// NodeScript copies the Node.js script at path (an .mjs file of the calling test's testdata)
// into a folder where @modelcontextprotocol/sdk is installed, so that its imports of the SDK
// resolve, and returns the copy's path. The SDK is installed once per machine with npm, into
// $XDG_CACHE_HOME/idemgate (or ~/.cache/idemgate), under a file lock, since test packages run
// in parallel. Node.js and npm are required: the test fails, never skips, without them.
func NodeScript(t testing.TB, path string) string {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the MCP tests need %s (apt-get install nodejs npm): %v", tool, err)
		}
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatalf("cache folder: %v", err)
	}
	dir := filepath.Join(cache, "idemgate", "mcp-sdk-"+MCPSDKVersion)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("mkdir %s: %v", dir, err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatalf("lock: %v", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatalf("flock: %v", err)
	}
	marker := filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk", "package.json")
	if _, err := os.Stat(marker); err != nil {
		if err := os.WriteFile(filepath.Join(dir, "package.json"),
			[]byte(`{"name":"idemgate-mcp-tests","private":true,"type":"module"}`+"\n"), 0o644); err != nil {
			t.Fatalf("package.json: %v", err)
		}
		cmd := exec.Command("npm", "install", "--no-audit", "--no-fund", "--loglevel=error",
			"@modelcontextprotocol/sdk@"+MCPSDKVersion)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm install @modelcontextprotocol/sdk@%s: %v\n%s", MCPSDKVersion, err, out)
		}
	}
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	sum := sha256.Sum256(src)
	dst := filepath.Join(dir, hex.EncodeToString(sum[:6])+"-"+filepath.Base(path))
	if err := os.WriteFile(dst, src, 0o644); err != nil {
		t.Fatalf("write %s: %v", dst, err)
	}
	return dst
}

// StartNode runs `node script args…` until the test ends and returns the first line it prints
// on stdout (a script that serves prints its port there); the rest of its output goes to the
// test's stderr.
func StartNode(t testing.TB, script string, args ...string) string {
	t.Helper()
	cmd := exec.Command("node", append([]string{script}, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("node %s: %v", script, err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("node %s printed nothing: %v", script, err)
	}
	return strings.TrimSpace(line)
}
