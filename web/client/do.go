package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"
	"unicode/utf8"
)

// Lease is an admitted attempt's hold on its key, as Do hands it to fn and Heartbeat renews it
// (docs/reference.md §8).
type Lease struct {
	// OperationID is the attempt's operation.
	OperationID string
	// OwnerToken proves ownership for Renew, RecordOutcome and Release.
	OwnerToken string
	// FencingToken is the admission's fencing token: pass it to the destination so that it
	// can reject this attempt once a later one was admitted.
	FencingToken int64
	// ExpiresAt is the end of the protection window at admission (the TTL).
	ExpiresAt time.Time
	// LeaseExpiresAt is the end of the lease at admission (database clock); heartbeats move
	// it on.
	LeaseExpiresAt time.Time
	// PreviousOperation is set when an earlier generation of the key may have had its effect
	// (the newest such, docs/reference.md §4): check the destination (e.g. by its receipt)
	// before acting.
	PreviousOperation *PreviousOperation
	// Duration is the lease asked for (AcquireRequest.Lease, or the TTL without one); each
	// renew asks for it again.
	Duration time.Duration

	// deadline is the local end of the lease: the time the acquire (or the last successful
	// renew) was sent, plus Duration — never later than the server's end, whatever the clocks.
	deadline time.Time
}

// DefaultDoWait is how long each long poll of Do waits for a holder's outcome before asking
// again (Do keeps asking until its context ends).
const DefaultDoWait = 30 * time.Second

// failedError marks an error of Do's fn as a definite failure without effect.
type failedError struct{ err error }

func (e *failedError) Error() string { return e.err.Error() }
func (e *failedError) Unwrap() error { return e.err }

// Failed marks err, returned by Do's fn, as a definite failure that had no effect (nothing
// reached the destination, or it was rolled back): Do then records the outcome failed and
// releases the key in the same call (docs/reference.md §3 in_progress → failed → released),
// so a retry may run again. Any error not marked so has an unknown effect and is recorded
// uncertain. errors.Is/As see through the mark; Failed(nil) is nil.
func Failed(err error) error {
	if err == nil {
		return nil
	}
	return &failedError{err}
}

// IsFailed reports whether err was marked with Failed.
func IsFailed(err error) bool {
	var f *failedError
	return errors.As(err, &f)
}

// Result is what Do did.
type Result struct {
	// Ran is true when this call was admitted and ran fn; false when it returns the outcome
	// of another attempt that held the key (a duplicate).
	Ran bool
	// Operation is the operation as last seen: this attempt's, after its outcome was
	// recorded, or the holder's with its outcome.
	Operation *Operation
	// Outcome is Operation.Outcome: for a duplicate the holder's status, receipt and stored
	// response, to return instead of running again. nil when none was recorded.
	Outcome *Outcome
}

// Do runs fn at most once per key (docs/reference.md §11): it acquires req and
//
//   - if admitted, runs fn with the Lease and heartbeats the lease while fn runs (Heartbeat:
//     a renew every Duration/3, with extend_ttl so the key stays protected as long as fn
//     runs). When a renew is refused, or none succeeds before the lease's end, fn's context
//     is cancelled with a cause wrapping ErrLeaseLost. Then Do records what fn returned,
//     owner-checked: the Outcome (Status "" means succeeded; StatusFailed is a definite
//     failure that is replayed to duplicates and keeps the key), or for an error marked with
//     Failed the outcome failed with release, or for any other error — its effect is unknown
//     — the outcome uncertain. Do never releases the key on a generic error path; a panic of
//     fn is recorded uncertain and re-panics.
//   - if the key is held by another attempt (a duplicate), waits for that attempt's outcome
//     with WaitOperation (DefaultDoWait at a time, until ctx ends) and returns it with Ran
//     false. If the holder released the key, or its hold ended without an outcome, Do
//     acquires again.
//
// The outcome is recorded with a context that ctx's cancellation cannot end (bounded by
// WithTimeout), so an attempt whose caller gave up still leaves its evidence.
//
// Errors: fn's own error (as fn returned it, with the lease loss joined if there was one),
// after its outcome was recorded; an error recording the outcome (the operation then stays
// in_progress until its lease lapses and becomes uncertain); from acquire
// ErrFingerprintMismatch, ErrInvalidRequest and the other Acquire errors; ErrOutcomeUncertain
// (*Problem with Operation set) when the key's operation is uncertain, from the server's 409
// or because the holder Do waited for ended uncertain — reconcile it, do not run again;
// ErrInvalidRequest when the Outcome's Response cannot be marshalled; the context's error
// while waiting.
func (c *Client) Do(ctx context.Context, req AcquireRequest, fn func(ctx context.Context, lease Lease) (Outcome, error)) (Result, error) {
	if fn == nil {
		return Result{}, invalidArgument("fn", "must not be nil")
	}
	for {
		res, err := c.Acquire(ctx, req)
		if err != nil {
			return Result{}, err
		}
		if res.Admitted != nil {
			return c.run(ctx, res.Admitted, fn)
		}
		op, again, err := c.awaitHolder(ctx, res.Duplicate)
		if err != nil {
			return Result{Operation: op}, err
		}
		if !again {
			return Result{Operation: op, Outcome: op.Outcome}, nil
		}
		req.AttemptID = "" // a new acquire call
	}
}

// awaitHolder waits until the holder op has an outcome. again reports that the key may be
// free now (released, or its hold ended without an outcome): acquire again.
func (c *Client) awaitHolder(ctx context.Context, op *Operation) (_ *Operation, again bool, _ error) {
	for {
		switch op.State {
		case StateSucceeded, StateFailed:
			return op, false, nil
		case StateReleased:
			return op, true, nil
		case StateUncertain:
			return op, false, uncertainProblem(op)
		}
		if !op.Held {
			return op, true, nil
		}
		asked := time.Now()
		d, err := c.WaitOperation(ctx, op.ID, DefaultDoWait)
		if err != nil {
			return op, false, err
		}
		op = &d.Operation
		if err := pauseIfEarly(ctx, asked, op); err != nil {
			return op, false, err
		}
	}
}

// minWaitRound is the shortest time between two long polls of one operation: a server that
// answers a wait early (an older one without ?wait, or a proxy) is not asked in a busy loop.
const minWaitRound = 100 * time.Millisecond

// pauseIfEarly waits out the rest of minWaitRound since asked when op is still in_progress.
func pauseIfEarly(ctx context.Context, asked time.Time, op *Operation) error {
	left := minWaitRound - time.Since(asked)
	if op.State != StateInProgress || left <= 0 {
		return nil
	}
	t := time.NewTimer(left)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// uncertainProblem is the error of a duplicate whose holder ended uncertain, the same the
// server answers an acquire of such a key.
func uncertainProblem(op *Operation) *Problem {
	return &Problem{Type: "about:blank", Title: http.StatusText(http.StatusConflict), Status: http.StatusConflict,
		Code: CodeOutcomeUncertain, Operation: op,
		Detail: "The operation holding this key ended without a known outcome; reconcile it before running again."}
}

// run runs fn for an admission under a heartbeat and records its outcome.
func (c *Client) run(ctx context.Context, adm *Admission, fn func(context.Context, Lease) (Outcome, error)) (res Result, err error) {
	lease := adm.Lease()
	fctx, stop := c.Heartbeat(ctx, lease)
	res.Ran = true
	finished := false
	defer func() {
		if finished {
			return
		}
		// fn panicked: its effect is unknown.
		stop()
		_, _ = c.record(ctx, lease, OutcomeRequest{Status: StatusUncertain, Note: "fn panicked"})
	}()
	out, fnErr := fn(fctx, lease)
	finished = true
	lost := stop()

	req := OutcomeRequest{Status: out.Status, Receipt: out.Receipt, Note: out.Note}
	if len(out.Response) > 0 {
		req.Response = out.Response
	}
	switch {
	case fnErr != nil && IsFailed(fnErr):
		req = OutcomeRequest{Status: StatusFailed, Release: true, Note: noteOf("no effect: ", fnErr)}
	case fnErr != nil:
		req = OutcomeRequest{Status: StatusUncertain, Note: noteOf("effect unknown: ", fnErr)}
	case req.Status == "":
		req.Status = StatusSucceeded
	}
	if fnErr != nil && lost != nil {
		fnErr = fmt.Errorf("%w (%w)", fnErr, lost)
	}
	if req.Response != nil && !json.Valid(out.Response) {
		req = OutcomeRequest{Status: StatusUncertain, Note: "fn returned an Outcome.Response that is not JSON"}
		res.Operation, _ = c.record(ctx, lease, req)
		return res, invalidArgument("response", "Outcome.Response is not valid JSON")
	}
	op, rerr := c.record(ctx, lease, req)
	if rerr != nil && req.Status == StatusUncertain && errors.Is(rerr, ErrInvalidTransition) {
		// uncertain → uncertain is no transition (docs/reference.md §3): the lease lapsed
		// first and the server already marked the operation uncertain. That is the evidence
		// asked for.
		if d, gerr := c.GetOperation(context.WithoutCancel(ctx), lease.OperationID); gerr == nil && d.State == StateUncertain {
			op, rerr = &d.Operation, nil
		}
	}
	res.Operation = op
	if op != nil {
		res.Outcome = op.Outcome
	}
	if fnErr != nil {
		return res, fnErr
	}
	if rerr != nil {
		return res, rerr
	}
	return res, nil
}

// record writes an outcome with a context the caller's cancellation cannot end.
func (c *Client) record(ctx context.Context, lease Lease, req OutcomeRequest) (*Operation, error) {
	req.OwnerToken = lease.OwnerToken
	return c.RecordOutcome(context.WithoutCancel(ctx), lease.OperationID, req)
}

// noteOf is an outcome note from an error, within MaxNoteChars.
func noteOf(prefix string, err error) string {
	s := prefix + err.Error()
	if utf8.RuneCountInString(s) <= MaxNoteChars {
		return s
	}
	r := []rune(s)
	return string(r[:MaxNoteChars-1]) + "…"
}

// Heartbeat keeps lease alive while work runs (docs/reference.md §8): it renews it every
// lease.Duration/3 with extend_ttl (so the key stays protected while the attempt runs) and
// returns a context derived from ctx that it cancels, with a cause wrapping ErrLeaseLost,
// when the server refuses a renew (ErrLeaseExpired, ErrNotOwner, ErrInvalidTransition,
// ErrNotFound) or when no renew succeeded before the lease's local deadline (the time the
// acquire or last successful renew was sent plus lease.Duration, never later than the
// server's). A renew that fails for another reason (idemgate unreachable) is tried again at
// the next beat.
//
// stop ends the heartbeat and waits for it; it returns the lease-loss cause, or nil if the
// lease was kept. Call it exactly once, when the work is done and before recording its
// outcome.
func (c *Client) Heartbeat(ctx context.Context, lease Lease) (_ context.Context, stop func() error) {
	hctx, cancel := context.WithCancelCause(ctx)
	if lease.Duration < time.Second || lease.deadline.IsZero() {
		// Not from an Admission: nothing to renew by.
		return hctx, func() error { cancel(nil); return nil }
	}
	done := make(chan struct{})
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		lost error
	)
	fail := func(err error) {
		mu.Lock()
		if lost == nil {
			lost = err
		}
		mu.Unlock()
		cancel(err)
	}
	wg.Go(func() {
		every := max(lease.Duration/3, 100*time.Millisecond)
		deadline := lease.deadline
		tick := time.NewTicker(every)
		defer tick.Stop()
		expire := time.NewTimer(time.Until(deadline))
		defer expire.Stop()
		for {
			select {
			case <-done:
				return
			case <-hctx.Done():
				return
			case <-expire.C:
				fail(fmt.Errorf("%w: no renew succeeded before the lease's end", ErrLeaseLost))
				return
			case <-tick.C:
			}
			sent := time.Now()
			rctx, rcancel := context.WithDeadline(hctx, deadline)
			_, err := c.Renew(rctx, lease.OperationID, lease.OwnerToken, lease.Duration, true)
			rcancel()
			switch {
			case err == nil:
				deadline = sent.Add(lease.Duration)
				expire.Reset(time.Until(deadline))
			case errors.Is(err, ErrLeaseExpired), errors.Is(err, ErrNotOwner), errors.Is(err, ErrInvalidTransition),
				errors.Is(err, ErrNotFound):
				fail(fmt.Errorf("%w: renew refused: %w", ErrLeaseLost, err))
				return
			}
		}
	})
	var once sync.Once
	return hctx, func() error {
		once.Do(func() {
			close(done)
			wg.Wait()
			cancel(nil)
		})
		mu.Lock()
		defer mu.Unlock()
		return lost
	}
}
