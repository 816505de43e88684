package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgate/idemgate/web/client"
	"github.com/idemgate/idemgate/web/internal/servertest"
	"github.com/stretchr/testify/require"
)

// Tests of Do, Heartbeat, Renew and WaitOperation (docs/reference.md §8, §11) against the real
// server on both databases. Leases are 1 s; the only waits are for leases to pass, bounded by
// contexts, and nothing asserts how fast anything was.

// waitFor polls cond every 20 ms until it holds or the step's context ends.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	c := ctx(t)
	for !cond() {
		select {
		case <-c.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// hold blocks for d or until ctx ends, whichever is first, and reports whether d passed.
func hold(ctx context.Context, d time.Duration) bool {
	select {
	case <-time.After(d):
		return true
	case <-ctx.Done():
		return false
	}
}

func TestDoHeartbeatKeepsKeyPastFirstLease(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		c := newClient(t, srv)
		other := newClient(t, srv)
		// A 2-second lease, not the 1-second minimum: the heartbeat renews every third of it, so a
		// 1-second lease is lost when one renew is held up for more than about 0.67 s, as
		// happened in a clean-clone .ci/run while other packages loaded the machine (on both
		// databases at once).
		req := client.AcquireRequest{Key: uniqueKey("long"), TTL: 30 * time.Second, Lease: 2 * time.Second}
		var mid *client.AcquireResult
		res, err := c.Do(ctx(t), req, func(fctx context.Context, lease client.Lease) (client.Outcome, error) {
			require.Equal(t, 2*time.Second, lease.Duration)
			require.False(t, lease.LeaseExpiresAt.IsZero(), "the admission names its lease end")
			// Three first leases long and a half: without heartbeats the operation would be uncertain.
			if !hold(fctx, 7*time.Second) {
				return client.Outcome{}, context.Cause(fctx)
			}
			var err error
			mid, err = other.Acquire(fctx, req)
			if err != nil {
				return client.Outcome{}, err
			}
			return client.Outcome{Receipt: "ch_1", Response: json.RawMessage(`{"charge":"ch_1"}`)}, nil
		})
		require.NoError(t, err)
		require.True(t, res.Ran)
		require.NotNil(t, mid.Duplicate, "a duplicate past the first lease still sees the holder")
		require.Equal(t, client.StateInProgress, mid.Duplicate.State, "the heartbeat kept the lease")
		require.True(t, mid.Duplicate.LeaseExpiresAt.After(time.Now().Add(-time.Second)), "the lease end moved on")
		require.Equal(t, client.StateSucceeded, res.Operation.State)
		require.Equal(t, "ch_1", res.Outcome.Receipt)
	})
}

// delayRenews forwards requests to the real server, except that renews are held until the
// lease of the last admission has lapsed at the server (and are then sent whatever their
// context says), so that the server answers them lease_expired.
func delayRenews(t *testing.T) (*http.Client, *atomic.Int64) {
	base := servertest.OwnTransport(t).Transport
	var admittedAt atomic.Int64
	var renews atomic.Int64
	return &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if strings.HasSuffix(r.URL.Path, "/renew") {
			renews.Add(1)
			if wait := time.Until(time.Unix(0, admittedAt.Load()).Add(1500 * time.Millisecond)); wait > 0 {
				<-time.After(wait)
			}
			r = r.Clone(context.Background())
		}
		resp, err := base.RoundTrip(r)
		if err == nil && r.URL.Path == "/v1/acquire" && resp.StatusCode == http.StatusCreated {
			admittedAt.Store(time.Now().UnixNano())
		}
		return resp, err
	})}, &renews
}

func TestDoRefusedRenewCancelsFn(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		hc, renews := delayRenews(t)
		c := newClient(t, srv, client.WithHTTPClient(hc))
		req := client.AcquireRequest{Key: uniqueKey("stalled"), TTL: 30 * time.Second, Lease: time.Second}
		var cause error
		res, err := c.Do(ctx(t), req, func(fctx context.Context, _ client.Lease) (client.Outcome, error) {
			if hold(fctx, 20*time.Second) {
				return client.Outcome{}, errors.New("fn was never cancelled")
			}
			cause = context.Cause(fctx)
			return client.Outcome{}, fctx.Err()
		})
		require.Error(t, err)
		require.NotZero(t, renews.Load())
		require.ErrorIs(t, cause, client.ErrLeaseLost)
		require.ErrorIs(t, cause, client.ErrLeaseExpired, "the server refused the late renew")
		require.ErrorIs(t, err, context.Canceled, "Do returns fn's error")
		require.ErrorIs(t, err, client.ErrLeaseLost, "joined with the lease loss")
		require.True(t, res.Ran)
		require.NotNil(t, res.Operation)
		require.Equal(t, client.StateUncertain, res.Operation.State, "a cancelled fn's effect is unknown")

		// The stalled holder's key is not admitted again while its TTL protects it.
		_, err = newClient(t, srv).Acquire(ctx(t), req)
		require.ErrorIs(t, err, client.ErrOutcomeUncertain)
	})
}

func TestDoGenericErrorRecordsUncertainNotReleased(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		c := newClient(t, srv)
		req := client.AcquireRequest{Key: uniqueKey("psp"), TTL: time.Minute}
		boom := errors.New("psp: read tcp: i/o timeout")
		res, err := c.Do(ctx(t), req, func(context.Context, client.Lease) (client.Outcome, error) {
			return client.Outcome{}, boom
		})
		require.ErrorIs(t, err, boom)
		require.Equal(t, client.StateUncertain, res.Operation.State)
		require.Contains(t, res.Outcome.Note, "i/o timeout")

		kv, err := c.GetKey(ctx(t), req.Key)
		require.NoError(t, err)
		require.True(t, kv.Held, "a generic error never releases the key")

		ran := false
		_, err = c.Do(ctx(t), req, func(context.Context, client.Lease) (client.Outcome, error) {
			ran = true
			return client.Outcome{}, nil
		})
		require.False(t, ran, "an uncertain key is not run again")
		require.ErrorIs(t, err, client.ErrOutcomeUncertain)
		var p *client.Problem
		require.ErrorAs(t, err, &p)
		require.NotNil(t, p.Operation, "the refusal carries the operation to reconcile")
		require.Equal(t, res.Operation.ID, p.Operation.ID)
		require.Equal(t, client.StateUncertain, p.Operation.State)
	})
}

func TestDoFailedReleasesAndRunsAgain(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		c := newClient(t, srv)
		req := client.AcquireRequest{Key: uniqueKey("declined"), TTL: time.Minute}
		declined := errors.New("declined before charging")
		res, err := c.Do(ctx(t), req, func(context.Context, client.Lease) (client.Outcome, error) {
			return client.Outcome{}, client.Failed(declined)
		})
		require.ErrorIs(t, err, declined)
		require.True(t, client.IsFailed(err))
		require.Equal(t, client.StateReleased, res.Operation.State)
		require.Equal(t, client.StatusFailed, res.Outcome.Status)

		res, err = c.Do(ctx(t), req, func(_ context.Context, lease client.Lease) (client.Outcome, error) {
			require.EqualValues(t, 2, lease.FencingToken)
			return client.Outcome{Receipt: "ch_2"}, nil
		})
		require.NoError(t, err)
		require.True(t, res.Ran, "a released key runs again")
		require.Equal(t, client.StateSucceeded, res.Operation.State)
	})
}

func TestDoDuplicateWaitsForHolderOutcome(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		c := newClient(t, srv)
		req := client.AcquireRequest{Key: uniqueKey("wait"), TTL: time.Minute}
		var runs atomic.Int64
		release := make(chan struct{})
		entered := make(chan client.Lease, 1)
		fn := func(_ context.Context, lease client.Lease) (client.Outcome, error) {
			runs.Add(1)
			entered <- lease
			<-release
			return client.Outcome{Receipt: "ch_1", Response: json.RawMessage(`{"charge":"ch_1"}`)}, nil
		}
		var wg sync.WaitGroup
		var first, second client.Result
		var firstErr, secondErr error
		wg.Go(func() { first, firstErr = c.Do(ctx(t), req, fn) })
		lease := <-entered
		wg.Go(func() { second, secondErr = newClient(t, srv).Do(ctx(t), req, fn) })
		// Let the holder finish only once the duplicate is in (its attempt is logged).
		waitFor(t, "the duplicate attempt", func() bool {
			d, err := c.GetOperation(ctx(t), lease.OperationID)
			return err == nil && d.DuplicateAttempts > 0
		})
		close(release)
		wg.Wait()
		require.NoError(t, firstErr)
		require.NoError(t, secondErr)
		require.EqualValues(t, 1, runs.Load(), "fn ran once")
		require.True(t, first.Ran)
		require.False(t, second.Ran, "the duplicate returns the holder's outcome")
		require.Equal(t, lease.OperationID, second.Operation.ID)
		require.Equal(t, client.StateSucceeded, second.Operation.State)
		require.JSONEq(t, `{"charge":"ch_1"}`, string(second.Outcome.Response))
	})
}

func TestRenewAndWaitOperation(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		c := newClient(t, srv)
		res, err := c.Acquire(ctx(t), client.AcquireRequest{Key: uniqueKey("renew"), TTL: 10 * time.Second,
			Lease: 2 * time.Second, OnExpiry: client.OnExpiryHoldUntilReconciled})
		require.NoError(t, err)
		adm := res.Admitted
		require.Equal(t, client.OnExpiryHoldUntilReconciled, adm.OnExpiry)
		require.False(t, adm.LeaseExpiresAt.After(adm.ExpiresAt))

		r, err := c.Renew(ctx(t), adm.OperationID, adm.OwnerToken, 5*time.Second, false)
		require.NoError(t, err)
		require.Equal(t, adm.OperationID, r.OperationID)
		require.Equal(t, adm.FencingToken, r.FencingToken)
		require.False(t, r.LeaseExpiresAt.Before(adm.LeaseExpiresAt))
		require.True(t, r.ExpiresAt.Equal(adm.ExpiresAt), "without extend_ttl the protection window stays")

		r, err = c.Renew(ctx(t), adm.OperationID, adm.OwnerToken, 20*time.Second, true)
		require.NoError(t, err)
		require.True(t, r.ExpiresAt.After(adm.ExpiresAt), "extend_ttl moves the protection window")

		_, err = c.Renew(ctx(t), adm.OperationID, "ot_wrong", 5*time.Second, false)
		require.ErrorIs(t, err, client.ErrNotOwner)
		_, err = c.Renew(ctx(t), adm.OperationID, adm.OwnerToken, 1500*time.Millisecond, false)
		require.ErrorIs(t, err, client.ErrInvalidRequest, "checked before sending")

		// A wait with no outcome answers in_progress after its time.
		d, err := c.WaitOperation(ctx(t), adm.OperationID, time.Second)
		require.NoError(t, err)
		require.Equal(t, client.StateInProgress, d.State)

		// A wait answers once another caller records the outcome.
		done := make(chan *client.OperationDetail, 1)
		go func() {
			d, err := newClient(t, srv).WaitOperation(ctx(t), adm.OperationID, 30*time.Second)
			if err != nil {
				t.Errorf("WaitOperation: %v", err)
			}
			done <- d
		}()
		_, err = c.RecordOutcome(ctx(t), adm.OperationID, client.OutcomeRequest{OwnerToken: adm.OwnerToken,
			Status: client.StatusSucceeded, Receipt: "ch_9"})
		require.NoError(t, err)
		d = <-done
		require.NotNil(t, d)
		require.Equal(t, client.StateSucceeded, d.State)

		_, err = c.Renew(ctx(t), adm.OperationID, adm.OwnerToken, 5*time.Second, false)
		require.ErrorIs(t, err, client.ErrInvalidTransition, "a finished operation has no lease to renew")
	})
}

func TestDoUnreachableRenewsCancelFnAtLeaseEnd(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		base := servertest.OwnTransport(t).Transport
		cut := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if strings.HasSuffix(r.URL.Path, "/renew") {
				return nil, errors.New("network cut")
			}
			return base.RoundTrip(r)
		})}
		c := newClient(t, srv, client.WithHTTPClient(cut))
		req := client.AcquireRequest{Key: uniqueKey("cut"), TTL: 30 * time.Second, Lease: time.Second}
		var cause error
		res, err := c.Do(ctx(t), req, func(fctx context.Context, _ client.Lease) (client.Outcome, error) {
			if hold(fctx, 20*time.Second) {
				return client.Outcome{}, errors.New("fn was never cancelled")
			}
			cause = context.Cause(fctx)
			return client.Outcome{}, fctx.Err()
		})
		require.ErrorIs(t, cause, client.ErrLeaseLost, "no renew got through before the lease's end")
		require.NotErrorIs(t, cause, client.ErrLeaseExpired, "the server never answered a renew")
		require.ErrorIs(t, err, client.ErrLeaseLost)
		require.Equal(t, client.StateUncertain, res.Operation.State)
	})
}

func TestDoConcurrentCallersRunOnce(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		req := client.AcquireRequest{Key: uniqueKey("herd"), TTL: time.Minute, Lease: 2 * time.Second}
		var runs atomic.Int64
		const callers = 8
		results := make([]client.Result, callers)
		errs := make([]error, callers)
		var wg sync.WaitGroup
		for i := range callers {
			c := newClient(t, srv)
			wg.Go(func() {
				results[i], errs[i] = c.Do(ctx(t), req, func(fctx context.Context, lease client.Lease) (client.Outcome, error) {
					runs.Add(1)
					hold(fctx, 300*time.Millisecond) // long enough for the others to arrive
					return client.Outcome{Receipt: "r-1", Response: json.RawMessage(`{"n":1}`)}, nil
				})
			})
		}
		wg.Wait()
		require.EqualValues(t, 1, runs.Load(), "one caller ran fn")
		ran := 0
		for i := range callers {
			require.NoError(t, errs[i])
			if results[i].Ran {
				ran++
			}
			require.Equal(t, client.StateSucceeded, results[i].Operation.State)
			require.Equal(t, "r-1", results[i].Outcome.Receipt)
			require.JSONEq(t, `{"n":1}`, string(results[i].Outcome.Response))
		}
		require.Equal(t, 1, ran)
	})
}
