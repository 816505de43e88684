package web

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/idemgate/idemgate/services"
	"github.com/stretchr/testify/require"
)

// TestAPIPolicy: GET /v1/policy answers the defaults in force for an operation and where each
// comes from, and POST /v1/acquire without ttl_seconds takes the policy's TTL; without a
// policy it is refused naming ttl_seconds, and a ttl_seconds of 0 is refused, not read as
// "the policy's". Every answer is checked against the OpenAPI document (apiClient.do).
func TestAPIPolicy(t *testing.T) {
	eachServer(t, func(t *testing.T, s *Server) {
		c := newTenantClient(t, s)
		p := principalOf(t, s, c)

		res := c.do("GET", "/v1/policy?operation=charge", nil)
		require.Equal(t, http.StatusOK, res.status, res.raw)
		require.Equal(t, map[string]any{"tenant": p.TenantName, "operation": "charge", "ttl_seconds": nil, "ttl_from": "default",
			"lease_seconds": nil, "lease_from": "default", "on_expiry": "readmit", "on_expiry_from": "default",
			"retention_seconds": float64(services.DefaultRetention / time.Second), "retention_from": "default",
			"horizon_seconds": nil, "horizon_from": "default"}, res.body)
		problemOf(t, c.do("GET", "/v1/policy?operation=a%20b", nil), http.StatusBadRequest, services.CodeInvalidRequest)

		res = problemOf(t, c.do("POST", "/v1/acquire", map[string]any{"key": "k-no-ttl", "operation": "charge"}),
			http.StatusBadRequest, services.CodeInvalidRequest)
		require.Contains(t, res.raw, `"ttl_seconds"`)

		day := 24 * time.Hour
		_, err := s.policies.Set(context.Background(), services.Installation(), services.PolicyInput{Tenant: p.TenantName, Operation: "charge", TTL: &day,
			OnExpiry: new(services.OnExpiryHold)})
		require.NoError(t, err)
		res = c.do("GET", "/v1/policy?operation=charge", nil)
		require.Equal(t, http.StatusOK, res.status, res.raw)
		require.EqualValues(t, 86400, res.body["ttl_seconds"])
		require.Equal(t, "operation", res.body["ttl_from"])
		require.Equal(t, "hold_until_reconciled", res.body["on_expiry"])
		res = c.do("GET", "/v1/policy", nil)
		require.Nil(t, res.body["ttl_seconds"], "the policy is the operation's alone")
		require.Nil(t, res.body["operation"])

		res = c.do("POST", "/v1/acquire", map[string]any{"key": "k-policy", "operation": "charge"})
		require.Equal(t, http.StatusCreated, res.status, res.raw)
		require.Equal(t, "hold_until_reconciled", res.body["on_expiry"])
		expires, err := time.Parse(time.RFC3339Nano, res.body["expires_at"].(string))
		require.NoError(t, err)
		require.WithinDuration(t, time.Now().Add(day), expires, time.Minute)

		res = problemOf(t, c.do("POST", "/v1/acquire", map[string]any{"key": "k-zero", "operation": "charge", "ttl_seconds": 0}),
			http.StatusBadRequest, services.CodeInvalidRequest)
		require.Contains(t, res.raw, `"ttl_seconds"`)
	})
}
