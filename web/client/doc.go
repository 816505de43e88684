// Package client is the Go client of idemgate's JSON API (docs/reference.md §4): idempotency-key
// admission for services. It depends only on the standard library, github.com/google/uuid and
// github.com/cenkalti/backoff/v4 — never on the server's packages — so importing it pulls in
// no database driver or ORM. For Fiber services, package fibermw wraps it as Idempotency-Key
// middleware.
//
// # Acquire, run, record
//
// Acquire before the effect; exactly one attempt per key is admitted. Run the effect only when
// admitted, then record its outcome with the owner token:
//
//	idem, err := client.New("http://127.0.0.1:8080", apiKey,
//		client.WithTimeout(10*time.Second),                  // whole call, retries included
//		client.WithRetry(client.RetryPolicy{MaxAttempts: 4})) // backoff 100 ms…2 s, full jitter
//	res, err := idem.Acquire(ctx, client.AcquireRequest{Key: "charge:order-5521", TTL: 5 * time.Minute,
//		Operation: "charge", Fingerprint: "sha256:9f86d0…"})
//	switch {
//	case errors.Is(err, client.ErrFingerprintMismatch): // 422: the key is held by a different request
//	case err != nil: // idemgate unreachable after retries, or a refusal: do not run unguarded
//	case res.Duplicate != nil: // 200: an earlier attempt holds the key; return its outcome
//		return res.Duplicate.Outcome // status, receipt, stored response (nil while it runs)
//	default: // 201: this attempt may run; pass the fencing token to the destination
//		adm := res.Admitted
//		receipt, err := charge(ctx, adm.FencingToken)
//		status := client.StatusSucceeded
//		if err != nil {
//			status = client.StatusUncertain // the effect is unknown: an operator reconciles it
//		}
//		// owner-checked, and safe to retry
//		_, err = idem.RecordOutcome(ctx, adm.OperationID, client.OutcomeRequest{
//			OwnerToken: adm.OwnerToken, Status: status, Receipt: receipt,
//			Response: map[string]any{"charge": receipt}}) // replayed to duplicates
//	}
//
// # Do: acquire, run, heartbeat, record in one call
//
// Do does all of that (docs/reference.md §11); psp stands for your payment provider's client:
//
//	res, err := idem.Do(ctx, client.AcquireRequest{Key: "charge:order-5521", TTL: 24 * time.Hour,
//		Lease: 30 * time.Second, OnExpiry: client.OnExpiryHoldUntilReconciled},
//		func(ctx context.Context, lease client.Lease) (client.Outcome, error) {
//			ch, err := psp.Charge(ctx, 1200, lease.FencingToken)
//			if errors.Is(err, psp.ErrDeclinedBeforeCharging) {
//				return client.Outcome{}, client.Failed(err) // no effect: failed + released, a retry may run
//			} else if err != nil {
//				return client.Outcome{}, err // effect unknown: recorded uncertain, never released
//			}
//			return client.Outcome{Receipt: ch.ID, Response: json.RawMessage(ch.JSON)}, nil // succeeded
//		})
//	switch {
//	case errors.Is(err, client.ErrOutcomeUncertain): // an earlier attempt's outcome is unknown:
//		var p *client.Problem                          // reconcile p.Operation, do not charge again
//		errors.As(err, &p)
//	case err != nil: // fn's error (recorded), or idemgate's refusal
//	case res.Ran: // this call charged
//	default: // another attempt held the key: Do waited for it; res.Outcome is its receipt and response
//	}
//
// Around fn, Do takes care of:
//
//   - Heartbeat: while fn runs, Do renews the lease every Lease/3 (Renew with extend_ttl, so
//     the key stays protected as long as fn runs). If a renew is refused (lease_expired,
//     not_owner, …) or none succeeds before the lease ends, fn's context is cancelled with a
//     cause wrapping ErrLeaseLost. Without Lease the lease is the TTL.
//   - Outcomes: fn's Outcome is recorded (Status "" means StatusSucceeded; StatusFailed is a
//     definite result replayed to duplicates); an error marked with Failed records failed and
//     releases the key; any other error, and a panic, records uncertain. Do never releases
//     the key from a generic error path.
//   - Waiting: a duplicate waits for the holder's outcome with WaitOperation (a long poll of
//     GET /v1/operations/{id}?wait=30s, repeated until ctx ends) and returns it with Ran
//     false; if the holder released the key, Do acquires again.
//
// Client.Heartbeat(ctx, adm.Lease()) gives the same heartbeat to code that calls Acquire
// itself; Renew and WaitOperation are the single calls.
//
// # Methods
//
// Do, Acquire, AcquireBatch (up to MaxBatchItems acquires in one request), Heartbeat, Renew,
// WaitOperation, Release, RecordOutcome, GetKey, GetOperation, ListKeys, ListOperations (the
// reconciliation queue) and ListAttempts.
//
// # Errors
//
// Errors are *Problem values: RFC 9457 problem details with idemgate's stable Code, and
// Status, Title, Detail, RequestID, the invalid fields in Errors, and RetryAfter. Match them
// with errors.Is against the Err… sentinels, one per stable code (ErrNotOwner,
// ErrFingerprintMismatch, ErrOutcomeUncertain, ErrLeaseExpired, ErrStoreUnavailable, …). An
// acquire refused with outcome_uncertain carries the uncertain operation in Problem.Operation.
//
// # Retries
//
// Calls are retried with exponential backoff and full jitter (RetryPolicy) on network errors,
// per-try timeouts (RetryPolicy.TryTimeout, 10 s), 429, 502, 503 and 504, waiting at least
// Retry-After, and never on any other answer. Every method is safe to retry:
//
//   - Acquire always sends an attempt_id (generated if you give none) that stays the same
//     across its retries, so a retry after a lost 201 gets the same operation and fencing
//     token back instead of a duplicate. A 201 whose state is not in_progress is never
//     reported as Admitted: it is an error wrapping ErrUnexpectedAnswer.
//   - Outcomes are idempotent by owner token; reads change nothing.
//   - A retried Release whose first answer was lost is told key_not_held by the server (the
//     hold is gone); with ReleaseRequest.OperationID set the client checks the operation and
//     returns it as released instead of the error.
//
// The tests of this package and of fibermw run against a real idemgate server (PostgreSQL and
// SQLite) on a loopback port: go test -race ./web/client/...
package client
