// Package client is the Go client of idemgate's JSON API (docs/reference.md §4): idempotency-key
// admission for services. It depends only on the standard library, github.com/google/uuid and
// github.com/cenkalti/backoff/v4 — never on the server's packages — so importing it pulls in
// no database driver or ORM.
//
//	idem, err := client.New("http://127.0.0.1:8080", apiKey)
//	res, err := idem.Acquire(ctx, client.AcquireRequest{Key: "charge:order-5521", TTL: 5 * time.Minute,
//		Operation: "charge", Fingerprint: "sha256:…"})
//	switch {
//	case errors.Is(err, client.ErrFingerprintMismatch): // 422: the key is held by a different request
//	case err != nil: // idemgate unreachable after retries, or a refusal: do not run unguarded
//	case res.Duplicate != nil: // 200: an earlier attempt holds the key; return its outcome
//		return res.Duplicate.Outcome
//	default: // 201: this attempt may run
//		adm := res.Admitted
//		receipt, err := charge(ctx, adm.FencingToken)
//		// then record what happened, owner-checked; safe to retry
//		_, err = idem.RecordOutcome(ctx, adm.OperationID, client.OutcomeRequest{
//			OwnerToken: adm.OwnerToken, Status: client.StatusSucceeded, Receipt: receipt})
//	}
//
// Do does all of that in one call (docs/reference.md §11): it acquires, runs fn while it
// heartbeats the lease (Renew every Lease/3; fn's context is cancelled when the lease is lost),
// records fn's outcome — an error not marked with Failed is recorded uncertain, never released —
// and, for a duplicate, waits for the holder's outcome (WaitOperation) and returns it:
//
//	res, err := idem.Do(ctx, client.AcquireRequest{Key: "charge:order-5521", TTL: time.Hour, Lease: 30 * time.Second},
//		func(ctx context.Context, lease client.Lease) (client.Outcome, error) {
//			receipt, err := charge(ctx, lease.FencingToken)
//			return client.Outcome{Receipt: receipt}, err
//		})
//
// Errors are *Problem values (RFC 9457 problem details with idemgate's `code`); match them
// with errors.Is against the Err… sentinels, one per stable code.
//
// Calls are retried with exponential backoff and full jitter (RetryPolicy) on network errors,
// per-try timeouts, 429, 502, 503 and 504, honouring Retry-After, and never on other
// answers. Retrying is safe for every method: Acquire always sends an attempt_id, kept across
// its retries, so a retry after a lost 201 gets the same admission back.
//
// For Fiber services, package fibermw wraps all of this as Idempotency-Key middleware.
package client
