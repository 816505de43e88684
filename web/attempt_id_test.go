package web

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"testing"

	"github.com/idemgate/idemgate/services"
	"github.com/stretchr/testify/require"
)

// twoKeysOfOneTenant returns clients with two different API keys of one new tenant.
func twoKeysOfOneTenant(t *testing.T, s *Server) (*apiClient, *apiClient) {
	t.Helper()
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	tenant := "tenant-" + hex.EncodeToString(b)
	ka, err := s.accounts.CreateAPIKey(context.Background(), services.Installation(), tenant, "a", "")
	require.NoError(t, err)
	kb, err := s.accounts.CreateAPIKey(context.Background(), services.Installation(), tenant, "b", "")
	require.NoError(t, err)
	return &apiClient{t: t, s: s, key: ka}, &apiClient{t: t, s: s, key: kb}
}

// An attempt_id readable by every key of the tenant (GET /v1/attempts) is no credential: key B
// replaying key A's attempt_id gets an ordinary duplicate or fingerprint mismatch, no owner
// token, and A keeps control of its hold. Once the operation has an outcome, even A's own
// retry is a 200 duplicate: a 201 always means "run the effect now".
func TestAPIAttemptIDBoundToCallerAndInProgress(t *testing.T) {
	eachServer(t, func(t *testing.T, s *Server) {
		a, b := twoKeysOfOneTenant(t, s)
		body := map[string]any{"operation": "charge", "fingerprint": "fp", "attempt_id": "X"}
		first := acquire(a, "pay-42", body)
		require.Equal(t, 201, first.status, first.raw)
		opID := first.body["operation_id"].(string)

		// B reads the attempt_id from the attempt log, as any key of the tenant can.
		log := b.do("GET", "/v1/attempts?key="+url.QueryEscape("pay-42"), nil)
		require.Equal(t, 200, log.status, log.raw)
		require.Equal(t, "X", log.body["items"].([]any)[0].(map[string]any)["attempt_id"])

		stolen := acquire(b, "pay-42", body)
		require.Equal(t, 200, stolen.status, "another key replaying the attempt_id: %s", stolen.raw)
		require.Equal(t, false, stolen.body["admitted"])
		require.NotContains(t, stolen.body, "owner_token")
		require.Equal(t, opID, stolen.body["operation"].(map[string]any)["id"])
		problemOf(t, acquire(b, "pay-42", map[string]any{"operation": "charge", "fingerprint": "other", "attempt_id": "X"}),
			422, "fingerprint_mismatch")

		// A's token still owns the operation; A's own retry still gets it back while in progress.
		retry := acquire(a, "pay-42", body)
		require.Equal(t, 201, retry.status, retry.raw)
		require.Equal(t, opID, retry.body["operation_id"])
		owner := retry.body["owner_token"].(string)
		out := a.do("POST", "/v1/operations/"+opID+"/outcome", map[string]any{"owner_token": owner, "status": "succeeded", "receipt": "ch_9"})
		require.Equal(t, 200, out.status, out.raw)

		after := acquire(a, "pay-42", body)
		require.Equal(t, 200, after.status, "a retry after the outcome: %s", after.raw)
		require.Equal(t, false, after.body["admitted"])
		require.NotContains(t, after.body, "owner_token")
		op := after.body["operation"].(map[string]any)
		require.Equal(t, "succeeded", op["state"])
		require.Equal(t, "ch_9", op["outcome"].(map[string]any)["receipt"])

		log = a.do("GET", "/v1/attempts?key="+url.QueryEscape("pay-42"), nil)
		var results []string
		for _, it := range log.body["items"].([]any) {
			results = append(results, it.(map[string]any)["result"].(string))
		}
		require.Equal(t, []string{"duplicate", "admitted", "conflict", "duplicate", "admitted"}, results)
	})
}
