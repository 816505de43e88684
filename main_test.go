package main

// Process-level tests: the real binary, real HTTP, real PostgreSQL. They prove the claims
// that a single process cannot: admission is exactly-once across two server processes on one
// database (issue 2 point 3), and a server whose database goes away answers 503
// store_unavailable and recovers by itself (point 5).

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/stretchr/testify/require"
)

const testAPIKey = "idg_process_test_key_0123456789abcdef"

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "idemgate-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "idemgate")
	out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: build idemgate: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// server is one running idemgate process.
type server struct {
	url string
	cmd *exec.Cmd
	log *syncBuffer
}

// syncBuffer collects a process's output; tests may read it while the process writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

// startServer runs the binary with env added to a minimal environment and waits for /healthz.
func startServer(t *testing.T, env ...string) *server {
	t.Helper()
	addr := freeAddr(t)
	cmd := exec.Command(binary, "serve")
	cmd.Dir = t.TempDir()
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "IDEMGATE_ADDR=" + addr,
		"IDEMGATE_BOOTSTRAP_API_KEY=" + testAPIKey, "IDEMGATE_ADMIN_PASSWORD=process-test-password",
		"IDEMGATE_LOG_FORMAT=json"}, env...)
	log := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	require.NoError(t, cmd.Start())
	s := &server{url: "http://" + addr, cmd: cmd, log: log}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait() // also waits for the goroutines copying output into log
		if t.Failed() {
			t.Logf("server %s log:\n%s", addr, log.String())
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(s.url + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("server did not become healthy; log:\n%s", log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

// post sends a JSON body with the test API key and returns the status and decoded body.
func post(t *testing.T, url string, body any) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+testAPIKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, map[string]any{"transport_error": err.Error()}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "" {
		m["missing_retry_after"] = true
	}
	return resp.StatusCode, m
}

func TestTwoProcessesAdmitExactlyOnce(t *testing.T) {
	url, drop, err := modeltest.CreatePostgres()
	require.NoError(t, err)
	t.Cleanup(drop)
	// Both start at once against an empty database: migrations and bootstrap must cope.
	var a, b *server
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); a = startServer(t, "DATABASE_URL="+url) }()
	go func() { defer wg.Done(); b = startServer(t, "DATABASE_URL="+url) }()
	wg.Wait()
	require.NotNil(t, a)
	require.NotNil(t, b)
	servers := []*server{a, b}

	const perRound = 48
	for round := 0; round < 5; round++ {
		key := fmt.Sprintf("two-process-%d", round)
		statuses := make([]int, perRound)
		bodies := make([]map[string]any, perRound)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := 0; i < perRound; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				<-start
				statuses[i], bodies[i] = post(t, servers[i%2].url+"/v1/acquire",
					map[string]any{"key": key, "ttl_seconds": 60, "operation": "charge"})
			}(i)
		}
		close(start)
		wg.Wait()
		admitted, dup := 0, 0
		var opID string
		for i, s := range statuses {
			switch s {
			case http.StatusCreated:
				admitted++
				opID = bodies[i]["operation_id"].(string)
				require.EqualValues(t, 1, bodies[i]["fencing_token"])
			case http.StatusOK:
				dup++
			default:
				t.Fatalf("round %d request %d: status %d body %v", round, i, s, bodies[i])
			}
		}
		require.Equal(t, 1, admitted, "round %d", round)
		require.Equal(t, perRound-1, dup)
		for i, s := range statuses {
			if s == http.StatusOK {
				op := bodies[i]["operation"].(map[string]any)
				require.Equal(t, opID, op["id"], "every duplicate names the one admitted operation")
			}
		}
	}
}

// proxy is a TCP proxy to PostgreSQL that a test can cut and restore, so one server loses its
// database without disturbing other test packages that share the PostgreSQL server.
type proxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	down   bool
	conns  []net.Conn
}

func newProxy(t *testing.T, target string) *proxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{l: l, target: target}
	t.Cleanup(func() { l.Close(); p.setDown(true) })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			if p.down {
				p.mu.Unlock()
				c.Close()
				continue
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				p.mu.Unlock()
				c.Close()
				continue
			}
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	return p
}

func (p *proxy) setDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	if down {
		for _, c := range p.conns {
			c.Close()
		}
		p.conns = nil
	}
}

func TestDatabaseDownAnswers503AndRecovers(t *testing.T) {
	dbURL, drop, err := modeltest.CreatePostgres()
	require.NoError(t, err)
	t.Cleanup(drop)
	px := newProxy(t, "127.0.0.1:5432")
	proxied := strings.Replace(dbURL, "127.0.0.1:5432", px.l.Addr().String(), 1)
	require.NotEqual(t, dbURL, proxied, "the test database URL must point at 127.0.0.1:5432")
	s := startServer(t, "DATABASE_URL="+proxied)

	st, body := post(t, s.url+"/v1/acquire", map[string]any{"key": "before-outage", "ttl_seconds": 60})
	require.Equal(t, http.StatusCreated, st, "%v", body)

	px.setDown(true)
	st, body = post(t, s.url+"/v1/acquire", map[string]any{"key": "during-outage", "ttl_seconds": 60})
	require.Equal(t, http.StatusServiceUnavailable, st, "%v", body)
	require.Equal(t, "store_unavailable", body["code"])
	require.Nil(t, body["missing_retry_after"], "503 must carry Retry-After")
	resp, err := http.Get(s.url + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	resp, err = http.Get(s.url + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "the process itself stays alive")

	px.setDown(false)
	// Recovery needs no restart: poll until the same request is admitted.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		st, body = post(t, s.url+"/v1/acquire", map[string]any{"key": "during-outage", "ttl_seconds": 60})
		if st == http.StatusCreated {
			break
		}
		require.Contains(t, []int{http.StatusServiceUnavailable}, st, "%v", body)
		select {
		case <-ctx.Done():
			t.Fatalf("no recovery after the database came back; last answer %d %v", st, body)
		case <-time.After(100 * time.Millisecond):
		}
	}
	// The refused request wrote nothing: it is admitted now with fencing token 1.
	require.EqualValues(t, 1, body["fencing_token"])
}

// TestRawHTTPEdgeCases needs a real connection: these requests are refused by the HTTP server
// below Fiber's routing (or would be, in-process app.Test fails before answering), and must
// still get problem+json with a code and a request id, and write nothing.
func TestRawHTTPEdgeCases(t *testing.T) {
	s := startServer(t, "IDEMGATE_SQLITE_PATH="+filepath.Join(t.TempDir(), "limit.db"))
	big := map[string]any{"key": "big", "ttl_seconds": 60, "metadata": map[string]any{"x": strings.Repeat("y", 300<<10)}}
	// The server answers 413 as soon as it sees Content-Length and closes the connection; the
	// client may then fail writing the rest of the body and lose the answer (status 0). That is
	// HTTP, not the server: retry until an answer arrives, and check the answer.
	var st int
	var body map[string]any
	for i := 0; i < 10; i++ {
		if st, body = post(t, s.url+"/v1/acquire", big); st != 0 {
			break
		}
	}
	require.Equal(t, http.StatusRequestEntityTooLarge, st, "%v", body)
	require.Equal(t, "payload_too_large", body["code"])

	raw, _ := json.Marshal(big)
	check := func(name string, newReq func() *http.Request, status int, code string) {
		t.Helper()
		resp, err := client.Do(newReq())
		for i := 0; err != nil && i < 10; i++ { // see above: an early 413 can reset the connection
			resp, err = client.Do(newReq())
		}
		require.NoError(t, err, name)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		require.Equal(t, status, resp.StatusCode, "%s: %s", name, b)
		require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"), "%s: %s", name, b)
		var p map[string]any
		require.NoError(t, json.Unmarshal(b, &p), name)
		require.Equal(t, code, p["code"], name)
		require.NotEmpty(t, p["request_id"], name)
	}
	check("chunked body over the limit", func() *http.Request {
		r, _ := http.NewRequest(http.MethodPost, s.url+"/v1/acquire", io.MultiReader(bytes.NewReader(raw)))
		r.ContentLength = -1 // sent as Transfer-Encoding: chunked
		r.Header.Set("Authorization", "Bearer "+testAPIKey)
		return r
	}, http.StatusRequestEntityTooLarge, "payload_too_large")

	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte(`{"key":"gz","ttl_seconds":60,"fingerprint":"` + strings.Repeat("a", 5<<20) + `"}`))
	_ = zw.Close()
	check("gzip body (would inflate past the limit)", func() *http.Request {
		r, _ := http.NewRequest(http.MethodPost, s.url+"/v1/acquire", bytes.NewReader(gz.Bytes()))
		r.Header.Set("Authorization", "Bearer "+testAPIKey)
		r.Header.Set("Content-Encoding", "gzip")
		return r
	}, http.StatusBadRequest, "invalid_request")

	check("header too large", func() *http.Request {
		r, _ := http.NewRequest(http.MethodGet, s.url+"/v1/keys", nil)
		r.Header.Set("Authorization", "Bearer "+strings.Repeat("A", 9000))
		return r
	}, http.StatusRequestHeaderFieldsTooLarge, "invalid_request")

	st, body = post(t, s.url+"/v1/acquire", map[string]any{"key": "big", "ttl_seconds": 60})
	require.Equal(t, http.StatusCreated, st, "the refused body wrote nothing: %v", body)
	st, body = post(t, s.url+"/v1/acquire", map[string]any{"key": "gz", "ttl_seconds": 60})
	require.Equal(t, http.StatusCreated, st, "the refused gzip body wrote nothing: %v", body)
}
