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
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/testkit"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/stretchr/testify/require"
)

const testAPIKey = "idg_process_test_key_0123456789abcdef"

var binary string

func TestMain(m *testing.M) { os.Exit(testkit.BuildMain(m, &binary)) }

// server is one running idemgate process.
type server struct {
	*testkit.Proc
	url string
}

// startServer runs the binary with env added to a minimal environment and waits for /healthz.
func startServer(t *testing.T, env ...string) *server {
	t.Helper()
	p := testkit.Serve(t, binary, append([]string{"IDEMGATE_BOOTSTRAP_API_KEY=" + testAPIKey,
		"IDEMGATE_ADMIN_PASSWORD=process-test-password", "IDEMGATE_LOG_FORMAT=json",
		// Generous store deadlines unless a test sets its own (a later entry wins): under -race
		// on a starved 2-core CI machine an SQLite commit can take seconds, and a test that is
		// not about deadlines must not see 503s for it.
		"IDEMGATE_STORE_TIMEOUT=1m", "IDEMGATE_START_TIMEOUT=2m"}, env...)...)
	return &server{Proc: p, url: p.URL()}
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

func TestDatabaseDownAnswers503AndRecovers(t *testing.T) {
	dbURL, drop, err := modeltest.CreatePostgres()
	require.NoError(t, err)
	t.Cleanup(drop)
	px := testkit.NewProxy(t, "")
	proxied := px.Via(t, dbURL)
	s := startServer(t, "DATABASE_URL="+proxied)

	st, body := post(t, s.url+"/v1/acquire", map[string]any{"key": "before-outage", "ttl_seconds": 60})
	require.Equal(t, http.StatusCreated, st, "%v", body)

	px.SetDown(true)
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

	px.SetDown(false)
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

// stallWindow is how long the stall tests keep PostgreSQL stalled at most: every answer they
// wait for must come before it ends, i.e. from idemgate's own deadline and not from the
// database coming back. It is many times IDEMGATE_STORE_TIMEOUT as these tests set it.
const stallWindow = 20 * time.Second

// TestStalledDatabaseAnswers503AndRecovers: PostgreSQL that accepts connections and then sends
// nothing (the TCP connection stays open) must not hold API calls for the length of the stall.
// Each is answered 503 store_unavailable with Retry-After once IDEMGATE_STORE_TIMEOUT passes,
// and the service recovers by itself when the database does. An acquire cut off by the
// deadline may or may not have committed; its retry with the same attempt_id is admitted
// either way.
func TestStalledDatabaseAnswers503AndRecovers(t *testing.T) {
	dbURL, drop, err := modeltest.CreatePostgres()
	require.NoError(t, err)
	t.Cleanup(drop)
	px := testkit.NewProxy(t, "")
	proxied := px.Via(t, dbURL)
	s := startServer(t, "DATABASE_URL="+proxied, "IDEMGATE_STORE_TIMEOUT=1s")

	st, body := post(t, s.url+"/v1/acquire", map[string]any{"key": "before-stall", "ttl_seconds": 60})
	require.Equal(t, http.StatusCreated, st, "%v", body)

	px.SetStalled(true)
	resumed := time.AfterFunc(stallWindow, func() { px.SetStalled(false) })
	defer resumed.Stop()
	type answer struct {
		status int
		body   map[string]any
	}
	acquire := map[string]any{"key": "during-stall", "ttl_seconds": 60, "attempt_id": "attempt-1"}
	answers := make(chan answer, 4)
	for i := 0; i < 4; i++ { // more than one: each waits on its own deadline, not behind another
		go func() {
			st, body := post(t, s.url+"/v1/acquire", acquire)
			answers <- answer{st, body}
		}()
	}
	for i := 0; i < 4; i++ {
		a := <-answers
		require.Equal(t, http.StatusServiceUnavailable, a.status, "%v", a.body)
		require.Equal(t, "store_unavailable", a.body["code"])
		require.Nil(t, a.body["missing_retry_after"], "503 must carry Retry-After")
	}
	resp, err := http.Get(s.url + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	req, _ := http.NewRequest(http.MethodGet, s.url+"/login", nil)
	req.Header.Set("Accept", "text/html")
	req.AddCookie(&http.Cookie{Name: "idemgate_session", Value: "some-session-id"})
	resp, err = client.Do(req)
	require.NoError(t, err)
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "a dashboard page reading its session: %s", page)
	require.Contains(t, resp.Header.Get("Content-Type"), "text/html")
	require.True(t, resumed.Stop(), "every answer above must come before the stall ends")

	px.SetStalled(false)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		st, body = post(t, s.url+"/v1/acquire", acquire)
		if st == http.StatusCreated {
			break
		}
		require.Equal(t, http.StatusServiceUnavailable, st, "%v", body)
		select {
		case <-ctx.Done():
			t.Fatalf("no recovery after the stall ended; last answer %d %v", st, body)
		case <-time.After(100 * time.Millisecond):
		}
	}
	require.EqualValues(t, 1, body["fencing_token"], "one operation for the key, however the cut-off attempt ended")
}

// TestServeAgainstStalledDatabase: started against a PostgreSQL that never answers, serve says
// which database it is connecting to and that it is retrying, then gives up with an error
// once IDEMGATE_START_TIMEOUT has passed, instead of sitting silent.
func TestServeAgainstStalledDatabase(t *testing.T) {
	dbURL, drop, err := modeltest.CreatePostgres()
	require.NoError(t, err)
	t.Cleanup(drop)
	px := testkit.NewProxy(t, "")
	px.SetStalled(true)
	proxied := px.Via(t, dbURL)
	p := testkit.NewProc(binary, testkit.FreeAddr(t), append(testkit.MinimalEnv(), "IDEMGATE_LOG_FORMAT=json",
		"DATABASE_URL="+proxied, "IDEMGATE_STORE_TIMEOUT=1s", "IDEMGATE_START_TIMEOUT=4s")...)
	p.Dir = t.TempDir()
	require.NoError(t, p.Launch())
	t.Cleanup(p.Kill)
	select {
	case <-p.Exited():
		err = p.Wait()
	case <-time.After(stallWindow):
		p.Kill()
		t.Fatalf("serve still starting when the stall window ended; log:\n%s", p.Log.String())
	}
	out := p.Log.String()
	require.Error(t, err, "serve must fail when the database never answers; log:\n%s", out)
	var connecting, retrying, gaveUp bool
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil {
			continue // cobra's "Error: …" line
		}
		switch rec["msg"] {
		case "connecting to database":
			connecting = true
			require.Equal(t, px.Addr(), rec["host"], line)
		case "database not reachable, retrying":
			retrying = true
			require.Equal(t, px.Addr(), rec["host"], line)
		case "cannot start":
			gaveUp = true
			require.Contains(t, rec["err"], px.Addr(), line)
		}
	}
	require.True(t, connecting && retrying && gaveUp, "log:\n%s", out)
}
