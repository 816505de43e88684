package services

import (
	"context"
	"errors"
)

// Observer is told about the decisions this package makes, so that an adapter can count them
// and trace them: web/ implements it with Prometheus counters and attributes of the request's
// span (services imports neither Prometheus nor OpenTelemetry), so a decision reaches both by
// this one route whichever handler or loop asked for it. Every method is called with the
// context of the call that decided, after the decision's transaction has ended, never inside
// it, at most once per decision (an AcquireBatch reports each item). Implementations must be
// safe for concurrent use and fast: they run on the request path. Every string argument but
// the Decision is a constant of this package or of models, or read from the database (tenant
// names): never a caller's string, so it is safe to keep, and bounded, so it may be a label.
//
// Only decisions are reported: a call refused before one was taken (invalid input, an
// auditor's action, the database unavailable, an unexpected error) is not, so each counter
// means what docs/reference.md §3–4 means by it. Such failures are visible in the HTTP layer's metrics by
// status.
type Observer interface {
	// AcquireDecided reports one acquire that was logged as an attempt (docs/reference.md §2): result is
	// admitted (including an attempt_id retry answered 201 again), duplicate or conflict.
	// tenant is the tenant's name ("" when the caller's Principal has none).
	AcquireDecided(ctx context.Context, tenant, result string, d Decision)
	// ReleaseDecided reports one owner-checked release (docs/reference.md §4, §5): source is SourceAPI
	// or SourceOperator; result is ResultReleased or the code of the refusal (not_owner,
	// effect_confirmed, outcome_uncertain, key_not_held, invalid_transition, not_found).
	ReleaseDecided(ctx context.Context, source, result string, d Decision)
	// OutcomeDecided reports one outcome recorded or refused (docs/reference.md §3–4): source is
	// SourceAPI or SourceOperator; status is the outcome asked for (succeeded, failed,
	// uncertain; "invalid" when a refusal came before the status was checked and it was none
	// of these); result is ResultRecorded, ResultUnchanged (the same outcome again) or the
	// code of the refusal (not_owner, invalid_transition, not_found).
	OutcomeDecided(ctx context.Context, source, status, result string, d Decision)
	// ReaperPassed reports one reaper pass: what it changed, and its error (nil on success;
	// work done before an error stays done and is counted in res). Passes cut short because
	// ctx ended (shutdown) are not reported.
	ReaperPassed(ctx context.Context, res ReapResult, err error)
}

// Decision is what an Observer is told of a decision besides its bounded arguments: what a
// trace of the call records. Its strings are not bounded (Key is the caller's, OperationID one
// of many) and must never become metric labels.
type Decision struct {
	// Key is the idempotency key the decision was about: an acquire's or an API release's;
	// an outcome's once it is recorded (the call names the operation, not the key); "" when
	// not known.
	Key string
	// OperationID and FencingToken name the operation the caller is answered with: the
	// admitted, released or changed one, or a duplicate's holder; "" and 0 for a refusal.
	OperationID  string
	FencingToken int64
	// Refused is, for an acquire answered with a refusal, its code: CodeFingerprintMismatch
	// for a conflict, CodeOutcomeUncertain for a duplicate of an operation whose outcome is
	// uncertain (docs/reference.md §3); "" otherwise.
	Refused string
	// InBatch marks an acquire decided as an item of AcquireBatch, one of several decisions
	// of one call.
	InBatch bool
}

// operationDecision is the Decision of a release or outcome answered with op (nil: refused).
func operationDecision(key string, op *Operation) Decision {
	d := Decision{Key: key}
	if op != nil {
		d.Key, d.OperationID, d.FencingToken = op.Key, op.ID, op.FencingToken
	}
	return d
}

// Sources of releases and outcomes, for Observer.
const (
	SourceAPI      = "api"      // the JSON API, checked by owner token
	SourceOperator = "operator" // the dashboard, by a signed-in operator
)

// Results of releases and outcomes for Observer, besides refusal codes.
const (
	ResultReleased  = "released"  // the hold was released
	ResultRecorded  = "recorded"  // the outcome changed the operation
	ResultUnchanged = "unchanged" // the same outcome again: succeeded and changed nothing
)

// nopObserver is the Observer of services built without one.
type nopObserver struct{}

func (nopObserver) AcquireDecided(context.Context, string, string, Decision)         {}
func (nopObserver) ReleaseDecided(context.Context, string, string, Decision)         {}
func (nopObserver) OutcomeDecided(context.Context, string, string, string, Decision) {}
func (nopObserver) ReaperPassed(context.Context, ReapResult, error)                  {}

// WithObserver returns a copy of a that reports its decisions to o (nil: to nobody). a itself
// is not changed, so it is safe to call while a is in use.
func (a *Admission) WithObserver(o Observer) *Admission {
	c := *a
	c.obs = orNop(o)
	return &c
}

// WithObserver returns a copy of rc that reports its decisions to o (nil: to nobody).
func (rc *Reconciliation) WithObserver(o Observer) *Reconciliation {
	c := *rc
	c.obs = orNop(o)
	return &c
}

// WithObserver returns a copy of r that reports its passes to o (nil: to nobody).
func (r *Reaper) WithObserver(o Observer) *Reaper {
	c := *r
	c.obs = orNop(o)
	return &c
}

func orNop(o Observer) Observer {
	if o == nil {
		return nopObserver{}
	}
	return o
}

// refusalCode returns the code of err when it is a decision of the state machine rather than a
// failure to reach one (see Observer), and whether it is.
func refusalCode(err error) (string, bool) {
	var de *Error
	if !errors.As(err, &de) {
		return "", false
	}
	switch de.Code {
	case CodeNotOwner, CodeEffectConfirmed, CodeOutcomeUncertain, CodeKeyNotHeld, CodeInvalidTransition,
		CodeNotFound, CodeFingerprintMismatch:
		return de.Code, true
	}
	return "", false
}

// observeRelease reports a release call that ended with err, d its Decision.
func observeRelease(ctx context.Context, o Observer, source string, err error, d Decision) {
	if err == nil {
		o.ReleaseDecided(ctx, source, ResultReleased, d)
	} else if code, ok := refusalCode(err); ok {
		o.ReleaseDecided(ctx, source, code, d)
	}
}

// observeOutcome reports an outcome call that ended with err, d its Decision; changed says
// whether a successful one changed the operation.
func observeOutcome(ctx context.Context, o Observer, source, status string, changed bool, err error, d Decision) {
	// The constants, never the caller's string: it may point into a request buffer that is
	// reused after the request, and label values outlive it. Bounded whatever was sent.
	switch status {
	case StateSucceeded:
		status = StateSucceeded
	case StateFailed:
		status = StateFailed
	case StateUncertain:
		status = StateUncertain
	default:
		status = "invalid"
	}
	switch {
	case err == nil && changed:
		o.OutcomeDecided(ctx, source, status, ResultRecorded, d)
	case err == nil:
		o.OutcomeDecided(ctx, source, status, ResultUnchanged, d)
	default:
		if code, ok := refusalCode(err); ok {
			o.OutcomeDecided(ctx, source, status, code, d)
		}
	}
}
