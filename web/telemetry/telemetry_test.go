package telemetry

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace/noop"
)

// env is a getenv over a map.
func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// restoreGlobals puts OpenTelemetry's globals back to their no-op defaults after a test that
// may have installed a provider.
func restoreGlobals(t *testing.T) {
	t.Cleanup(func() {
		otel.SetTracerProvider(noop.NewTracerProvider())
		otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator())
	})
}

// TestSetupOffWithoutEndpoint: no OTLP endpoint (or OTEL_TRACES_EXPORTER=none) is tracing off:
// no provider, nothing installed as OpenTelemetry's global, Shutdown a no-op.
func TestSetupOffWithoutEndpoint(t *testing.T) {
	restoreGlobals(t)
	before := otel.GetTracerProvider()
	for _, m := range []map[string]string{
		{},
		{EnvTraceKeys: "true"},
		{EnvEndpoint: "http://127.0.0.1:4318", EnvTracesExporter: "none"},
	} {
		tel, err := Setup(context.Background(), env(m), "")
		require.NoError(t, err)
		require.False(t, tel.Enabled())
		require.Nil(t, tel.TracerProvider)
		require.Equal(t, m[EnvTraceKeys] == "true", tel.TraceKeys)
		require.NoError(t, tel.Shutdown(context.Background()))
		require.Equal(t, before, otel.GetTracerProvider(), "a provider was installed with tracing off")
	}
	var nilTel *Telemetry
	require.False(t, nilTel.Enabled())
	require.NoError(t, nilTel.Shutdown(context.Background()))
}

// TestSetupProtocols: http/protobuf is the default, grpc is chosen by either protocol
// variable (the traces-specific one winning), and anything else is refused at start, as is an
// IDEMGATE_TRACE_KEYS or OTEL_TRACES_EXPORTER it cannot read.
func TestSetupProtocols(t *testing.T) {
	restoreGlobals(t)
	for _, tc := range []struct {
		env  map[string]string
		want string
		err  string
	}{
		{env: map[string]string{EnvEndpoint: "http://127.0.0.1:4318"}, want: "http/protobuf"},
		{env: map[string]string{EnvTracesEndpoint: "http://127.0.0.1:4318/v1/traces"}, want: "http/protobuf"},
		{env: map[string]string{EnvEndpoint: "http://127.0.0.1:4317", EnvProtocol: "grpc"}, want: "grpc"},
		{env: map[string]string{EnvEndpoint: "http://127.0.0.1:4317", EnvProtocol: "http/protobuf", EnvTracesProtocol: "grpc"}, want: "grpc"},
		{env: map[string]string{EnvEndpoint: "http://127.0.0.1:4318", EnvProtocol: "http/json"}, err: "not supported"},
		{env: map[string]string{EnvEndpoint: "http://127.0.0.1:4318", EnvTraceKeys: "yes please"}, err: EnvTraceKeys},
		{env: map[string]string{EnvEndpoint: "http://127.0.0.1:4318", EnvTracesExporter: "zipkin"}, err: EnvTracesExporter},
	} {
		tel, err := Setup(context.Background(), env(tc.env), "")
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, "%v", tc.env)
			continue
		}
		require.NoError(t, err, "%v", tc.env)
		require.True(t, tel.Enabled())
		require.Equal(t, tc.want, tel.Protocol)
		require.Equal(t, tel.TracerProvider, otel.GetTracerProvider(), "the provider is installed as the global one")
		require.NoError(t, tel.Shutdown(context.Background()))
	}
}

// FuzzSetup: whatever the configuration variables hold, Setup either refuses them with an
// error naming the variable or returns a usable Telemetry; it never panics.
func FuzzSetup(f *testing.F) {
	f.Add("", "", "", "")
	f.Add("http://127.0.0.1:4318", "grpc", "true", "otlp")
	f.Add("http://127.0.0.1:4318", "http/json", "1", "none")
	f.Add("://bad", "", "maybe", "")
	f.Fuzz(func(t *testing.T, endpoint, protocol, traceKeys, exporter string) {
		restoreGlobals(t)
		tel, err := Setup(context.Background(), env(map[string]string{EnvEndpoint: endpoint, EnvProtocol: protocol,
			EnvTraceKeys: traceKeys, EnvTracesExporter: exporter}), "")
		if err != nil {
			require.Nil(t, tel)
			require.True(t, strings.Contains(err.Error(), "OTEL_") || strings.Contains(err.Error(), EnvTraceKeys) ||
				strings.Contains(err.Error(), "OTLP"), err.Error())
			return
		}
		require.NotNil(t, tel)
		require.NoError(t, tel.Shutdown(context.Background()))
	})
}
