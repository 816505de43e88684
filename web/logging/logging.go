// Package logging carries a request's id from the HTTP layer to every log line written while
// handling it. web/ stores the id in the request's context (ContextWithRequestID); the
// handler of NewHandler adds it as the attribute request_id to every record logged with that
// context (slog's *Context methods), whichever package logs it, and the trace and span ids
// of the context's span when tracing records it. Code that logs during a
// request must therefore use InfoContext, WarnContext, ErrorContext or DebugContext with the
// request's context.
package logging

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/trace"
)

// RequestIDKey is the attribute name of the request id in log records, and the member name
// in problem+json bodies.
const RequestIDKey = "request_id"

// TraceIDKey and SpanIDKey are the attribute names of the OpenTelemetry trace and span ids
// (32 and 16 lowercase hex digits) in log records logged while a span records.
const (
	TraceIDKey = "trace_id"
	SpanIDKey  = "span_id"
)

// MaxRequestIDLen is the longest request id accepted from a client (X-Request-ID), in bytes.
// Longer ones are replaced, so a client cannot make every log line of its request huge.
const MaxRequestIDLen = 64

type requestIDKey struct{}

// ContextWithRequestID returns a copy of ctx that carries the request id id.
func ContextWithRequestID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, requestIDKey{}, id)
}

// RequestID returns the request id ctx carries, or "" if none.
func RequestID(ctx context.Context) string {
	if ctx == nil {
		return ""
	}
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}

// ValidRequestID reports whether a request id sent by a client may be used as is: 1 to
// MaxRequestIDLen bytes of ASCII letters, digits and ._~:@+/- (enough for UUIDs, ULIDs,
// W3C trace ids and unpadded base64). Anything else — spaces, quotes, '=' (slog's text format
// would quote it), control characters, newlines, non-ASCII — is refused, so an id never
// needs quoting and can never forge a log line (FuzzValidRequestID).
func ValidRequestID(s string) bool {
	if len(s) == 0 || len(s) > MaxRequestIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '.', c == '_', c == '~', c == ':', c == '@', c == '+', c == '/', c == '-':
		default:
			return false
		}
	}
	return true
}

// NewHandler wraps h so that every record logged with a context carrying a request id
// (ContextWithRequestID) gets the attribute request_id, and every record logged with a context
// whose OpenTelemetry span is recording gets trace_id and span_id. Records logged without such a context
// (startup, the reaper) pass through unchanged. Levels, attributes and groups are h's; the
// request_id lands in the innermost open group, so loggers that are to carry it at the top
// level should not use WithGroup.
func NewHandler(h slog.Handler) slog.Handler { return handler{inner: h} }

type handler struct{ inner slog.Handler }

// Enabled is the inner handler's decision.
func (h handler) Enabled(ctx context.Context, l slog.Level) bool { return h.inner.Enabled(ctx, l) }

// Handle adds request_id when ctx carries one, and trace_id and span_id when ctx's span is
// recording (tracing on and the trace sampled), and passes r on.
func (h handler) Handle(ctx context.Context, r slog.Record) error {
	id := RequestID(ctx)
	var sc trace.SpanContext
	if ctx != nil {
		if span := trace.SpanFromContext(ctx); span.IsRecording() {
			sc = span.SpanContext()
		}
	}
	if id == "" && !sc.IsValid() {
		return h.inner.Handle(ctx, r)
	}
	r = r.Clone() // r may share its attributes with copies the caller still holds
	if id != "" {
		r.AddAttrs(slog.String(RequestIDKey, id))
	}
	if sc.IsValid() {
		r.AddAttrs(slog.String(TraceIDKey, sc.TraceID().String()), slog.String(SpanIDKey, sc.SpanID().String()))
	}
	return h.inner.Handle(ctx, r)
}

// WithAttrs returns the inner handler's WithAttrs, still wrapped.
func (h handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return handler{inner: h.inner.WithAttrs(attrs)}
}

// WithGroup returns the inner handler's WithGroup, still wrapped.
func (h handler) WithGroup(name string) slog.Handler { return handler{inner: h.inner.WithGroup(name)} }
