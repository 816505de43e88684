package client_test

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgate/idemgate/web/client"
	"github.com/idemgate/idemgate/web/internal/servertest"
	"github.com/stretchr/testify/require"
)

// AcquireBatch answers each request as Acquire would: an admission, a duplicate of an earlier
// item of the same batch, a conflict, a refusal by the server and one by the client, each in
// its own result, in order.
func TestAcquireBatchOutcomes(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		c := newClient(t, srv)
		a, b := uniqueKey("batch-a"), uniqueKey("batch-b")
		req := client.AcquireRequest{Key: a, TTL: time.Minute, Operation: "charge", Fingerprint: "fp-1"}
		other := req
		other.Fingerprint = "fp-2"
		reqs := []client.AcquireRequest{
			req,
			req,
			other,
			{Key: "", TTL: time.Minute},
			{Key: b, TTL: 1500 * time.Millisecond}, // not whole seconds: refused before sending
			{Key: b, TTL: time.Minute, AttemptID: "mine-1", Metadata: map[string]any{"n": 1}},
			{Key: b, TTL: time.Minute, Metadata: strings.Repeat("x", 10)}, // not an object
		}
		res, err := c.AcquireBatch(ctx(t), reqs)
		require.NoError(t, err)
		require.Len(t, res, len(reqs))
		for i, r := range res {
			require.True(t, (r.Result == nil) != (r.Err == nil), "item %d: exactly one of Result and Err", i)
		}

		first := res[0].Result
		require.NotNil(t, first.Admitted)
		require.Equal(t, a, first.Key)
		require.NotEmpty(t, first.AttemptID, "the client generates an attempt_id per item")
		require.Equal(t, client.StateInProgress, first.Admitted.State)
		require.EqualValues(t, 1, first.Admitted.FencingToken)

		dup := res[1].Result
		require.Nil(t, dup.Admitted)
		require.Equal(t, first.Admitted.OperationID, dup.Duplicate.ID, "the earlier item of the batch holds the key")
		require.NotEqual(t, first.AttemptID, dup.AttemptID, "each item has its own attempt_id")

		require.ErrorIs(t, res[2].Err, client.ErrFingerprintMismatch)
		var p *client.Problem
		require.ErrorAs(t, res[2].Err, &p)
		require.Equal(t, 422, p.Status)
		require.NotEmpty(t, p.RequestID)

		require.ErrorIs(t, res[3].Err, client.ErrInvalidRequest)
		require.ErrorAs(t, res[3].Err, &p)
		require.Equal(t, 400, p.Status)
		require.Equal(t, "key", p.Errors[0].Field)

		require.ErrorIs(t, res[4].Err, client.ErrInvalidRequest)
		require.ErrorAs(t, res[4].Err, &p)
		require.Zero(t, p.Status, "refused by the client, not sent")

		require.NotNil(t, res[5].Result.Admitted)
		require.Equal(t, "mine-1", res[5].Result.AttemptID)

		require.ErrorIs(t, res[6].Err, client.ErrInvalidRequest)
		require.ErrorAs(t, res[6].Err, &p)
		require.Equal(t, 400, p.Status, "a metadata string is the server's refusal")
		require.Equal(t, "metadata", p.Errors[0].Field)

		// The key was decided once per item the server saw: b's refused items logged nothing.
		page, err := c.ListAttempts(ctx(t), client.ListAttemptsOptions{Key: b})
		require.NoError(t, err)
		require.Len(t, page.Items, 1)
	})
}

// A batch whose answer was lost is retried with the same attempt_id per item: every admitted
// item is admitted again, for the same operation, instead of becoming a duplicate of itself.
func TestAcquireBatchRetryAfterLostAnswer(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		var dropped atomic.Int32
		var events []client.RetryEvent
		c := newClient(t, srv, client.WithHTTPClient(dropFirstAnswer("/v1/acquire:batch", &dropped)),
			client.WithRetryNotify(func(e client.RetryEvent) { events = append(events, e) }))
		keys := []string{uniqueKey("lost-a"), uniqueKey("lost-b"), uniqueKey("lost-c")}
		var reqs []client.AcquireRequest
		for _, k := range keys {
			reqs = append(reqs, client.AcquireRequest{Key: k, TTL: time.Minute, Fingerprint: "fp"})
		}
		reqs = append(reqs, reqs[0]) // a duplicate of the first item, in the same batch
		res, err := c.AcquireBatch(ctx(t), reqs)
		require.NoError(t, err)
		require.EqualValues(t, 2, dropped.Load(), "the first answer was lost and the call retried")
		require.Len(t, events, 1)
		require.Equal(t, "/v1/acquire:batch", events[0].Path)
		for i, k := range keys {
			r := res[i]
			require.NoError(t, r.Err)
			require.NotNil(t, r.Result.Admitted, "item %d: the retry is admitted again, not a duplicate", i)
			require.EqualValues(t, 1, r.Result.Admitted.FencingToken)
			page, err := c.ListAttempts(ctx(t), client.ListAttemptsOptions{Key: k})
			require.NoError(t, err)
			admitted := 0
			for _, a := range page.Items {
				if a.Result == client.ResultAdmitted {
					admitted++
					require.Equal(t, r.Result.AttemptID, a.AttemptID)
					require.Equal(t, r.Result.Admitted.OperationID, a.OperationID)
				}
			}
			require.Equal(t, 2, admitted, "item %d: both tries admitted with the same attempt_id", i)
		}
		require.NotNil(t, res[3].Result.Duplicate)
		require.Equal(t, res[0].Result.Admitted.OperationID, res[3].Result.Duplicate.ID)
	})
}

// A batch with no request or more than MaxBatchItems is refused before sending.
func TestAcquireBatchArguments(t *testing.T) {
	c, err := client.New("http://127.0.0.1:1", "idg_unused")
	require.NoError(t, err)
	for _, n := range []int{0, client.MaxBatchItems + 1} {
		reqs := make([]client.AcquireRequest, n)
		for i := range reqs {
			reqs[i] = client.AcquireRequest{Key: "k", TTL: time.Minute}
		}
		res, err := c.AcquireBatch(ctx(t), reqs)
		require.Nil(t, res)
		require.ErrorIs(t, err, client.ErrInvalidRequest)
		var p *client.Problem
		require.ErrorAs(t, err, &p)
		require.Zero(t, p.Status, "nothing was sent")
	}
}
