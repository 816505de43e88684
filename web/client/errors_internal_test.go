package client

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

var now = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func TestDecodeProblem(t *testing.T) {
	h := http.Header{"Content-Type": {"application/problem+json"}, "Retry-After": {"2"}, "X-Request-Id": {"rid-header"}}
	body := `{"type":"about:blank","title":"Bad Request","status":400,"detail":"The request has invalid fields.",
	  "code":"invalid_request","errors":[{"field":"ttl_seconds","message":"must be an integer"}],"request_id":"rid-1"}`
	p := decodeProblem(400, h, []byte(body), now)
	require.Equal(t, &Problem{Type: "about:blank", Title: "Bad Request", Status: 400,
		Detail: "The request has invalid fields.", Code: CodeInvalidRequest,
		Errors: []FieldError{{Field: "ttl_seconds", Message: "must be an integer"}}, RequestID: "rid-1",
		RetryAfter: 2 * time.Second}, p)
	require.True(t, errors.Is(p, ErrInvalidRequest))
	require.False(t, errors.Is(p, ErrNotFound))
	require.Equal(t, "idemgate: 400 invalid_request: The request has invalid fields. [ttl_seconds must be an integer] (request rid-1)", p.Error())

	// The status line wins over the body's status member; headers fill what the body lacks.
	p = decodeProblem(503, h, []byte(`{"status":200,"code":"store_unavailable"}`), now)
	require.Equal(t, 503, p.Status)
	require.Equal(t, "Service Unavailable", p.Title)
	require.Equal(t, "rid-header", p.RequestID)
	require.True(t, p.Temporary())
	require.ErrorIs(t, p, ErrStoreUnavailable)

	// A proxy's HTML page is a Problem without a code.
	p = decodeProblem(502, http.Header{"Content-Type": {"text/html"}}, []byte("<html>\n<h1>502 Bad Gateway</h1></html>"), now)
	require.Empty(t, p.Code)
	require.Equal(t, "<html> <h1>502 Bad Gateway</h1></html>", p.Detail)
	require.True(t, p.Temporary())
	for _, s := range []*Problem{ErrInvalidRequest, ErrUnauthorized, ErrNotOwner, ErrFingerprintMismatch,
		ErrEffectConfirmed, ErrOutcomeUncertain, ErrInvalidTransition, ErrKeyNotHeld, ErrNotFound,
		ErrPayloadTooLarge, ErrStoreUnavailable, ErrRateLimited, ErrInternal} {
		require.NotErrorIs(t, p, s)
	}

	// Every stable code has its sentinel.
	for code, s := range map[string]*Problem{CodeInvalidRequest: ErrInvalidRequest, CodeUnauthorized: ErrUnauthorized,
		CodeNotOwner: ErrNotOwner, CodeFingerprintMismatch: ErrFingerprintMismatch, CodeEffectConfirmed: ErrEffectConfirmed,
		CodeOutcomeUncertain: ErrOutcomeUncertain, CodeInvalidTransition: ErrInvalidTransition, CodeKeyNotHeld: ErrKeyNotHeld,
		CodeNotFound: ErrNotFound, CodePayloadTooLarge: ErrPayloadTooLarge, CodeStoreUnavailable: ErrStoreUnavailable,
		CodeRateLimited: ErrRateLimited, CodeInternal: ErrInternal} {
		b, _ := json.Marshal(map[string]string{"code": code})
		got := decodeProblem(409, http.Header{"Content-Type": {"application/problem+json"}}, b, now)
		require.ErrorIs(t, got, s, code)
	}
}

func TestParseRetryAfter(t *testing.T) {
	for v, want := range map[string]time.Duration{
		"":                              0,
		"0":                             0,
		"2":                             2 * time.Second,
		" 120 ":                         2 * time.Minute,
		"-1":                            0,
		"1.5":                           0,
		"99999999999999999999999":       maxRetryAfter,
		"Sun, 29 Nov 2026 12:00:30 GMT": 30 * time.Second,
		"Sun, 29 Nov 2026 11:00:00 GMT": 0,
		"tomorrow":                      0,
	} {
		require.Equal(t, want, parseRetryAfter(v, now), "%q", v)
	}
}

func TestBackoffIsFullJitter(t *testing.T) {
	p := RetryPolicy{BaseDelay: 100 * time.Millisecond, MaxDelay: 400 * time.Millisecond}.withDefaults()
	for range 200 {
		b := p.backoff()
		for n, limit := range []time.Duration{100, 200, 400, 400, 400} {
			d := b.NextBackOff()
			require.GreaterOrEqual(t, d, time.Duration(0))
			require.LessOrEqual(t, d, limit*time.Millisecond, "try %d", n+1)
		}
	}
}

// FuzzDecodeProblem: any answer decodes without panicking into a Problem that keeps the
// status line, matches sentinels only by its code, and has a log-safe Detail.
func FuzzDecodeProblem(f *testing.F) {
	f.Add(400, "application/problem+json", `{"code":"invalid_request","errors":[{"field":"key","message":"x"}]}`, "2")
	f.Add(502, "text/html", "<h1>bad gateway</h1>", "")
	f.Add(503, "application/json", `{"code":"store_unavailable","status":"x"}`, "Sun, 29 Nov 2026 12:00:30 GMT")
	f.Add(429, "", "\xff\xfe", "99999999999999999999")
	f.Add(409, "application/problem+json", `{"code":"outcome_uncertain","operation":{"id":"op1","state":"uncertain","metadata":null}}`, "")
	f.Add(409, "application/problem+json", `{"code":"outcome_uncertain","operation":{"id":""}}`, "")
	f.Fuzz(func(t *testing.T, status int, ctype, body, retryAfter string) {
		h := http.Header{"Content-Type": {ctype}, "Retry-After": {retryAfter}}
		p := decodeProblem(status, h, []byte(body), now)
		require.Equal(t, status, p.Status)
		require.GreaterOrEqual(t, p.RetryAfter, time.Duration(0))
		require.LessOrEqual(t, p.RetryAfter, maxRetryAfter)
		require.True(t, utf8.ValidString(p.Detail) || p.Code != "" || strings.Contains(ctype, "json"))
		if p.Code == "" {
			require.NotErrorIs(t, p, ErrInvalidRequest)
		} else {
			require.ErrorIs(t, p, &Problem{Code: p.Code})
		}
		if p.Operation != nil {
			require.NotEmpty(t, p.Operation.ID, "an operation is kept only when it names one")
		}
		_ = p.Error()
	})
}

// TestDecodeProblemOperation: a 409 outcome_uncertain acquire carries the operation to
// reconcile (docs/reference.md §8).
func TestDecodeProblemOperation(t *testing.T) {
	h := http.Header{"Content-Type": {"application/problem+json"}}
	p := decodeProblem(409, h, []byte(`{"status":409,"code":"outcome_uncertain","operation":{"id":"op1",
	  "state":"uncertain","state_reason":"lease_expired_without_outcome","fencing_token":3,"metadata":null,
	  "on_expiry":"hold_until_reconciled","lease_expires_at":"2026-11-29T12:00:00Z"}}`), now)
	require.ErrorIs(t, p, ErrOutcomeUncertain)
	require.NotNil(t, p.Operation)
	require.Equal(t, "op1", p.Operation.ID)
	require.Equal(t, StateUncertain, p.Operation.State)
	require.Equal(t, "lease_expired_without_outcome", p.Operation.StateReason)
	require.EqualValues(t, 3, p.Operation.FencingToken)
	require.Equal(t, OnExpiryHoldUntilReconciled, p.Operation.OnExpiry)
	require.Equal(t, now, p.Operation.LeaseExpiresAt)
	require.Nil(t, p.Operation.Metadata)
	require.Nil(t, decodeProblem(409, h, []byte(`{"code":"not_owner"}`), now).Operation)
}

// FuzzParseRetryAfter: never negative, never over the cap, never a panic.
func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{"", "1", "0", "Sun, 29 Nov 2026 12:00:30 GMT", "Sunday, 29-Nov-26 12:00:30 GMT", "1e3", "٣"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		d := parseRetryAfter(v, now)
		require.GreaterOrEqual(t, d, time.Duration(0))
		require.LessOrEqual(t, d, maxRetryAfter)
	})
}

// FuzzAcquireBodyLease: a Lease and TTL either become whole seconds on the wire or are refused
// before sending as invalid_request on their field; OnExpiry is sent as given.
func FuzzAcquireBodyLease(f *testing.F) {
	f.Add(int64(time.Minute), int64(time.Second), "readmit")
	f.Add(int64(time.Minute), int64(1500*time.Millisecond), "hold_until_reconciled")
	f.Add(int64(time.Minute), int64(-time.Second), "")
	f.Add(int64(0), int64(0), "x")
	f.Fuzz(func(t *testing.T, ttl, lease int64, onExpiry string) {
		b, err := acquireBodyOf(AcquireRequest{Key: "k", TTL: time.Duration(ttl), Lease: time.Duration(lease), OnExpiry: onExpiry})
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidRequest)
			var p *Problem
			require.ErrorAs(t, err, &p)
			require.Len(t, p.Errors, 1)
			require.Contains(t, []string{"ttl_seconds", "lease_seconds"}, p.Errors[0].Field)
			return
		}
		require.Equal(t, time.Duration(ttl), time.Duration(b.TTLSeconds)*time.Second)
		require.Equal(t, time.Duration(lease), time.Duration(b.LeaseSeconds)*time.Second)
		require.GreaterOrEqual(t, b.LeaseSeconds, int64(0))
		require.Equal(t, onExpiry, b.OnExpiry)
	})
}
