package main

import (
	"bytes"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/stretchr/testify/require"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// TestServeFlushesTracesOnStop: `idemgate serve` with only OTEL_EXPORTER_OTLP_ENDPOINT set
// exports to that collector (an in-process OTLP/HTTP receiver), logs the request's trace id on
// its access line, and on SIGTERM flushes the spans still queued: the batch delay here is a
// minute, so the acquire's server span and its database spans arrive only through the flush
// at stop. On SQLite and PostgreSQL.
func TestServeFlushesTracesOnStop(t *testing.T) {
	pgURL, drop, err := modeltest.CreatePostgres()
	require.NoError(t, err)
	t.Cleanup(drop)
	for name, dbEnv := range map[string]string{
		"sqlite":   "IDEMGATE_SQLITE_PATH=" + filepath.Join(t.TempDir(), "traced.db"),
		"postgres": "DATABASE_URL=" + pgURL,
	} {
		t.Run(name, func(t *testing.T) {
			var mu sync.Mutex
			var spans []*tracepb.Span
			recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				var req coltracepb.ExportTraceServiceRequest
				if err := proto.Unmarshal(body, &req); err != nil {
					http.Error(w, err.Error(), http.StatusBadRequest)
					return
				}
				mu.Lock()
				for _, rs := range req.ResourceSpans {
					for _, ss := range rs.ScopeSpans {
						spans = append(spans, ss.Spans...)
					}
				}
				mu.Unlock()
				out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
				w.Header().Set("Content-Type", "application/x-protobuf")
				_, _ = w.Write(out)
			}))
			t.Cleanup(recv.Close)
			s := startServer(t, dbEnv, "OTEL_EXPORTER_OTLP_ENDPOINT="+recv.URL, "OTEL_BSP_SCHEDULE_DELAY=60000")
			require.Contains(t, s.Log.String(), `"msg":"exporting traces"`)

			const traceID = "5af7651916cd43dd8448eb211c80319c"
			req, _ := http.NewRequest(http.MethodPost, s.url+"/v1/acquire",
				bytes.NewReader([]byte(`{"key":"traced-`+name+`","ttl_seconds":60}`)))
			req.Header.Set("Authorization", "Bearer "+testAPIKey)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("traceparent", "00-"+traceID+"-b7ad6b7169203331-01")
			resp, err := client.Do(req)
			require.NoError(t, err)
			_ = resp.Body.Close()
			require.Equal(t, http.StatusCreated, resp.StatusCode)

			require.NoError(t, s.Signal(syscall.SIGTERM))
			done := make(chan error, 1)
			go func() { done <- s.Wait() }()
			select {
			case err := <-done:
				require.NoError(t, err, "serve did not exit 0")
			case <-time.After(20 * time.Second):
				t.Fatal("serve did not stop within 20 s")
			}
			require.Contains(t, s.Log.String(), `"trace_id":"`+traceID+`"`, "no log line with the trace id")

			mu.Lock()
			defer mu.Unlock()
			var server, db int
			for _, sp := range spans {
				if hex.EncodeToString(sp.TraceId) != traceID {
					continue
				}
				switch sp.Kind {
				case tracepb.Span_SPAN_KIND_SERVER:
					require.Equal(t, "POST /v1/acquire", sp.Name)
					server++
				case tracepb.Span_SPAN_KIND_CLIENT:
					require.True(t, strings.TrimSpace(sp.Name) != "")
					db++
				}
			}
			require.Equal(t, 1, server, "the acquire's server span was not flushed at stop (%d spans)", len(spans))
			require.NotZero(t, db, "no database span flushed at stop")
		})
	}
}
