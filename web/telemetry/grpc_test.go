package telemetry

import (
	"context"
	"net"
	"os"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
)

// grpcReceiver is an in-process OTLP/gRPC trace receiver that keeps the names of the spans
// exported to it.
type grpcReceiver struct {
	coltracepb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	names []string
	attrs map[string]string
}

// Export records the spans' names and resource attributes (coltracepb.TraceServiceServer).
func (r *grpcReceiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		for _, kv := range rs.GetResource().GetAttributes() {
			r.attrs[kv.Key] = kv.Value.GetStringValue()
		}
		for _, ss := range rs.ScopeSpans {
			for _, sp := range ss.Spans {
				r.names = append(r.names, sp.Name)
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// TestSetupExportsOverGRPC: OTEL_EXPORTER_OTLP_PROTOCOL=grpc with the endpoint from the
// process environment exports to an OTLP/gRPC collector (in-process here), with
// OTEL_SERVICE_NAME overriding the default service name; Shutdown flushes.
func TestSetupExportsOverGRPC(t *testing.T) {
	restoreGlobals(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	recv := &grpcReceiver{attrs: map[string]string{}}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, recv)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)

	t.Setenv(EnvEndpoint, "http://"+ln.Addr().String())
	t.Setenv(EnvTracesEndpoint, "")
	t.Setenv(EnvProtocol, "grpc")
	t.Setenv(EnvTracesProtocol, "")
	t.Setenv("OTEL_SERVICE_NAME", "idemgate-eu")
	t.Setenv("OTEL_TRACES_SAMPLER", "always_on")
	tel, err := Setup(context.Background(), os.Getenv, "")
	require.NoError(t, err)
	require.Equal(t, "grpc", tel.Protocol)
	_, span := tel.TracerProvider.Tracer("test").Start(context.Background(), "grpc-span")
	span.End()
	require.NoError(t, tel.Shutdown(context.Background()))

	recv.mu.Lock()
	defer recv.mu.Unlock()
	require.Equal(t, []string{"grpc-span"}, recv.names)
	require.Equal(t, "idemgate-eu", recv.attrs["service.name"])
}
