package web

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/idemgate/idemgate/internal/testkit"
	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/services"
	"github.com/idemgate/idemgate/web/logging"
	"github.com/stretchr/testify/require"
)

// logCapture collects a server's JSON log lines.
type logCapture struct{ testkit.Log }

// records parses every line logged so far.
func (l *logCapture) records(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(l.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var rec map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &rec), "not a JSON log line: %s", sc.Text())
		out = append(out, rec)
	}
	return out
}

// newCapturingServer is newTestServer logging JSON at Debug, through logging.NewHandler as
// cli/ does, into the returned capture.
func newCapturingServer(t *testing.T, db *models.DB) (*Server, *logCapture) {
	t.Helper()
	lc := &logCapture{}
	log := slog.New(logging.NewHandler(slog.NewJSONHandler(lc, &slog.HandlerOptions{Level: slog.LevelDebug})))
	return newLoggingTestServer(t, db, log), lc
}

// requestLog is what one request left behind: its response and the log lines written while it
// was handled.
type requestLog struct {
	status int
	header http.Header
	body   string
	lines  []map[string]any
}

// send makes one request to s and returns it with the lines logged meanwhile (the server is
// used by one goroutine, so those are the request's own).
func send(t *testing.T, s *Server, lc *logCapture, req *http.Request) requestLog {
	t.Helper()
	before := len(lc.records(t))
	resp, err := s.app.Test(req, -1)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return requestLog{status: resp.StatusCode, header: resp.Header, body: string(body), lines: lc.records(t)[before:]}
}

// requireOneRequestID asserts that the response names one request id, in X-Request-ID and in
// its body (problem+json member or error page), that every line logged while handling it
// carries that id, and that exactly one of them is the access line. It returns the id and
// the lines by message.
func requireOneRequestID(t *testing.T, r requestLog) (string, map[string]map[string]any) {
	t.Helper()
	rid := r.header.Get("X-Request-ID")
	require.NotEmpty(t, rid, "X-Request-ID")
	if strings.HasPrefix(r.header.Get("Content-Type"), "application/problem+json") {
		var p map[string]any
		require.NoError(t, json.Unmarshal([]byte(r.body), &p))
		require.Equal(t, rid, p["request_id"], r.body)
	} else if r.status >= 400 {
		require.Contains(t, r.body, `data-testid="error-request-id">`+rid+`<`, "the error page names the request")
	}
	require.NotEmpty(t, r.lines, "the request logged nothing")
	byMsg := map[string]map[string]any{}
	access := 0
	for _, l := range r.lines {
		require.Equal(t, rid, l["request_id"], "a line of the request without its id: %v", l)
		msg := l["msg"].(string)
		if msg == "request" {
			access++
			require.EqualValues(t, r.status, l["status"], "the access line has the status sent")
		}
		byMsg[msg] = l
	}
	require.Equal(t, 1, access, "one access line per request: %v", r.lines)
	return rid, byMsg
}

func jsonRequest(method, path, body, apiKey string) *http.Request {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	return req
}

// TestEveryLogLineCarriesTheRequestID (issue 5 point 5): for requests that log in web and in
// services, that fail inside (a panic, a closed database) and that are refused on every error
// path (404, 405, 413, 429 on the API and at sign-in, 403 CSRF), every line logged while
// handling the request carries the request id that its X-Request-ID header and its
// problem+json body or error page show, and each request has exactly one access line.
func TestEveryLogLineCarriesTheRequestID(t *testing.T) {
	dbs.Each(t, func(t *testing.T, db *models.DB) {
		ctx := context.Background()
		s, lc := newCapturingServer(t, db)
		s.app.Get("/test/panic", func(*fiber.Ctx) error { panic("handler exploded") })

		// A panic: 500 problem, the panic with its stack, the failure and the access line.
		r := send(t, s, lc, jsonRequest("GET", "/test/panic", "", ""))
		require.Equal(t, http.StatusInternalServerError, r.status, r.body)
		_, lines := requireOneRequestID(t, r)
		require.Contains(t, lines["panic while handling a request"]["stack"], "runtime/debug.Stack")
		require.Equal(t, "ERROR", lines["request failed"]["level"])
		require.NotContains(t, r.body, "exploded", "the panic stays in the log")

		// Refusals of the HTTP layer, each a problem+json with the id.
		for _, c := range []struct {
			name   string
			req    *http.Request
			status int
			route  string
		}{
			{"unknown route", jsonRequest("GET", "/v2/nothing-here", "", ""), 404, "unmatched"},
			{"method not allowed", jsonRequest("DELETE", "/healthz", "", ""), 405, "unmatched"},
			// Refused by the /v1 group's authentication, before its own route.
			{"unauthorized", jsonRequest("POST", "/v1/acquire", `{}`, "idg_wrong"), 401, "/v1"},
		} {
			r := send(t, s, lc, c.req)
			require.Equal(t, c.status, r.status, "%s: %s", c.name, r.body)
			_, lines := requireOneRequestID(t, r)
			require.Equal(t, c.route, lines["request"]["route"], c.name)
		}

		// A body over the limit is refused by the HTTP server before any middleware; the
		// error handler gives it an id and logs its access line. Only a real connection
		// shows it (app.Test refuses to send such a request).
		r = sendOversized(t, s, lc, "/v1/acquire", 300<<10)
		require.Equal(t, http.StatusRequestEntityTooLarge, r.status, r.body)
		_, lines = requireOneRequestID(t, r)
		require.Equal(t, "unmatched", lines["request"]["route"])

		// Services log with the request's context: an admin creates an API key.
		b := newDashBrowser(t, s)
		b.mustLogin(dashOperator(t, db, services.RoleAdmin, nil))
		page := b.get("/admin")
		r = send(t, s, lc, formRequest(b, "/admin/api-keys",
			url.Values{"tenant": {"log-" + dashRandom()}, "label": {"x"}, "_csrf": {page.csrf(t)}}))
		require.Less(t, r.status, 400, r.body)
		_, lines = requireOneRequestID(t, r)
		require.Contains(t, lines, "API key created", "the services line is the request's")
		require.Equal(t, "/admin/api-keys", lines["request"]["route"])

		// CSRF: a form post without the token is refused with an error page naming the id.
		r = send(t, s, lc, formRequest(newDashBrowser(t, s), "/login", url.Values{"username": {"x"}, "password": {"y"}}))
		require.Equal(t, http.StatusForbidden, r.status)
		_, lines = requireOneRequestID(t, r)
		require.Contains(t, lines, "dashboard form refused")

		// Rate limits, on a server of its own that has counted no failure yet.
		limited, llc := newCapturingServer(t, db)
		// Sign-in: the 11th failure in a minute is 429, logged as such.
		guest := newDashBrowser(t, limited)
		token := guest.get("/login").csrf(t)
		for i := 0; i < loginAttempts; i++ {
			require.Equal(t, http.StatusUnauthorized, guest.post("/login",
				url.Values{"username": {"nobody"}, "password": {"wrong-password"}, "_csrf": {token}}).status)
		}
		r = send(t, limited, llc, formRequest(guest, "/login",
			url.Values{"username": {"nobody"}, "password": {"wrong-password"}, "_csrf": {token}}))
		require.Equal(t, http.StatusTooManyRequests, r.status)
		_, lines = requireOneRequestID(t, r)
		require.Contains(t, lines, "dashboard sign-in rate limited")
		// API keys: the failure that reaches the limit logs it; the next request is 429.
		for i := 0; i < authFailures-1; i++ {
			require.Equal(t, http.StatusUnauthorized, send(t, limited, llc, jsonRequest("GET", "/v1/keys", "", "idg_wrong")).status)
		}
		r = send(t, limited, llc, jsonRequest("GET", "/v1/keys", "", "idg_wrong"))
		require.Equal(t, http.StatusUnauthorized, r.status)
		_, lines = requireOneRequestID(t, r)
		require.Contains(t, lines, "API authentication failures rate limited")
		r = send(t, limited, llc, jsonRequest("GET", "/v1/keys", "", "idg_wrong"))
		require.Equal(t, http.StatusTooManyRequests, r.status)
		requireOneRequestID(t, r)

		// A store error inside services: a server whose database is closed under it.
		closing := closedLater(t, db.Dialect)
		broken, blc := newCapturingServer(t, closing)
		secret, err := broken.accounts.CreateAPIKey(ctx, services.Installation(), "broken-"+dashRandom(), "x", "")
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, send(t, broken, blc, jsonRequest("GET", "/v1/keys", "", secret)).status)
		// That request records the key's use in the background; let it finish first, or it
		// fails on the closed database and logs (with its own request id) during the next.
		require.Eventually(t, func() bool {
			var n int64
			err := closing.Model(&models.APIKey{}).Where("prefix = ? AND last_used_at IS NOT NULL", secret[:12]).Count(&n).Error
			return err == nil && n == 1
		}, 5*time.Second, 10*time.Millisecond)
		// The server's Awaiter checks its LISTEN connection with a notification sent through
		// the pool; closed mid-check, that fails and logs (without a request id) during the
		// next request. Once it listens, its connection is its own.
		if db.Dialect == models.Postgres {
			require.Eventually(t, broken.awaiter.Listening, 10*time.Second, 10*time.Millisecond)
		}
		require.NoError(t, closing.Close())
		// The API key stays cached for a second, so the request gets as far as the acquire.
		r = send(t, broken, blc, jsonRequest("POST", "/v1/acquire", `{"key":"k","ttl_seconds":60}`, secret))
		require.Equal(t, http.StatusInternalServerError, r.status, r.body)
		_, lines = requireOneRequestID(t, r)
		require.Contains(t, lines["request failed"]["err"], "acquire")
	})
}

// TestAccessLog: one line per request with method, route, path without the query string,
// status, duration, bytes and address; probes, scrapes and assets only at Debug; nothing from
// headers, so no API key, cookie or password.
func TestAccessLog(t *testing.T) {
	s, lc := newCapturingServer(t, dbs.SQLite)
	c := newTenantClient(t, s)
	req := jsonRequest("POST", "/v1/acquire", `{"key":"access/log key","ttl_seconds":60}`, c.key)
	req.URL.RawQuery = "owner_token=ot_from-a-careless-client"
	r := send(t, s, lc, req)
	require.Equal(t, http.StatusCreated, r.status, r.body)
	_, lines := requireOneRequestID(t, r)
	line := lines["request"]
	require.Equal(t, "INFO", line["level"])
	require.Equal(t, "POST", line["method"])
	require.Equal(t, "/v1/acquire", line["route"])
	require.Equal(t, "/v1/acquire", line["path"], "no query string")
	require.EqualValues(t, 201, line["status"])
	require.EqualValues(t, len(r.body), line["bytes"])
	require.Greater(t, line["duration_ms"], 0.0)
	require.NotEmpty(t, line["ip"])
	for _, l := range r.lines {
		raw, _ := json.Marshal(l)
		require.NotContains(t, string(raw), c.key, "the API key is logged")
		require.NotContains(t, string(raw), "ot_from-a-careless-client", "the query string is logged")
	}

	r = send(t, s, lc, httptest.NewRequest("GET", "/v1/keys/"+url.PathEscape("a/b c"), nil))
	_, lines = requireOneRequestID(t, r)
	require.Equal(t, "/v1/keys/a%2Fb%20c", lines["request"]["path"], "the path as sent, still escaped")

	for _, path := range []string{"/healthz", "/readyz", "/metrics", "/static/app.css"} {
		r := send(t, s, lc, httptest.NewRequest("GET", path, nil))
		require.Less(t, r.status, 400, path)
		_, lines := requireOneRequestID(t, r)
		require.Equal(t, "DEBUG", lines["request"]["level"], path)
	}
}

// TestInboundRequestID: a client's X-Request-ID is used when it is short and made of safe
// characters, so the caller can find its request in our logs; anything else (too long,
// spaces, quotes, non-ASCII) is replaced by a fresh id, so a client cannot forge or bloat log
// lines.
func TestInboundRequestID(t *testing.T) {
	s, lc := newCapturingServer(t, dbs.SQLite)
	for _, id := range []string{"0b6e7c1a-5d2f-4c61-9d7a-3f1e2b4c5d6e", "req_7f3a:retry.2", strings.Repeat("a", logging.MaxRequestIDLen)} {
		req := jsonRequest("GET", "/v2/nothing", "", "")
		req.Header.Set("X-Request-ID", id)
		r := send(t, s, lc, req)
		got, _ := requireOneRequestID(t, r)
		require.Equal(t, id, got, "a safe id is honoured")
	}
	for _, id := range []string{strings.Repeat("a", logging.MaxRequestIDLen+1), "two words", `quote"d`, "naïve", "a\tb", "{}"} {
		req := jsonRequest("GET", "/v2/nothing", "", "")
		req.Header.Set("X-Request-ID", id)
		r := send(t, s, lc, req)
		got, _ := requireOneRequestID(t, r)
		require.NotEqual(t, id, got, "an unsafe id is replaced")
		require.True(t, logging.ValidRequestID(got))
	}
}

// formRequest is a browser's form post with b's cookies.
func formRequest(b *dashBrowser, path string, form url.Values) *http.Request {
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "text/html")
	for _, c := range b.cookies {
		req.AddCookie(&http.Cookie{Name: c.Name, Value: c.Value})
	}
	return req
}

// closedLater opens a fresh database of dialect for a test that will close it under a server.
func closedLater(t *testing.T, dialect models.Dialect) *models.DB {
	t.Helper()
	ctx := context.Background()
	opts := models.OpenOptions{SQLitePath: filepath.Join(t.TempDir(), "closed.db")}
	if dialect == models.Postgres {
		opts = models.OpenOptions{DatabaseURL: dbs.PostgresURL, MaxConns: 2}
	}
	db, err := models.Open(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() }) // closing twice is harmless
	if dialect == models.SQLite {
		_, err = models.Migrate(ctx, db, nil)
		require.NoError(t, err)
	}
	return db
}

// sendOversized sends a POST to path on s, served on a real loopback listener, announcing a
// body of size bytes but sending only its headers: the HTTP server refuses it on
// Content-Length alone (sending the body too could meet a reset connection). It returns the
// answer with the lines logged meanwhile.
func sendOversized(t *testing.T, s *Server, lc *logCapture, path string, size int) requestLog {
	t.Helper()
	before := len(lc.records(t))
	status, header, body := postOversized(t, s, path, size)
	return requestLog{status: status, header: header, body: body, lines: lc.records(t)[before:]}
}

// postOversized serves s on a loopback listener and sends it the headers of a POST to path
// announcing size bytes (app.Test cannot: it fails on the body limit instead of answering).
func postOversized(t *testing.T, s *Server, path string, size int) (int, http.Header, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	conn, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	_, err = fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: idemgate\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", path, size)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(raw)
}
