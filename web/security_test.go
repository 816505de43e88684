package web

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/static"
	"github.com/stretchr/testify/require"
)

// TestSecurityHeadersOnEveryResponse: API, operational endpoints, static files, errors and
// dashboard pages all carry nosniff, a Referrer-Policy and a CSP with frame-ancestors 'none';
// dashboard pages keep their own policy, which has no 'unsafe-inline'.
func TestSecurityHeadersOnEveryResponse(t *testing.T) {
	eachServer(t, func(t *testing.T, s *Server) {
		c := newTenantClient(t, s)
		anon := &apiClient{t: t, s: s}
		cases := []struct {
			name   string
			res    func() apiResult
			status int
			page   bool // a dashboard page: the dashboard CSP and same-origin referrers
		}{
			{"healthz", func() apiResult { return anon.do("GET", "/healthz", nil) }, 200, false},
			{"readyz", func() apiResult { return anon.do("GET", "/readyz", nil) }, 200, false},
			{"metrics", func() apiResult { return anon.do("GET", "/metrics", nil) }, 200, false},
			{"openapi", func() apiResult { return anon.do("GET", "/openapi.json", nil) }, 200, false},
			{"acquire admitted", func() apiResult { return acquire(c, "headers-key", nil) }, 201, false},
			{"acquire invalid", func() apiResult { return c.do("POST", "/v1/acquire", `{"key":""}`) }, 400, false},
			{"keys unauthenticated", func() apiResult { return anon.do("GET", "/v1/keys", nil) }, 401, false},
			{"unknown path", func() apiResult { return anon.do("GET", "/no/such/path", nil) }, 404, false},
			{"wrong method", func() apiResult { return anon.do("DELETE", "/healthz", nil) }, 405, false},
			{"static asset", func() apiResult { return anon.do("GET", static.URL("app.css"), nil) }, 200, false},
			{"login page", func() apiResult { return browser(t, s, "/login") }, 200, true},
			{"dashboard redirect", func() apiResult { return browser(t, s, "/keys") }, 303, true},
			{"dashboard error page", func() apiResult { return browser(t, s, "/no/such/page") }, 404, false},
		}
		for _, tc := range cases {
			res := tc.res()
			require.Equal(t, tc.status, res.status, "%s: %s", tc.name, res.raw)
			h := res.header
			require.Equal(t, "nosniff", h.Get("X-Content-Type-Options"), tc.name)
			require.NotEmpty(t, h.Get("Referrer-Policy"), tc.name)
			csp := h.Get("Content-Security-Policy")
			require.Contains(t, csp, "frame-ancestors 'none'", tc.name)
			require.NotContains(t, csp, "unsafe-inline", tc.name)
			require.NotContains(t, csp, "unsafe-eval", tc.name)
			require.Equal(t, "DENY", h.Get("X-Frame-Options"), tc.name)
			if tc.page {
				require.Equal(t, contentSecurityPolicy, csp, "%s: the page policy is not overwritten", tc.name)
				require.Equal(t, "same-origin", h.Get("Referrer-Policy"), tc.name)
			} else if strings.HasPrefix(h.Get("Content-Type"), "application/") {
				require.Equal(t, apiContentSecurityPolicy, csp, tc.name)
				require.Equal(t, "no-referrer", h.Get("Referrer-Policy"), tc.name)
			}
		}
	})
}

// browser requests a dashboard path as a browser does, without following redirects.
func browser(t *testing.T, s *Server, path string) apiResult {
	t.Helper()
	req := httptest.NewRequest("GET", path, nil)
	req.Header.Set("Accept", "text/html")
	resp, err := s.app.Test(req, -1)
	require.NoError(t, err)
	defer resp.Body.Close()
	return apiResult{status: resp.StatusCode, header: resp.Header}
}

// TestAPIAuthFailuresRateLimited: after authFailures refused keys from one address, that
// address's failures answer 429 rate_limited with Retry-After until the window ends, while every
// valid key from the same address still gets through (issue 9: one misconfigured service
// behind a NAT or proxy locked out every tenant there). Successes never count.
func TestAPIAuthFailuresRateLimited(t *testing.T) {
	eachServer(t, func(t *testing.T, s *Server) {
		now := time.Now()
		s.authFails.now = func() time.Time { return now }
		good := newTenantClient(t, s)
		bad := &apiClient{t: t, s: s, key: "idg_not_a_real_key_at_all_000000"}
		anon := &apiClient{t: t, s: s}

		for i := 0; i < authFailures-1; i++ {
			if i%2 == 0 {
				problemOf(t, bad.do("GET", "/v1/keys", nil), 401, "unauthorized")
			} else {
				problemOf(t, anon.do("POST", "/v1/acquire", map[string]any{"key": "a", "ttl_seconds": 1}), 401, "unauthorized")
			}
			// Interleaved successes and the client's own mistakes do not count.
			require.Equal(t, 201, acquire(good, fmt.Sprintf("busy-%d", i), nil).status)
			problemOf(t, good.do("POST", "/v1/acquire", `{"key":""}`), 400, "invalid_request")
		}
		for i := 0; i < 3*authFailures; i++ {
			require.Equal(t, 200, good.do("GET", "/v1/keys", nil).status, "successes never reach the limit")
		}

		problemOf(t, bad.do("GET", "/v1/keys", nil), 401, "unauthorized") // the limit-th failure
		res := problemOf(t, bad.do("GET", "/v1/keys", nil), 429, "rate_limited")
		retry, err := strconv.Atoi(res.header.Get("Retry-After"))
		require.NoError(t, err, "Retry-After: %q", res.header.Get("Retry-After"))
		require.Equal(t, int(authFailureWindow/time.Second), retry)
		require.NotEmpty(t, res.body["request_id"])
		require.Equal(t, "nosniff", res.header.Get("X-Content-Type-Options"))
		// Another bad key, never seen before, is limited too; so is a request with none.
		other := &apiClient{t: t, s: s, key: "idg_another_wrong_key_111111111"}
		problemOf(t, other.do("GET", "/v1/keys", nil), 429, "rate_limited")
		problemOf(t, anon.do("GET", "/v1/keys", nil), 429, "rate_limited")

		// Valid keys from the limited address are not refused for others' failures: the one in
		// use, and one created (so never seen, not in any cache) while the address is limited.
		require.Equal(t, 201, acquire(good, "while-limited", nil).status)
		fresh := newTenantClient(t, s)
		require.Equal(t, 201, acquire(fresh, "fresh-while-limited", nil).status)
		require.Equal(t, 200, fresh.do("GET", "/v1/keys/fresh-while-limited", nil).status)
		// Operational endpoints and the dashboard are not behind API-key auth.
		require.Equal(t, 200, anon.do("GET", "/healthz", nil).status)

		now = now.Add(authFailureWindow/2 + time.Second)
		res = problemOf(t, bad.do("GET", "/v1/keys", nil), 429, "rate_limited")
		require.Equal(t, strconv.Itoa(int(authFailureWindow/2/time.Second)-1), res.header.Get("Retry-After"))

		// The window ends: the bad key gets a fresh count.
		now = now.Add(authFailureWindow / 2)
		require.Equal(t, 201, acquire(good, "after-window", nil).status)
		problemOf(t, bad.do("GET", "/v1/keys", nil), 401, "unauthorized")
	})
}

// TestAuthFailureLimiterPerAddress: addresses are counted apart; a limited address's bad keys
// that already failed are refused without being looked up again, fresh ones are looked up (they
// may be valid); the tables are bounded.
func TestAuthFailureLimiterPerAddress(t *testing.T) {
	now := time.Now()
	l := newAuthFailureLimiter(nil)
	l.now = func() time.Time { return now }
	for i := 0; i < authFailures; i++ {
		_, known := l.knownBad("10.0.0.1", "bad-1")
		require.False(t, known, "below the limit every key is looked up")
		require.Equal(t, i == authFailures-1, l.fail("10.0.0.1", "bad-1"), "reaching the limit is reported once")
	}
	_, limited := l.limited("10.0.0.1")
	require.True(t, limited)
	wait, known := l.knownBad("10.0.0.1", "bad-1")
	require.True(t, known, "a bad key that failed from a limited address is refused from memory")
	require.Equal(t, authFailureWindow, wait)
	_, known = l.knownBad("10.0.0.1", "maybe-valid")
	require.False(t, known, "a key the address has not failed with is looked up")
	_, known = l.knownBad("10.0.0.2", "bad-1")
	require.False(t, known, "another address is not affected")
	_, limited = l.limited("10.0.0.2")
	require.False(t, limited)
	require.False(t, l.fail("10.0.0.1", "bad-2"), "already reported in this window")

	for i := 0; i < 2*maxBadKeysPerAddr; i++ {
		l.fail("10.0.0.1", fmt.Sprintf("spray-%d", i))
	}
	l.mu.Lock()
	require.LessOrEqual(t, len(l.addrs["10.0.0.1"].bad), maxBadKeysPerAddr)
	l.mu.Unlock()

	for i := 0; i < maxTrackedAddrs+10; i++ {
		l.fail(fmt.Sprintf("addr-%d", i), "k")
	}
	l.mu.Lock()
	n := len(l.addrs)
	l.mu.Unlock()
	require.LessOrEqual(t, n, maxTrackedAddrs)
}

// TestAmbiguousContentLengthRefused: two different Content-Length headers are a 400 and the
// connection is closed, with nothing acquired (RFC 9112 §6.3; a proxy reading the first and
// idemgate the last would disagree about where the request ends). Two equal ones are harmless.
func TestAmbiguousContentLengthRefused(t *testing.T) {
	s := newTestServer(t, dbs.Postgres)
	c := newTenantClient(t, s)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	send := func(key string, lengths ...int) (*http.Response, map[string]any) {
		body := `{"key":"` + key + `","ttl_seconds":60}`
		conn, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		req := "POST /v1/acquire HTTP/1.1\r\nHost: idemgate\r\nAuthorization: Bearer " + c.key + "\r\n"
		for _, n := range lengths {
			req += "Content-Length: " + strconv.Itoa(n) + "\r\n"
		}
		_, err = io.WriteString(conn, req+"\r\n"+body)
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err)
		defer resp.Body.Close()
		var p map[string]any
		raw, _ := io.ReadAll(resp.Body)
		_ = json.Unmarshal(raw, &p)
		return resp, p
	}
	n := len(`{"key":"smuggle","ttl_seconds":60}`)
	resp, p := send("smuggle", 5, n)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%v", p)
	require.Equal(t, "invalid_request", p["code"])
	require.True(t, resp.Close, "the connection is closed after the answer")
	problemOf(t, c.do("GET", "/v1/keys/smuggle", nil), 404, "not_found")

	n = len(`{"key":"twice","ttl_seconds":60}`)
	resp, p = send("twice", n, n)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%v", p)
}

// TestContentLengthWithChunkedRefused: Content-Length together with Transfer-Encoding is a 400
// and the connection is closed (RFC 9112 §6.1: the server must close the connection after such
// a request, since a proxy that honours Content-Length sees another boundary than one that
// honours the chunked framing). The request behind it on the same connection is never answered,
// and the smuggled acquire wrote nothing.
func TestContentLengthWithChunkedRefused(t *testing.T) {
	s := newTestServer(t, dbs.Postgres)
	c := newTenantClient(t, s)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })

	for _, te := range []string{"chunked", "gzip, chunked", "Chunked"} {
		conn, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		body := `{"key":"te-cl-smuggle","ttl_seconds":60}`
		chunked := fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(body), body)
		first := "POST /v1/acquire HTTP/1.1\r\nHost: idemgate\r\nAuthorization: Bearer " + c.key + "\r\n" +
			"Content-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(chunked)) + "\r\n" +
			"Transfer-Encoding: " + te + "\r\n\r\n" + chunked
		second := "GET /v1/keys/te-cl-pipelined HTTP/1.1\r\nHost: idemgate\r\nAuthorization: Bearer " + c.key + "\r\n\r\n"
		_, err = io.WriteString(conn, first+second)
		require.NoError(t, err)
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
		r := bufio.NewReader(conn)
		resp, err := http.ReadResponse(r, nil)
		require.NoError(t, err)
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var p map[string]any
		_ = json.Unmarshal(raw, &p)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "Transfer-Encoding %q: %s", te, raw)
		require.Equal(t, "invalid_request", p["code"])
		require.True(t, resp.Close, "the connection is closed after the answer")
		next, err := http.ReadResponse(r, nil)
		if err == nil {
			next.Body.Close()
			t.Fatalf("Transfer-Encoding %q: the pipelined request was answered %d", te, next.StatusCode)
		}
	}
	problemOf(t, c.do("GET", "/v1/keys/te-cl-smuggle", nil), 404, "not_found")
}
