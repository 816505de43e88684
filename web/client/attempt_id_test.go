package client_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/idemgate/idemgate/web/client"
	"github.com/idemgate/idemgate/web/internal/servertest"
	"github.com/stretchr/testify/require"
)

// Retrying an acquire with its attempt_id after the operation got an outcome is a duplicate:
// the caller is shown the outcome and never told to run the effect again.
func TestAcquireRetryAfterOutcomeIsDuplicate(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		c := newClient(t, srv)
		req := client.AcquireRequest{Key: uniqueKey("done"), TTL: time.Minute, Fingerprint: "fp", AttemptID: "call-1"}
		first, err := c.Acquire(ctx(t), req)
		require.NoError(t, err)
		require.NotNil(t, first.Admitted)
		_, err = c.RecordOutcome(ctx(t), first.Admitted.OperationID, client.OutcomeRequest{
			OwnerToken: first.Admitted.OwnerToken, Status: client.StatusSucceeded, Receipt: "ch_1"})
		require.NoError(t, err)

		again, err := c.Acquire(ctx(t), req)
		require.NoError(t, err)
		require.Nil(t, again.Admitted, "a retry after the outcome must not be told to run the effect")
		require.NotNil(t, again.Duplicate)
		require.Equal(t, first.Admitted.OperationID, again.Duplicate.ID)
		require.Equal(t, client.StateSucceeded, again.Duplicate.State)
		require.Equal(t, "ch_1", again.Duplicate.Outcome.Receipt)
	})
}

// rewrite201State is a transport in front of the real server that changes the state of every
// 201 answer to acquire into state, as a faulty or hostile server (or proxy) might.
func rewrite201State(t *testing.T, state string) *http.Client {
	return &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := http.DefaultTransport.RoundTrip(r)
		if err != nil || r.URL.Path != "/v1/acquire" || resp.StatusCode != http.StatusCreated {
			return resp, err
		}
		raw, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.NoError(t, err)
		var body map[string]any
		require.NoError(t, json.Unmarshal(raw, &body))
		if state == "" {
			delete(body, "state")
		} else {
			body["state"] = state
		}
		raw, err = json.Marshal(body)
		require.NoError(t, err)
		resp.Body = io.NopCloser(bytes.NewReader(raw))
		resp.ContentLength = int64(len(raw))
		resp.Header.Set("Content-Length", strconv.Itoa(len(raw)))
		return resp, nil
	})}
}

// Defence in depth: Admitted means "run the effect now", so the client reports it only for a
// 201 whose state is in_progress. Any other 201 is an error, never an admission.
func TestAcquire201WithAnotherStateIsNotAdmitted(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		for _, state := range []string{client.StateSucceeded, client.StateFailed, client.StateUncertain, client.StateReleased, "", "bogus"} {
			c := newClient(t, srv, client.WithHTTPClient(rewrite201State(t, state)))
			res, err := c.Acquire(ctx(t), client.AcquireRequest{Key: uniqueKey("odd"), TTL: time.Minute})
			require.Error(t, err, "a 201 with state %q must not be reported as admitted", state)
			require.Nil(t, res)
			require.ErrorIs(t, err, client.ErrUnexpectedAnswer)
		}
	})
}
