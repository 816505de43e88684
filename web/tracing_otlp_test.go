package web

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/web/telemetry"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace/noop"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is an in-process OTLP/HTTP trace receiver: it decodes every
// ExportTraceServiceRequest posted to /v1/traces, as a collector would.
type otlpReceiver struct {
	mu   sync.Mutex
	reqs []*coltracepb.ExportTraceServiceRequest
	srv  *httptest.Server
}

func newOTLPReceiver(t testing.TB) *otlpReceiver {
	t.Helper()
	r := &otlpReceiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, "unexpected "+req.URL.Path+" "+req.Header.Get("Content-Type"), http.StatusBadRequest)
			return
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var export coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &export); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.reqs = append(r.reqs, &export)
		r.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// received are the resource spans of every export so far.
func (r *otlpReceiver) received() []*tracepb.ResourceSpans {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*tracepb.ResourceSpans
	for _, e := range r.reqs {
		out = append(out, e.ResourceSpans...)
	}
	return out
}

func otlpAttr(kvs []*commonpb.KeyValue, key string) (*commonpb.AnyValue, bool) {
	for _, kv := range kvs {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return nil, false
}

// TestTracingExportsOverOTLPFromEnvironment: configured only by the standard environment
// variables (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_SAMPLER, OTEL_RESOURCE_ATTRIBUTES),
// telemetry.Setup exports over OTLP/HTTP protobuf to a collector — here an in-process
// receiver — and Shutdown flushes what is queued: the acquire's server span, continuing the
// caller's traceparent, with its decision, and the statements' client spans in the same trace,
// under the resource service.name "idemgate". On PostgreSQL and SQLite.
func TestTracingExportsOverOTLPFromEnvironment(t *testing.T) {
	t.Cleanup(func() {
		otel.SetTracerProvider(noop.NewTracerProvider())
		otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator())
	})
	dbs.Each(t, func(t *testing.T, db *models.DB) {
		recv := newOTLPReceiver(t)
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", recv.srv.URL)
		t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "")
		t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
		t.Setenv("OTEL_TRACES_SAMPLER", "always_on")
		t.Setenv("OTEL_SERVICE_NAME", "")
		t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=test")
		t.Setenv("IDEMGATE_TRACE_KEYS", "")
		tel, err := telemetry.Setup(context.Background(), os.Getenv, "v-test")
		require.NoError(t, err)
		require.True(t, tel.Enabled())
		require.Equal(t, "http/protobuf", tel.Protocol)

		lc := &logCapture{}
		cfg := testConfig(t, tracedDB(t, db, tel.TracerProvider), newJSONLogger(lc))
		cfg.TracerProvider, cfg.TraceKeys = tel.TracerProvider, tel.TraceKeys
		s := New(cfg)
		c := newTenantClient(t, s)

		const traceID, parentID = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
		req := httptest.NewRequest(http.MethodPost, "/v1/acquire",
			strings.NewReader(`{"key":"otlp-`+dashRandom()+`","ttl_seconds":60}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+c.key)
		req.Header.Set("traceparent", "00-"+traceID+"-"+parentID+"-01")
		got := send(t, s, lc, req)
		require.Equal(t, http.StatusCreated, got.status, got.body)
		var logged bool
		for _, l := range got.lines {
			logged = logged || (l["msg"] == "request" && l["trace_id"] == traceID)
		}
		require.True(t, logged, "access line without the trace id: %v", got.lines)

		require.NoError(t, tel.Shutdown(context.Background()))
		var server *tracepb.Span
		var clientSpans int
		for _, rs := range recv.received() {
			name, ok := otlpAttr(rs.GetResource().GetAttributes(), "service.name")
			require.True(t, ok)
			require.Equal(t, "idemgate", name.GetStringValue())
			v, _ := otlpAttr(rs.GetResource().GetAttributes(), "service.version")
			require.Equal(t, "v-test", v.GetStringValue())
			env, _ := otlpAttr(rs.GetResource().GetAttributes(), "deployment.environment.name")
			require.Equal(t, "test", env.GetStringValue())
			for _, ss := range rs.ScopeSpans {
				for _, sp := range ss.Spans {
					if hex.EncodeToString(sp.TraceId) != traceID {
						continue
					}
					switch sp.Kind {
					case tracepb.Span_SPAN_KIND_SERVER:
						server = sp
					case tracepb.Span_SPAN_KIND_CLIENT:
						clientSpans++
						require.NotEmpty(t, sp.ParentSpanId)
					}
				}
			}
		}
		require.NotNil(t, server, "the acquire's server span was not exported")
		require.Equal(t, "POST /v1/acquire", server.Name)
		require.Equal(t, parentID, hex.EncodeToString(server.ParentSpanId))
		d, ok := otlpAttr(server.Attributes, "idemgate.decision")
		require.True(t, ok)
		require.Equal(t, "admitted", d.GetStringValue())
		_, ok = otlpAttr(server.Attributes, "idemgate.fencing_token")
		require.True(t, ok)
		require.NotZero(t, clientSpans, "no database span exported in the acquire's trace")
	})
}
