package web

import (
	"context"

	"github.com/idemgate/idemgate/services"
	"go.opentelemetry.io/otel/trace"
)

// observer is the server's services.Observer (Server.Observer): the one route by which the
// services' decisions reach both the metrics and the traces. Each decision is counted in
// metrics (idemgate_acquires_total, _releases_total, _outcomes_total, the reaper's series)
// wherever it was taken, and an API decision is recorded on the span of the request that asked
// for it, when that span records (README "Tracing"): idemgate.decision, idemgate.operation_id,
// idemgate.fencing_token and the key (keyAttrs). Handlers record no decision themselves.
type observer struct {
	metrics *metrics
	// traceKeys lets raw idempotency keys onto spans (Config.TraceKeys).
	traceKeys bool
}

// AcquireDecided counts an acquire attempt and records it on the request's span
// (services.Observer). A batch's items are not recorded one by one: the batch's span counts its
// items' answers instead (traceBatch).
func (o *observer) AcquireDecided(ctx context.Context, tenant, result string, d services.Decision) {
	o.metrics.acquires.WithLabelValues(tenant, result).Inc()
	if d.InBatch {
		return
	}
	// The refusal's code, except that a fingerprint mismatch is the acquire's "conflict" (as
	// in idemgate_acquires_total).
	decision := result
	if d.Refused != "" && d.Refused != services.CodeFingerprintMismatch {
		decision = d.Refused
	}
	o.trace(ctx, decision, d)
}

// ReleaseDecided counts a release and records an API release on the request's span
// (services.Observer).
func (o *observer) ReleaseDecided(ctx context.Context, source, result string, d services.Decision) {
	o.metrics.releases.WithLabelValues(source, result).Inc()
	if source == services.SourceAPI {
		o.trace(ctx, result, d)
	}
}

// OutcomeDecided counts an outcome and records an API outcome on the request's span
// (services.Observer). The span says recorded for the same outcome again too.
func (o *observer) OutcomeDecided(ctx context.Context, source, status, result string, d services.Decision) {
	o.metrics.outcomes.WithLabelValues(source, status, result).Inc()
	if source == services.SourceAPI {
		if result == services.ResultUnchanged {
			result = services.ResultRecorded
		}
		o.trace(ctx, result, d)
	}
}

// ReaperPassed counts a reaper pass and the rows it changed (services.Observer). A pass is no
// request's: nothing is traced.
func (o *observer) ReaperPassed(_ context.Context, res services.ReapResult, err error) {
	rows := []int64{res.HoldsExpired, res.MarkedUncertain, res.OperationsPurged, res.AttemptsPurged,
		res.EventsPurged, res.SessionsPurged, res.TombstonesWritten}
	m := o.metrics
	for i, a := range reaperActions {
		m.reaperRows.WithLabelValues(a).Add(float64(rows[i]))
	}
	if err != nil {
		m.reaperRuns.WithLabelValues("error").Inc()
		return
	}
	m.reaperRuns.WithLabelValues("ok").Inc()
	m.reaperLastSuccess.SetToCurrentTime()
}

// trace records decision and d on the span of ctx when it records (tracing on and the trace
// sampled); otherwise it computes nothing.
func (o *observer) trace(ctx context.Context, decision string, d services.Decision) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	if d.Key != "" {
		span.SetAttributes(keyAttrs(d.Key, o.traceKeys)...)
	}
	span.SetAttributes(attrDecision.String(decision))
	if d.OperationID != "" {
		span.SetAttributes(attrOperationID.String(d.OperationID), attrFencingToken.Int64(d.FencingToken))
	}
}
