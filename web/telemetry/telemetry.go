// Package telemetry sets up OpenTelemetry tracing for idemgate from the standard OTEL_*
// environment variables (docs/operations.md, "Tracing", says what is recorded). Tracing is on
// only when an OTLP endpoint is configured (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT); otherwise Setup installs nothing, and the HTTP layer
// and the database open without any instrumentation, so an untraced server pays nothing.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// DefaultServiceName is service.name when neither OTEL_SERVICE_NAME nor OTEL_RESOURCE_ATTRIBUTES
// names one.
const DefaultServiceName = "idemgate"

// Environment variables read by Setup itself. Every other OTEL_* variable (headers, timeout,
// compression, TLS certificates, OTEL_TRACES_SAMPLER and its argument, OTEL_BSP_* batching,
// OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME) is read by the OpenTelemetry SDK and exporter
// as the OpenTelemetry specification defines it.
const (
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	// EnvTracesExporter "none" turns tracing off even with an endpoint set (the specification's
	// OTEL_TRACES_EXPORTER; "otlp" or unset is the only other value accepted).
	EnvTracesExporter = "OTEL_TRACES_EXPORTER"
	// EnvTraceKeys is idemgate's own: "true" puts raw idempotency keys on spans (idemgate.key
	// and url.path); the default, false, puts only idemgate.key_hash there.
	EnvTraceKeys = "IDEMGATE_TRACE_KEYS"
)

// Telemetry is the tracing set up by Setup. The zero value (and a nil *Telemetry) is tracing
// off: TracerProvider is nil and Shutdown does nothing.
type Telemetry struct {
	// TracerProvider is where idemgate's spans go, nil when tracing is off. Pass it to
	// web.Config.TracerProvider and models.OpenOptions.TracerProvider.
	TracerProvider trace.TracerProvider
	// TraceKeys is IDEMGATE_TRACE_KEYS: raw idempotency keys may be recorded on spans.
	TraceKeys bool
	// Protocol is the OTLP protocol in use ("http/protobuf" or "grpc"), "" when off.
	Protocol string

	sdk *sdktrace.TracerProvider
}

// Enabled reports whether spans are exported.
func (t *Telemetry) Enabled() bool { return t != nil && t.TracerProvider != nil }

// Shutdown flushes the spans still queued to the exporter and stops it, waiting at most until
// ctx ends: call it once the HTTP server has stopped, so the last requests' spans are sent.
// Errors: the exporter's (an unreachable collector), or ctx's.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	if t == nil || t.sdk == nil {
		return nil
	}
	return t.sdk.Shutdown(ctx)
}

// Setup reads the configuration from getenv (os.Getenv in production; the OTLP exporters
// themselves read the process environment for headers, TLS and timeouts) and, when an OTLP
// endpoint is set, builds a tracer provider exporting in batches over OTLP, with the protocol
// of OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL ("http/protobuf", the
// default, or "grpc"), the sampler of OTEL_TRACES_SAMPLER (default parentbased_always_on) and
// the resource of OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME, service.name defaulting to
// "idemgate". It installs that provider and the W3C trace-context and baggage propagators as
// OpenTelemetry's globals too. Without an endpoint it returns a Telemetry that is off and
// installs nothing. version is service.version ("" leaves it out).
//
// Errors: an unknown protocol or OTEL_TRACES_EXPORTER value, an IDEMGATE_TRACE_KEYS that is
// not a boolean, or an exporter that cannot be built (a malformed endpoint URL).
func Setup(ctx context.Context, getenv func(string) string, version string) (*Telemetry, error) {
	traceKeys := false
	if v := strings.TrimSpace(getenv(EnvTraceKeys)); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("%s: %q is not true or false", EnvTraceKeys, v)
		}
		traceKeys = b
	}
	switch exp := strings.TrimSpace(getenv(EnvTracesExporter)); exp {
	case "", "otlp":
	case "none":
		return &Telemetry{TraceKeys: traceKeys}, nil
	default:
		return nil, fmt.Errorf("%s: %q is not supported (otlp or none)", EnvTracesExporter, exp)
	}
	if strings.TrimSpace(getenv(EnvEndpoint)) == "" && strings.TrimSpace(getenv(EnvTracesEndpoint)) == "" {
		return &Telemetry{TraceKeys: traceKeys}, nil
	}
	protocol := strings.TrimSpace(getenv(EnvTracesProtocol))
	if protocol == "" {
		protocol = strings.TrimSpace(getenv(EnvProtocol))
	}
	if protocol == "" {
		protocol = "http/protobuf"
	}
	var (
		exp sdktrace.SpanExporter
		err error
	)
	switch protocol {
	case "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("%s: %q is not supported (http/protobuf or grpc)", EnvProtocol, protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	res, err := newResource(ctx, version)
	if err != nil {
		_ = exp.Shutdown(ctx)
		return nil, err
	}
	// NewTracerProvider reads OTEL_TRACES_SAMPLER(_ARG) and the batch processor OTEL_BSP_*.
	sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(sdk)
	otel.SetTextMapPropagator(Propagator())
	return &Telemetry{TracerProvider: sdk, TraceKeys: traceKeys, Protocol: protocol, sdk: sdk}, nil
}

// newResource describes this process: service.name "idemgate" (unless the environment names
// another: detectors applied later win), service.version, the SDK's own attributes, then
// OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME. A partial resource (a malformed attribute in
// the environment) is used with the error ignored, as the SDK's own default does.
func newResource(ctx context.Context, version string) (*resource.Resource, error) {
	attrs := []resource.Option{resource.WithAttributes(semconv.ServiceName(DefaultServiceName))}
	if version != "" {
		attrs = append(attrs, resource.WithAttributes(semconv.ServiceVersion(version)))
	}
	attrs = append(attrs, resource.WithTelemetrySDK(), resource.WithHost(), resource.WithFromEnv())
	res, err := resource.New(ctx, attrs...)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("trace resource: %w", err)
	}
	return res, nil
}

// Propagator is the propagation of trace context to and from HTTP headers: W3C traceparent and
// tracestate, and W3C baggage.
func Propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

// LogErrors sends OpenTelemetry's internal errors (a failed export: the collector down or
// refusing) to log as warnings, instead of the standard library logger's stderr lines.
func LogErrors(log *slog.Logger) {
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("tracing", "err", err)
	}))
}
