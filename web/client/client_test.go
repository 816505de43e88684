package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemgate/idemgate/services"
	"github.com/idemgate/idemgate/web/client"
	"github.com/idemgate/idemgate/web/internal/servertest"
	"github.com/stretchr/testify/require"
)

func uniqueKey(prefix string) string { return prefix + ":" + uuid.NewString() }

func TestAcquireOutcomes(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		c := newClient(t, srv)
		key := uniqueKey("charge")
		req := client.AcquireRequest{Key: key, TTL: time.Minute, Operation: "charge", Fingerprint: "sha256:aa",
			CorrelationID: "req-1", Metadata: map[string]any{"amount": 1200}}

		first, err := c.Acquire(ctx(t), req)
		require.NoError(t, err)
		require.NotNil(t, first.Admitted, "a free key is admitted (201)")
		require.Nil(t, first.Duplicate)
		require.Equal(t, key, first.Key)
		require.NotEmpty(t, first.AttemptID, "the client generates an attempt_id")
		adm := first.Admitted
		require.NotEmpty(t, adm.OperationID)
		require.NotEmpty(t, adm.OwnerToken)
		require.EqualValues(t, 1, adm.FencingToken)
		require.Equal(t, client.StateInProgress, adm.State)
		require.True(t, adm.ExpiresAt.After(time.Now().Add(-time.Minute)))
		require.Nil(t, adm.PreviousOperation)

		dup, err := c.Acquire(ctx(t), req)
		require.NoError(t, err)
		require.Nil(t, dup.Admitted, "a held key with the same fingerprint is a duplicate (200)")
		require.NotNil(t, dup.Duplicate)
		require.NotEqual(t, first.AttemptID, dup.AttemptID, "each call gets its own attempt_id")
		op := dup.Duplicate
		require.Equal(t, adm.OperationID, op.ID)
		require.Equal(t, client.StateInProgress, op.State)
		require.Equal(t, "charge", op.Operation)
		require.Equal(t, "sha256:aa", op.Fingerprint)
		require.Equal(t, "req-1", op.CorrelationID)
		require.JSONEq(t, `{"amount":1200}`, string(op.Metadata))
		require.True(t, op.Held)
		require.Nil(t, op.Outcome)

		other := req
		other.Fingerprint = "sha256:bb"
		_, err = c.Acquire(ctx(t), other)
		require.ErrorIs(t, err, client.ErrFingerprintMismatch)
		var p *client.Problem
		require.ErrorAs(t, err, &p)
		require.Equal(t, 422, p.Status)
		require.NotEmpty(t, p.RequestID)
		require.Equal(t, 1, p.Attempts, "a 422 is a decision and is not retried")
	})
}

func TestOutcomeReplayedToDuplicates(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		c := newClient(t, srv)
		key := uniqueKey("invoice")
		req := client.AcquireRequest{Key: key, TTL: time.Hour}
		res, err := c.Acquire(ctx(t), req)
		require.NoError(t, err)
		adm := res.Admitted

		stored := map[string]any{"status": 201, "body": map[string]any{"invoice": "in_1", "note": "<b>&</b>"}}
		out := client.OutcomeRequest{OwnerToken: adm.OwnerToken, Status: client.StatusSucceeded, Receipt: "in_1",
			Response: stored, Note: "sent"}
		op, err := c.RecordOutcome(ctx(t), adm.OperationID, out)
		require.NoError(t, err)
		require.Equal(t, client.StateSucceeded, op.State)
		require.NotNil(t, op.Outcome)
		require.Equal(t, "in_1", op.Outcome.Receipt)
		require.Equal(t, "sent", op.Outcome.Note)
		require.True(t, strings.HasPrefix(op.Outcome.RecordedBy, "api:"))

		d, err := c.GetOperation(ctx(t), adm.OperationID)
		require.NoError(t, err)
		require.NotEmpty(t, d.Events, "the outcome is in the event log")
		require.Equal(t, "outcome_recorded", d.Events[len(d.Events)-1].Kind)

		again, err := c.RecordOutcome(ctx(t), adm.OperationID, out)
		require.NoError(t, err, "the same outcome again succeeds and changes nothing")
		require.Equal(t, op.Outcome.RecordedAt, again.Outcome.RecordedAt)

		dup, err := c.Acquire(ctx(t), req)
		require.NoError(t, err)
		require.NotNil(t, dup.Duplicate)
		require.Equal(t, client.StateSucceeded, dup.Duplicate.State)
		want, _ := json.Marshal(stored)
		require.JSONEq(t, string(want), string(dup.Duplicate.Outcome.Response))

		other := out
		other.Status = client.StatusFailed
		_, err = c.RecordOutcome(ctx(t), adm.OperationID, other)
		require.ErrorIs(t, err, client.ErrInvalidTransition)

		wrong := out
		wrong.OwnerToken = "ot_wrong"
		_, err = c.RecordOutcome(ctx(t), adm.OperationID, wrong)
		require.ErrorIs(t, err, client.ErrNotOwner)
		var p *client.Problem
		require.ErrorAs(t, err, &p)
		require.Equal(t, 403, p.Status, "a wrong owner token on an outcome is 403 (docs/reference.md §4)")

		_, err = c.RecordOutcome(ctx(t), uuid.NewString(), out)
		require.ErrorIs(t, err, client.ErrNotFound)
	})
}

func TestRelease(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		c := newClient(t, srv)
		key := uniqueKey("release")
		req := client.AcquireRequest{Key: key, TTL: time.Minute}
		res, err := c.Acquire(ctx(t), req)
		require.NoError(t, err)
		first := res.Admitted

		op, err := c.Release(ctx(t), client.ReleaseRequest{Key: key, OwnerToken: first.OwnerToken, Reason: "declined"})
		require.NoError(t, err)
		require.Equal(t, client.StateReleased, op.State)
		require.Equal(t, "declined", op.ReleaseReason)
		require.NotNil(t, op.ReleasedAt)
		require.False(t, op.Held)

		// Releasing again (no retry involved): the hold is gone, as docs/reference.md §4 answers.
		_, err = c.Release(ctx(t), client.ReleaseRequest{Key: key, OwnerToken: first.OwnerToken, OperationID: first.OperationID})
		require.ErrorIs(t, err, client.ErrKeyNotHeld)

		res, err = c.Acquire(ctx(t), req)
		require.NoError(t, err)
		second := res.Admitted
		require.NotNil(t, second, "a released key is free again")
		require.EqualValues(t, 2, second.FencingToken)

		_, err = c.Release(ctx(t), client.ReleaseRequest{Key: key, OwnerToken: first.OwnerToken})
		require.ErrorIs(t, err, client.ErrNotOwner, "a stale owner cannot release a newer hold")
		kv, err := c.GetKey(ctx(t), key)
		require.NoError(t, err)
		require.True(t, kv.Held)
		require.Equal(t, second.OperationID, kv.Operation.ID)

		// Nor can one whose operation was not released (its TTL ran out).
		staleKey := uniqueKey("stale")
		res, err = c.Acquire(ctx(t), client.AcquireRequest{Key: staleKey, TTL: time.Second})
		require.NoError(t, err)
		stale := res.Admitted
		srv.Elapse(t, time.Second, staleKey)
		res, err = c.Acquire(ctx(t), client.AcquireRequest{Key: staleKey, TTL: time.Minute})
		require.NoError(t, err)
		require.NotNil(t, res.Admitted, "re-admitted after the TTL")
		_, err = c.Release(ctx(t), client.ReleaseRequest{Key: staleKey, OwnerToken: stale.OwnerToken})
		require.ErrorIs(t, err, client.ErrNotOwner, "a stale owner cannot release a newer hold")
		var p *client.Problem
		require.ErrorAs(t, err, &p)
		require.Equal(t, 409, p.Status)

		_, err = c.RecordOutcome(ctx(t), second.OperationID, client.OutcomeRequest{OwnerToken: second.OwnerToken,
			Status: client.StatusSucceeded})
		require.NoError(t, err)
		_, err = c.Release(ctx(t), client.ReleaseRequest{Key: key, OwnerToken: second.OwnerToken})
		require.ErrorIs(t, err, client.ErrEffectConfirmed)

		key2 := uniqueKey("uncertain")
		res, err = c.Acquire(ctx(t), client.AcquireRequest{Key: key2, TTL: time.Minute})
		require.NoError(t, err)
		_, err = c.RecordOutcome(ctx(t), res.Admitted.OperationID, client.OutcomeRequest{
			OwnerToken: res.Admitted.OwnerToken, Status: client.StatusUncertain, Note: "timeout"})
		require.NoError(t, err)
		_, err = c.Release(ctx(t), client.ReleaseRequest{Key: key2, OwnerToken: res.Admitted.OwnerToken})
		require.ErrorIs(t, err, client.ErrOutcomeUncertain)

		// failed + release frees the key in one call, and repeating it is harmless.
		key3 := uniqueKey("failed")
		res, err = c.Acquire(ctx(t), client.AcquireRequest{Key: key3, TTL: time.Minute})
		require.NoError(t, err)
		fail := client.OutcomeRequest{OwnerToken: res.Admitted.OwnerToken, Status: client.StatusFailed, Release: true}
		op, err = c.RecordOutcome(ctx(t), res.Admitted.OperationID, fail)
		require.NoError(t, err)
		require.Equal(t, client.StateReleased, op.State)
		require.Equal(t, client.StatusFailed, op.Outcome.Status)
		_, err = c.RecordOutcome(ctx(t), res.Admitted.OperationID, fail)
		require.NoError(t, err)
	})
}

func TestReads(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		c := newClient(t, srv)
		// "/", ":", "%" and non-ASCII must round-trip through the path (docs/reference.md §4).
		key := "order/55:21 ü %2F " + uuid.NewString()
		res, err := c.Acquire(ctx(t), client.AcquireRequest{Key: key, TTL: time.Minute, Operation: "ship"})
		require.NoError(t, err)
		_, err = c.Acquire(ctx(t), client.AcquireRequest{Key: key, TTL: time.Minute, Operation: "ship"})
		require.NoError(t, err)
		_, err = c.Acquire(ctx(t), client.AcquireRequest{Key: key, TTL: time.Minute, Operation: "other"})
		require.ErrorIs(t, err, client.ErrFingerprintMismatch)

		kv, err := c.GetKey(ctx(t), key)
		require.NoError(t, err)
		require.Equal(t, key, kv.Key)
		require.True(t, kv.Held)
		require.NotNil(t, kv.ExpiresAt)
		require.NotNil(t, kv.Operation)
		require.Equal(t, res.Admitted.OperationID, kv.Operation.ID)
		require.EqualValues(t, 1, kv.Operation.DuplicateAttempts)
		require.EqualValues(t, 1, kv.Operation.ConflictAttempts)
		require.Nil(t, kv.Operation.Metadata)

		_, err = c.GetKey(ctx(t), "never-acquired-"+uuid.NewString())
		require.ErrorIs(t, err, client.ErrNotFound)

		d, err := c.GetOperation(ctx(t), res.Admitted.OperationID)
		require.NoError(t, err)
		require.Equal(t, key, d.Key)
		require.Len(t, d.Attempts, 3)
		require.Equal(t, client.ResultAdmitted, d.Attempts[0].Result)
		require.Equal(t, res.AttemptID, d.Attempts[0].AttemptID)
		require.Equal(t, client.ResultDuplicate, d.Attempts[1].Result)
		require.Equal(t, client.ResultConflict, d.Attempts[2].Result)
		_, err = c.GetOperation(ctx(t), uuid.NewString())
		require.ErrorIs(t, err, client.ErrNotFound)

		att, err := c.ListAttempts(ctx(t), client.ListAttemptsOptions{Key: key, Result: client.ResultConflict,
			Since: time.Now().Add(-time.Hour)})
		require.NoError(t, err)
		require.Len(t, att.Items, 1)
		require.Equal(t, "other", att.Items[0].Operation)
		require.Equal(t, res.Admitted.OperationID, att.Items[0].OperationID, "the holder the conflict met")

		// Keyset pagination, newest first.
		prefix := "page-" + uuid.NewString()[:8] + "-"
		for i := range 3 {
			_, err := c.Acquire(ctx(t), client.AcquireRequest{Key: fmt.Sprintf("%s%d", prefix, i), TTL: time.Minute})
			require.NoError(t, err)
		}
		var seen []string
		opts := client.ListKeysOptions{Prefix: prefix, Limit: 2, State: client.StateInProgress}
		for {
			page, err := c.ListKeys(ctx(t), opts)
			require.NoError(t, err)
			for _, it := range page.Items {
				seen = append(seen, it.Key)
			}
			if page.NextCursor == "" {
				break
			}
			opts.Cursor = page.NextCursor
		}
		require.Equal(t, []string{prefix + "2", prefix + "1", prefix + "0"}, seen)

		// The reconciliation queue: an operation reported uncertain is listed, paged one by one.
		unsure, err := c.Acquire(ctx(t), client.AcquireRequest{Key: prefix + "unsure", TTL: time.Minute})
		require.NoError(t, err)
		_, err = c.RecordOutcome(ctx(t), unsure.Admitted.OperationID, client.OutcomeRequest{
			OwnerToken: unsure.Admitted.OwnerToken, Status: client.StatusUncertain})
		require.NoError(t, err)
		var queued []string
		qopts := client.ListOperationsOptions{Limit: 1}
		for {
			page, err := c.ListOperations(ctx(t), qopts)
			require.NoError(t, err)
			for _, op := range page.Items {
				require.Equal(t, client.StateUncertain, op.State)
				require.False(t, op.UncertainAt.IsZero(), "uncertain_at of %s", op.ID)
				queued = append(queued, op.ID)
			}
			if page.NextCursor == "" {
				break
			}
			qopts.Cursor = page.NextCursor
		}
		require.Contains(t, queued, unsure.Admitted.OperationID)
		_, err = c.ListOperations(ctx(t), client.ListOperationsOptions{State: client.StateFailed})
		require.ErrorIs(t, err, client.ErrInvalidRequest)

		_, err = c.ListKeys(ctx(t), client.ListKeysOptions{Limit: client.MaxListLimit + 1})
		require.ErrorIs(t, err, client.ErrInvalidRequest)
		var p *client.Problem
		require.ErrorAs(t, err, &p)
		require.Equal(t, 400, p.Status)
		require.Equal(t, "limit", p.Errors[0].Field)
	})
}

func TestTypedErrors(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		c := newClient(t, srv)

		_, err := c.Acquire(ctx(t), client.AcquireRequest{Key: uniqueKey("k")})
		require.ErrorIs(t, err, client.ErrInvalidRequest, "ttl_seconds is required")
		var p *client.Problem
		require.ErrorAs(t, err, &p)
		require.Equal(t, 400, p.Status)
		require.Equal(t, "ttl_seconds", p.Errors[0].Field)
		require.Contains(t, p.Error(), "ttl_seconds")

		_, err = c.Acquire(ctx(t), client.AcquireRequest{Key: uniqueKey("k"), TTL: 1500 * time.Millisecond})
		require.ErrorIs(t, err, client.ErrInvalidRequest)
		require.ErrorAs(t, err, &p)
		require.Zero(t, p.Status, "refused by the client before sending")

		res, err := c.Acquire(ctx(t), client.AcquireRequest{Key: uniqueKey("big"), TTL: time.Minute})
		require.NoError(t, err)
		_, err = c.RecordOutcome(ctx(t), res.Admitted.OperationID, client.OutcomeRequest{
			OwnerToken: res.Admitted.OwnerToken, Status: client.StatusSucceeded,
			Response: strings.Repeat("x", client.MaxResponseBytes)})
		require.ErrorIs(t, err, client.ErrPayloadTooLarge)
		require.ErrorAs(t, err, &p)
		require.Equal(t, 413, p.Status)
		d, err := c.GetOperation(ctx(t), res.Admitted.OperationID)
		require.NoError(t, err)
		require.Equal(t, client.StateInProgress, d.State, "nothing changed")

		var retries int
		bad, err := client.New(srv.URL, "idg_not-a-real-key-at-all-000000",
			client.WithRetryNotify(func(client.RetryEvent) { retries++ }))
		require.NoError(t, err)
		_, err = bad.GetKey(ctx(t), "k")
		require.ErrorIs(t, err, client.ErrUnauthorized)
		require.ErrorAs(t, err, &p)
		require.Equal(t, 401, p.Status)
		require.Zero(t, retries, "401 is not retried")

		// Sentinels match by code only.
		require.NotErrorIs(t, err, client.ErrNotFound)
		require.False(t, errors.Is(&client.Problem{Status: 503}, client.ErrStoreUnavailable))
	})
}

func TestRateLimited(t *testing.T) {
	// Its own server: the failure count is per server process and per client address.
	srv := servertest.Start(t, dbs.SQLite)
	bad, err := client.New(srv.URL, "idg_not-a-real-key-at-all-000000", client.WithRetry(client.RetryPolicy{MaxAttempts: 1}))
	require.NoError(t, err)
	var p *client.Problem
	for i := 0; ; i++ {
		require.Less(t, i, 100, "the server never rate limited")
		_, err := bad.GetKey(ctx(t), "k")
		if errors.Is(err, client.ErrRateLimited) {
			break
		}
		require.ErrorIs(t, err, client.ErrUnauthorized)
	}
	// A valid key from the same address is not refused for the bad one's failures: "k" was
	// never acquired, so the call reaches the server and gets its 404.
	c := newClient(t, srv)
	_, err = c.GetKey(ctx(t), "k")
	require.ErrorIs(t, err, client.ErrNotFound)
	// The bad key stays refused until Retry-After; the client does not wait past the call's
	// deadline for it.
	var retries int
	limited, err := client.New(srv.URL, "idg_not-a-real-key-at-all-000000", client.WithTimeout(5*time.Second),
		client.WithRetryNotify(func(client.RetryEvent) { retries++ }))
	require.NoError(t, err)
	_, err = limited.GetKey(ctx(t), "k")
	require.ErrorIs(t, err, client.ErrRateLimited)
	require.ErrorAs(t, err, &p)
	require.Equal(t, 429, p.Status)
	require.Greater(t, p.RetryAfter, 5*time.Second)
	require.Equal(t, 1, p.Attempts)
	require.Zero(t, retries, "a Retry-After beyond the deadline is not waited for")
}

func TestNew(t *testing.T) {
	for _, u := range []string{"", "127.0.0.1:8080", "ftp://x", "http://", "http://x?y=1"} {
		_, err := client.New(u, "key")
		require.Error(t, err, u)
	}
	_, err := client.New("http://x", " ")
	require.Error(t, err)
	_, err = client.New("https://idemgate.internal/prefix/", "key")
	require.NoError(t, err)
}

// TestAcquireTakesThePolicy: an acquire without a TTL takes its tenant's policy (docs/reference.md
// §2 "Policies"), and the admission's lease, the local deadline Do and Heartbeat keep, is the
// one the server granted, though the request sent none.
func TestAcquireTakesThePolicy(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		p, err := services.NewAuth(srv.DB, nil).Authenticate(context.Background(), srv.APIKey)
		require.NoError(t, err)
		hour, lease := time.Hour, 30*time.Second
		_, err = services.NewPolicies(srv.DB, nil).Set(context.Background(), services.Installation(),
			services.PolicyInput{Tenant: p.TenantName, Operation: "charge", TTL: &hour, Lease: &lease})
		require.NoError(t, err)
		c := newClient(t, srv)

		res, err := c.Acquire(ctx(t), client.AcquireRequest{Key: uniqueKey("policy"), Operation: "charge"})
		require.NoError(t, err)
		require.NotNil(t, res.Admitted)
		require.Equal(t, int64(3600), res.Admitted.TTLSeconds)
		require.Equal(t, int64(30), res.Admitted.LeaseSeconds)
		require.Equal(t, lease, res.Admitted.Lease().Duration, "the granted lease times the local deadline")
		require.WithinDuration(t, time.Now().Add(hour), res.Admitted.ExpiresAt, time.Minute)

		_, err = c.Acquire(ctx(t), client.AcquireRequest{Key: uniqueKey("policy"), Operation: "refund"})
		require.ErrorIs(t, err, client.ErrInvalidRequest, "no policy for refund: the TTL is required")
	})
}
