package web

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/services"
	"github.com/idemgate/idemgate/web/logging"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// tracedDB opens the package database of db's dialect again, with its statements traced to tp
// (models.OpenOptions.TracerProvider), as cli/ opens it when tracing is on.
func tracedDB(t *testing.T, db *models.DB, tp trace.TracerProvider) *models.DB {
	t.Helper()
	opts := models.OpenOptions{SQLitePath: dbs.SQLitePath, TracerProvider: tp}
	if db.Dialect == models.Postgres {
		opts = models.OpenOptions{DatabaseURL: dbs.PostgresURL, MaxConns: 8, TracerProvider: tp}
	}
	traced, err := models.Open(context.Background(), opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = traced.Close() })
	return traced
}

// tracedServer is a server over db (opened again, traced) whose spans go to a span recorder,
// logging JSON through logging.NewHandler into the returned capture.
func tracedServer(t *testing.T, db *models.DB, traceKeys bool) (*Server, *tracetest.SpanRecorder, *logCapture) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	lc := &logCapture{}
	cfg := testConfig(t, tracedDB(t, db, tp), newJSONLogger(lc))
	cfg.TracerProvider, cfg.TraceKeys = tp, traceKeys
	return New(cfg), rec, lc
}

// newJSONLogger logs JSON at Debug through logging.NewHandler, as cli/ does, into lc.
func newJSONLogger(lc *logCapture) *slog.Logger {
	return slog.New(logging.NewHandler(slog.NewJSONHandler(lc, &slog.HandlerOptions{Level: slog.LevelDebug})))
}

// spanAttrs is a span's attributes by key.
func spanAttrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// serverSpans are the recorded server spans, in the order they ended.
func serverSpans(rec *tracetest.SpanRecorder) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.SpanKind() == trace.SpanKindServer {
			out = append(out, s)
		}
	}
	return out
}

// lastServerSpan is the server span of the latest request.
func lastServerSpan(t *testing.T, rec *tracetest.SpanRecorder) sdktrace.ReadOnlySpan {
	t.Helper()
	ss := serverSpans(rec)
	require.NotEmpty(t, ss, "no server span recorded")
	return ss[len(ss)-1]
}

// TestTracingRequestSpans: with a tracer provider, every request gets a server span named
// "METHOD route", continuing the caller's W3C traceparent, with the decision's attributes
// (decision, tenant, fencing token, operation id, key hash, problem code); the statements of
// the request are client spans of the same trace under it; the access log line carries the
// trace and span ids; the latency histogram has the trace id as exemplar in OpenMetrics. On
// PostgreSQL (otelpgx) and SQLite (otelsql).
func TestTracingRequestSpans(t *testing.T) {
	dbs.Each(t, func(t *testing.T, db *models.DB) {
		s, rec, lc := tracedServer(t, db, false)
		c := newTenantClient(t, s)
		key := "trace-" + dashRandom()

		const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
		body := fmt.Sprintf(`{"key":%q,"ttl_seconds":60,"fingerprint":"fp-1"}`, key)
		req := httptest.NewRequest(http.MethodPost, "/v1/acquire", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+c.key)
		req.Header.Set("traceparent", "00-"+traceID+"-"+parentID+"-01")
		got := send(t, s, lc, req)
		require.Equal(t, http.StatusCreated, got.status, got.body)
		var admitted map[string]any
		require.NoError(t, json.Unmarshal([]byte(got.body), &admitted))

		span := lastServerSpan(t, rec)
		require.Equal(t, "POST /v1/acquire", span.Name())
		require.Equal(t, traceID, span.SpanContext().TraceID().String(), "traceparent not continued")
		require.Equal(t, parentID, span.Parent().SpanID().String())
		require.True(t, span.Parent().IsRemote())
		a := spanAttrs(span)
		require.Equal(t, "admitted", a[attrDecision].AsString())
		require.Equal(t, principalOf(t, s, c).TenantName, a[attrTenant].AsString())
		require.EqualValues(t, admitted["fencing_token"], a[attrFencingToken].AsInt64())
		require.Equal(t, admitted["operation_id"], a[attrOperationID].AsString())
		require.Equal(t, keyHash(key), a[attrKeyHash].AsString())
		require.NotContains(t, a, attrKey, "raw key recorded without IDEMGATE_TRACE_KEYS")
		require.Equal(t, "POST", a["http.request.method"].AsString())
		require.Equal(t, "/v1/acquire", a["http.route"].AsString())
		require.EqualValues(t, 201, a["http.response.status_code"].AsInt64())
		require.NotContains(t, a, attribute.Key("url.path"))

		// The request's statements: client spans of the same trace, under the server span.
		var dbSpans int
		for _, d := range rec.Ended() {
			if d.SpanKind() != trace.SpanKindClient || d.SpanContext().TraceID() != span.SpanContext().TraceID() {
				continue
			}
			dbSpans++
			require.True(t, d.Parent().IsValid())
			if q, ok := spanAttrs(d)["db.query.text"]; ok {
				require.NotEmpty(t, q.AsString())
			}
		}
		require.NotZero(t, dbSpans, "no database span in the request's trace")

		// The access line names the trace and the server span.
		var access map[string]any
		for _, l := range got.lines {
			if l["msg"] == "request" {
				access = l
			}
		}
		require.NotNil(t, access, "no access line: %v", got.lines)
		require.Equal(t, traceID, access[logging.TraceIDKey])
		require.Equal(t, span.SpanContext().SpanID().String(), access[logging.SpanIDKey])

		// A duplicate and a conflict are decisions too; the conflict's problem code is there.
		c.do("POST", "/v1/acquire", map[string]any{"key": key, "ttl_seconds": 60, "fingerprint": "fp-1"})
		require.Equal(t, "duplicate", spanAttrs(lastServerSpan(t, rec))[attrDecision].AsString())
		problemOf(t, c.do("POST", "/v1/acquire", map[string]any{"key": key, "ttl_seconds": 60, "fingerprint": "fp-2"}),
			422, "fingerprint_mismatch")
		a = spanAttrs(lastServerSpan(t, rec))
		require.Equal(t, "conflict", a[attrDecision].AsString())
		require.Equal(t, "fingerprint_mismatch", a[attrProblemCode].AsString())

		// Outcome and release name the operation and their decision.
		opID, owner := admitted["operation_id"].(string), admitted["owner_token"].(string)
		res := c.do("POST", "/v1/operations/"+opID+"/outcome", map[string]any{"owner_token": owner, "status": "failed"})
		require.Equal(t, 200, res.status, res.raw)
		a = spanAttrs(lastServerSpan(t, rec))
		require.Equal(t, "POST /v1/operations/:id/outcome", lastServerSpan(t, rec).Name())
		require.Equal(t, "recorded", a[attrDecision].AsString())
		require.Equal(t, opID, a[attrOperationID].AsString())
		problemOf(t, c.do("POST", "/v1/release", map[string]any{"key": key, "owner_token": "ot_wrong"}), 409, "not_owner")
		require.Equal(t, "not_owner", spanAttrs(lastServerSpan(t, rec))[attrDecision].AsString())

		// A batch counts its items' decisions.
		res = c.do("POST", "/v1/acquire:batch", map[string]any{"items": []any{
			map[string]any{"key": key + "-b", "ttl_seconds": 60}, map[string]any{"key": key + "-b", "ttl_seconds": 60},
			map[string]any{"ttl_seconds": 60}}})
		require.Equal(t, 200, res.status, res.raw)
		a = spanAttrs(lastServerSpan(t, rec))
		require.Equal(t, "POST /v1/acquire:batch", lastServerSpan(t, rec).Name())
		require.EqualValues(t, 3, a[attrBatchItems].AsInt64())
		require.EqualValues(t, 1, a["idemgate.decision.admitted"].AsInt64())
		require.EqualValues(t, 1, a["idemgate.decision.duplicate"].AsInt64())
		require.EqualValues(t, 1, a["idemgate.decision.invalid"].AsInt64())

		// Exemplars: the OpenMetrics scrape shows the acquire's trace id on its bucket.
		mreq := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		mreq.Header.Set("Accept", "application/openmetrics-text; version=1.0.0; charset=utf-8")
		resp, err := s.app.Test(mreq, -1)
		require.NoError(t, err)
		raw, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.Contains(t, resp.Header.Get("Content-Type"), "application/openmetrics-text")
		var exemplar bool
		for _, line := range strings.Split(string(raw), "\n") {
			if strings.HasPrefix(line, "idemgate_http_request_duration_seconds_bucket{") &&
				strings.Contains(line, `route="/v1/acquire"`) && strings.Contains(line, `# {trace_id="`+traceID+`"}`) {
				exemplar = true
			}
		}
		require.True(t, exemplar, "no exemplar with the acquire's trace id:\n%s", raw)
	})
}

// principalOf is the principal of c's API key.
func principalOf(t *testing.T, s *Server, c *apiClient) services.Principal {
	t.Helper()
	p, err := s.auth.Authenticate(context.Background(), c.key)
	require.NoError(t, err)
	return p
}

// TestTracingNeverRecordsSecrets: across a whole flow — acquire, duplicate, outcome, release,
// reads of the key, a failed and a successful dashboard sign-in, a page and sign-out — no
// attribute or event of any span (server or database) holds the API key, an owner token, the
// operator's password, the session cookie or the raw idempotency key; with TraceKeys the key
// is recorded (idemgate.key, url.path) and the secrets still are not.
func TestTracingNeverRecordsSecrets(t *testing.T) {
	for _, db := range dbs.All() {
		for _, traceKeys := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/trace_keys=%v", db.Dialect, traceKeys), func(t *testing.T) {
				s, rec, _ := tracedServer(t, db, traceKeys)
				c := newTenantClient(t, s)
				key := "secret-key-" + dashRandom()
				acq := c.do("POST", "/v1/acquire", map[string]any{"key": key, "ttl_seconds": 60})
				require.Equal(t, 201, acq.status, acq.raw)
				owner, opID := acq.body["owner_token"].(string), acq.body["operation_id"].(string)
				c.do("POST", "/v1/acquire", map[string]any{"key": key, "ttl_seconds": 60})
				c.do("POST", "/v1/operations/"+opID+"/outcome", map[string]any{"owner_token": owner, "status": "uncertain"})
				c.do("POST", "/v1/release", map[string]any{"key": key, "owner_token": owner})
				c.do("GET", "/v1/keys/"+url.PathEscape(key), nil)
				c.do("GET", "/v1/attempts?key="+url.QueryEscape(key), nil)

				user := dashOperator(t, db, services.RoleAdmin, nil)
				b := newDashBrowser(t, s)
				require.Equal(t, http.StatusUnauthorized, b.login(user, "wrong-"+dashPassword).status)
				b.mustLogin(user)
				session := b.cookies["idemgate_session"]
				require.NotNil(t, session)
				page := b.get("/keys?prefix=" + url.QueryEscape(key))
				require.Equal(t, 200, page.status)
				b.post("/logout", url.Values{"_csrf": {page.csrf(t)}})

				secrets := map[string]string{"api key": c.key, "owner token": owner, "password": dashPassword,
					"session": session.Value}
				if !traceKeys {
					secrets["idempotency key"] = key
				}
				var sawKey bool
				spans := rec.Ended()
				require.NotEmpty(t, serverSpans(rec))
				for _, sp := range spans {
					kvs := append([]attribute.KeyValue{}, sp.Attributes()...)
					for _, e := range sp.Events() {
						kvs = append(kvs, e.Attributes...)
						kvs = append(kvs, attribute.String("event.name", e.Name))
					}
					kvs = append(kvs, attribute.String("span.name", sp.Name()), attribute.String("status", sp.Status().Description))
					for _, kv := range kvs {
						v := kv.Value.String()
						for what, secret := range secrets {
							require.NotContains(t, v, secret, "%s in attribute %s of span %q", what, kv.Key, sp.Name())
						}
						if strings.Contains(v, key) {
							sawKey = true
						}
					}
				}
				require.Equal(t, traceKeys, sawKey, "raw key on spans must follow TraceKeys")
			})
		}
	}
}

// TestTracingOffInstallsNothing: without a tracer provider no span exists on the request's
// context, so log lines carry no trace ids and the histogram no exemplars (the zero-overhead
// path: the middleware is not installed at all).
func TestTracingOffInstallsNothing(t *testing.T) {
	db := dbs.SQLite
	s, lc := newCapturingServer(t, db)
	c := newTenantClient(t, s)
	req := httptest.NewRequest(http.MethodPost, "/v1/acquire", strings.NewReader(`{"key":"off-`+dashRandom()+`","ttl_seconds":60}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.key)
	req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	got := send(t, s, lc, req)
	require.Equal(t, http.StatusCreated, got.status, got.body)
	for _, l := range got.lines {
		require.NotContains(t, l, logging.TraceIDKey)
		require.NotContains(t, l, logging.SpanIDKey)
	}
}

// TestTracingConcurrentRequestsKeepTheirOwnSpans: 32 acquires at once over real HTTP, each
// with its own traceparent and key: every server span continues its own request's trace and
// carries that request's key hash and operation, never another's (Fiber reuses request
// contexts, so a span leaking between requests would show here). On both dialects.
func TestTracingConcurrentRequestsKeepTheirOwnSpans(t *testing.T) {
	dbs.Each(t, func(t *testing.T, db *models.DB) {
		s, rec, _ := tracedServer(t, db, false)
		c := newTenantClient(t, s)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		go func() { _ = s.Serve(ln) }()
		t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
		const n = 32
		prefix := "conc-" + dashRandom() + "-"
		opByTrace := make([]string, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				body := fmt.Sprintf(`{"key":"%s%d","ttl_seconds":60}`, prefix, i)
				req, _ := http.NewRequest(http.MethodPost, "http://"+ln.Addr().String()+"/v1/acquire", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer "+c.key)
				req.Header.Set("traceparent", fmt.Sprintf("00-%032x-%016x-01", i+1, i+1))
				resp, err := http.DefaultClient.Do(req)
				if !assert.NoError(t, err) {
					return
				}
				defer resp.Body.Close()
				var m map[string]any
				assert.NoError(t, json.NewDecoder(resp.Body).Decode(&m))
				assert.Equal(t, http.StatusCreated, resp.StatusCode, m)
				opByTrace[i], _ = m["operation_id"].(string)
			}()
		}
		wg.Wait()
		seen := 0
		for _, sp := range serverSpans(rec) {
			var i int
			_, err := fmt.Sscanf(sp.SpanContext().TraceID().String(), "%032x", &i)
			require.NoError(t, err)
			require.True(t, i >= 1 && i <= n, sp.SpanContext().TraceID().String())
			a := spanAttrs(sp)
			require.Equal(t, keyHash(fmt.Sprintf("%s%d", prefix, i-1)), a[attrKeyHash].AsString(), "span of trace %d has another request's key", i)
			require.Equal(t, opByTrace[i-1], a[attrOperationID].AsString())
			seen++
		}
		require.Equal(t, n, seen)
	})
}
