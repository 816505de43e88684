package web

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strconv"

	"github.com/gofiber/fiber/v2"
	"github.com/idemgate/idemgate/services"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// Span attributes of idemgate's own (docs/operations.md "Tracing"). Secrets never become attributes: not
// the API key, owner tokens, session ids or passwords, and the idempotency key only when
// Config.TraceKeys is set (else its digest, attrKeyHash).
const (
	attrDecision     = attribute.Key("idemgate.decision")      // admitted, duplicate, conflict, released, recorded, or the refusal's code
	attrTenant       = attribute.Key("idemgate.tenant")        // the API key's tenant name
	attrFencingToken = attribute.Key("idemgate.fencing_token") // of the admitted or changed operation
	attrOperationID  = attribute.Key("idemgate.operation_id")
	attrProblemCode  = attribute.Key("idemgate.problem_code") // the stable code of a problem+json answer
	attrRequestID    = attribute.Key("idemgate.request_id")   // X-Request-ID, as in the access log line
	attrKey          = attribute.Key("idemgate.key")          // the raw idempotency key: only with Config.TraceKeys
	attrKeyHash      = attribute.Key("idemgate.key_hash")     // keyHash of the key
	attrBatchItems   = attribute.Key("idemgate.batch.items")  // items of an acquire batch
)

// tracerName is the instrumentation scope of the HTTP server spans.
const tracerName = "github.com/idemgate/idemgate/web"

// traceRequests starts the server span of every request that reaches the middleware chain,
// with OpenTelemetry's HTTP semantic conventions: name "METHOD route" (the route pattern,
// never the raw path, which holds keys), http.request.method, http.route,
// http.response.status_code, url.scheme, server.address, client.address, user_agent.original,
// and a W3C traceparent from the request's headers as its parent. url.path only with
// traceKeys, since GET /v1/keys/{key} has the key in its path; the query string never.
// Headers are read one by one through a carrier: Authorization and cookies are never copied.
//
// It runs outside observe, so the span is current (and recording, when sampled) while the
// access line is logged and the latency observed: both then carry the trace id. Only 5xx marks
// the span as an error: a 4xx is the client's, as the semantic conventions say for servers.
// The middleware is installed only when Config.TracerProvider is set.
func traceRequests(tp trace.TracerProvider, prop propagation.TextMapPropagator, traceKeys bool) fiber.Handler {
	tracer := tp.Tracer(tracerName)
	return func(c *fiber.Ctx) error {
		parent := c.UserContext()
		ctx := prop.Extract(parent, headerCarrier{&c.Request().Header})
		method := methodLabel(c.Method())
		attrs := []attribute.KeyValue{
			semconv.HTTPRequestMethodKey.String(method),
			semconv.URLScheme(c.Protocol()),
			semconv.ServerAddress(c.Hostname()),
			semconv.ClientAddress(c.IP()),
		}
		if ua := c.Request().Header.UserAgent(); len(ua) > 0 {
			attrs = append(attrs, semconv.UserAgentOriginal(string(ua)))
		}
		if traceKeys {
			attrs = append(attrs, semconv.URLPath(string(c.Request().URI().Path())))
		}
		ctx, span := tracer.Start(ctx, method, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
		defer span.End()
		c.SetUserContext(ctx)
		defer c.SetUserContext(parent)
		err := c.Next() // observe answers every error, so this is nil unless the chain is miswired
		status := c.Response().StatusCode()
		route := routeLabel(c, status)
		span.SetName(method + " " + route)
		span.SetAttributes(semconv.HTTPRoute(route), semconv.HTTPResponseStatusCode(status),
			attrRequestID.String(requestID(c)))
		if p := principal(c); p.TenantName != "" {
			span.SetAttributes(attrTenant.String(p.TenantName))
		}
		if status >= 500 {
			span.SetStatus(codes.Error, strconv.Itoa(status))
		}
		return err
	}
}

// headerCarrier reads and writes fasthttp request headers for a propagator.
type headerCarrier struct{ h *fasthttp.RequestHeader }

// Get returns the header's value ("" when absent; propagation.TextMapCarrier).
func (hc headerCarrier) Get(key string) string { return string(hc.h.Peek(key)) }

// Set sets the header (propagation.TextMapCarrier).
func (hc headerCarrier) Set(key, value string) { hc.h.Set(key, value) }

// Keys is nil: the W3C propagators only Get the headers they know.
func (hc headerCarrier) Keys() []string { return nil }

// requestSpan is the request's server span when it is recording (tracing on and the trace
// sampled), else nil: attributes are then neither computed nor set.
func requestSpan(c *fiber.Ctx) trace.Span {
	if span := trace.SpanFromContext(c.UserContext()); span.IsRecording() {
		return span
	}
	return nil
}

// keyHash is the digest of an idempotency key on spans: the first 8 bytes of its SHA-256, in
// hex. The same key always has the same hash, so one key's requests can be found across
// traces and instances without the key itself leaving idemgate.
func keyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:8])
}

// keyAttrs are the attributes naming key: idemgate.key_hash, and idemgate.key itself when the
// server traces keys (traceKeys, Config.TraceKeys).
func keyAttrs(key string, traceKeys bool) []attribute.KeyValue {
	attrs := []attribute.KeyValue{attrKeyHash.String(keyHash(key))}
	if traceKeys {
		attrs = append(attrs, attrKey.String(key))
	}
	return attrs
}

// traceBatch records an acquire batch on the request span: its size and, per decision, how
// many items got it (idemgate.decision.<decision> = count: admitted, duplicate, conflict, or
// invalid for an item refused before a decision); the decision attribute itself is "batch".
// Keys are not listed: up to services.MaxBatchItems of them would not help a trace.
//
// It is the one span record a handler makes: it summarises the answer item by item, items the
// HTTP layer refused before any service saw them included, where the Observer (observer.go)
// records single decisions and leaves a batch's items to this.
func traceBatch(c *fiber.Ctx, results []batchResult) {
	span := requestSpan(c)
	if span == nil {
		return
	}
	counts := map[string]int{}
	for _, r := range results {
		switch {
		case r.Status == fiber.StatusCreated:
			counts[services.ResultAdmitted]++
		case r.Status == fiber.StatusOK:
			counts[services.ResultDuplicate]++
		case r.Problem != nil && r.Problem.Code == services.CodeFingerprintMismatch:
			counts[services.ResultConflict]++
		default:
			counts["invalid"]++
		}
	}
	attrs := []attribute.KeyValue{attrDecision.String("batch"), attrBatchItems.Int(len(results))}
	for d, n := range counts {
		attrs = append(attrs, attribute.Int(string(attrDecision)+"."+d, n))
	}
	span.SetAttributes(attrs...)
}

// traceProblem records the problem code of an error answer on the request span; a 5xx also
// marks the span as an error with that code (never the error's text, which may quote a
// database error naming a key).
func traceProblem(ctx context.Context, code string, status int) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attrProblemCode.String(code))
	if status >= 500 {
		span.SetStatus(codes.Error, code)
	}
}

// observeLatency records v in o with the request's trace id as exemplar when the trace is
// sampled (shown by /metrics in the OpenMetrics format), so a slow bucket leads to a trace.
func observeLatency(ctx context.Context, o prometheus.Observer, v float64) {
	if sc := trace.SpanContextFromContext(ctx); sc.IsSampled() {
		if eo, ok := o.(prometheus.ExemplarObserver); ok {
			eo.ObserveWithExemplar(v, prometheus.Labels{"trace_id": sc.TraceID().String()})
			return
		}
	}
	o.Observe(v)
}
