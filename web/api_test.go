package web

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/services"
	"github.com/stretchr/testify/require"
)

// apiClient calls the JSON API of one in-process server as one tenant.
type apiClient struct {
	t   *testing.T
	s   *Server
	key string
}

// newTenantClient creates a tenant with its own API key on s.
func newTenantClient(t *testing.T, s *Server) *apiClient {
	t.Helper()
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	secret, err := s.accounts.CreateAPIKey(context.Background(), services.Installation(), "tenant-"+hex.EncodeToString(b), "test", "")
	require.NoError(t, err)
	return &apiClient{t: t, s: s, key: secret}
}

type apiResult struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

func (c *apiClient) do(method, path string, body any) apiResult {
	c.t.Helper()
	var payload []byte
	switch b := body.(type) {
	case nil:
	case string:
		payload = []byte(b)
	case []byte:
		payload = b
	default:
		j, err := json.Marshal(b)
		require.NoError(c.t, err)
		payload = j
	}
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(payload)
	}
	req := httptest.NewRequest(method, path, r)
	req.Header.Set("Content-Type", "application/json")
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	resp, err := c.s.app.Test(req, -1)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	res := apiResult{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	_ = json.Unmarshal(raw, &res.body)
	// Every call is checked against the API contract, so openapi.json cannot drift from the
	// handlers (openapi_test.go).
	checkContract(c.t, exchange{method: method, target: path, header: req.Header, body: payload,
		status: resp.StatusCode, respHeader: resp.Header, respBody: raw})
	return res
}

// problemOf asserts res is a problem+json with status and code, and returns it.
func problemOf(t *testing.T, res apiResult, status int, code string) apiResult {
	t.Helper()
	require.Equal(t, status, res.status, res.raw)
	require.Equal(t, "application/problem+json", res.header.Get("Content-Type"), res.raw)
	require.Equal(t, code, res.body["code"], res.raw)
	require.EqualValues(t, status, res.body["status"])
	require.NotEmpty(t, res.body["request_id"])
	return res
}

func fieldNames(res apiResult) []string {
	var out []string
	errs, _ := res.body["errors"].([]any)
	for _, e := range errs {
		out = append(out, e.(map[string]any)["field"].(string))
	}
	return out
}

func eachServer(t *testing.T, fn func(t *testing.T, s *Server)) {
	dbs.Each(t, func(t *testing.T, db *models.DB) { fn(t, newTestServer(t, db)) })
}

func acquire(c *apiClient, key string, extra map[string]any) apiResult {
	body := map[string]any{"key": key, "ttl_seconds": 60}
	for k, v := range extra {
		body[k] = v
	}
	return c.do("POST", "/v1/acquire", body)
}

func TestAPIAcquireStatusCodes(t *testing.T) {
	eachServer(t, func(t *testing.T, s *Server) {
		c := newTenantClient(t, s)
		res := acquire(c, "k1", map[string]any{"operation": "charge", "fingerprint": "holder-fp-7d1e", "metadata": map[string]any{"x": 1}})
		require.Equal(t, 201, res.status, res.raw)
		require.Equal(t, true, res.body["admitted"])
		require.EqualValues(t, 1, res.body["fencing_token"])
		require.Equal(t, "in_progress", res.body["state"])
		require.True(t, strings.HasPrefix(res.body["owner_token"].(string), "ot_"))
		_, err := time.Parse(time.RFC3339, res.body["expires_at"].(string))
		require.NoError(t, err)
		require.NotContains(t, res.raw, "previous_operation")

		dup := acquire(c, "k1", map[string]any{"operation": "charge", "fingerprint": "holder-fp-7d1e"})
		require.Equal(t, 200, dup.status, dup.raw)
		require.Equal(t, false, dup.body["admitted"])
		op := dup.body["operation"].(map[string]any)
		require.Equal(t, res.body["operation_id"], op["id"])
		require.EqualValues(t, 1, op["duplicate_attempts"])
		require.NotContains(t, dup.raw, "owner_token", "a duplicate never learns the owner token")
		require.NotContains(t, dup.raw, "owner_token_hash")

		conflict := problemOf(t, acquire(c, "k1", map[string]any{"operation": "charge", "fingerprint": "f2"}), 422, "fingerprint_mismatch")
		require.NotContains(t, conflict.raw, "holder-fp-7d1e", "the holder's fingerprint is not revealed")
		problemOf(t, acquire(c, "k1", map[string]any{"operation": "refund", "fingerprint": "holder-fp-7d1e"}), 422, "fingerprint_mismatch")
	})
}

// TestAPIAcquireTTLCeiling: with a maximum TTL beyond what the stores hold (as a library user
// of services.NewAdmission could configure), ttl_seconds 2^31 is 400 invalid_request on both
// dialects (it was 500 on PostgreSQL and 201 on SQLite) and 2^31-1 is admitted on both.
func TestAPIAcquireTTLCeiling(t *testing.T) {
	dbs.Each(t, func(t *testing.T, db *models.DB) {
		log := slog.New(slog.DiscardHandler)
		cfg := testConfig(t, db, log)
		cfg.Admission = services.NewAdmission(db, log, 100*24*365*time.Hour)
		c := newTenantClient(t, New(cfg))
		res := problemOf(t, c.do("POST", "/v1/acquire", `{"key":"ttl-2-31","ttl_seconds":2147483648}`), 400, "invalid_request")
		require.Equal(t, []string{"ttl_seconds"}, fieldNames(res))
		require.Equal(t, 201, c.do("POST", "/v1/acquire", `{"key":"ttl-2-31","ttl_seconds":2147483647}`).status)
	})
}

func TestAPIValidation(t *testing.T) {
	eachServer(t, func(t *testing.T, s *Server) {
		c := newTenantClient(t, s)
		cases := []struct {
			name   string
			body   any
			status int
			code   string
			fields []string
		}{
			{"not json", "nope", 400, "invalid_request", nil},
			{"empty body", "", 400, "invalid_request", nil},
			{"array body", "[1]", 400, "invalid_request", nil},
			{"two objects", `{"key":"a","ttl_seconds":1}{}`, 400, "invalid_request", nil},
			{"missing key", `{}`, 400, "invalid_request", []string{"key"}},
			{"missing ttl, no policy gives one", `{"key":"a"}`, 400, "invalid_request", []string{"ttl_seconds"}},
			{"ttl zero", `{"key":"a","ttl_seconds":0}`, 400, "invalid_request", []string{"ttl_seconds"}},
			{"ttl as string", `{"key":"a","ttl_seconds":"60"}`, 400, "invalid_request", []string{"ttl_seconds"}},
			{"ttl fractional", `{"key":"a","ttl_seconds":1.5}`, 400, "invalid_request", []string{"ttl_seconds"}},
			{"ttl zero", `{"key":"a","ttl_seconds":0}`, 400, "invalid_request", []string{"ttl_seconds"}},
			{"ttl over max", `{"key":"a","ttl_seconds":2592001}`, 400, "invalid_request", []string{"ttl_seconds"}},
			{"key as number", `{"key":5,"ttl_seconds":1}`, 400, "invalid_request", []string{"key"}},
			{"metadata array", `{"key":"a","ttl_seconds":1,"metadata":[1]}`, 400, "invalid_request", []string{"metadata"}},
			{"metadata string", `{"key":"a","ttl_seconds":1,"metadata":"x"}`, 400, "invalid_request", []string{"metadata"}},
			{"metadata too big", `{"key":"a","ttl_seconds":1,"metadata":{"x":"` + strings.Repeat("y", 16<<10) + `"}}`, 400, "invalid_request", []string{"metadata"}},
			{"unknown field", `{"key":"a","ttl_seconds":1,"ttl":5}`, 400, "invalid_request", []string{"ttl"}},
			{"key too long", `{"key":"` + strings.Repeat("k", 256) + `","ttl_seconds":1}`, 400, "invalid_request", []string{"key"}},
			{"key control char", `{"key":"a\u0007b","ttl_seconds":1}`, 400, "invalid_request", []string{"key"}},
			{"key whitespace", `{"key":"   ","ttl_seconds":1}`, 400, "invalid_request", []string{"key"}},
			{"bad operation", `{"key":"a","ttl_seconds":1,"operation":"no spaces"}`, 400, "invalid_request", []string{"operation"}},
			{"fingerprint too long", `{"key":"a","ttl_seconds":1,"fingerprint":"` + strings.Repeat("f", 257) + `"}`, 400, "invalid_request", []string{"fingerprint"}},
			{"several bad fields", `{"key":"","ttl_seconds":0,"correlation_id":"` + strings.Repeat("c", 129) + `"}`, 400, "invalid_request", []string{"key", "ttl_seconds", "correlation_id"}},
		}
		for _, tc := range cases {
			res := problemOf(t, c.do("POST", "/v1/acquire", tc.body), tc.status, tc.code)
			if tc.fields != nil {
				require.ElementsMatch(t, tc.fields, fieldNames(res), tc.name)
			}
		}
		// None of the refused requests wrote anything.
		list := c.do("GET", "/v1/attempts", nil)
		require.Equal(t, 200, list.status)
		require.Empty(t, list.body["items"])
	})
}

func TestAPIAuth(t *testing.T) {
	eachServer(t, func(t *testing.T, s *Server) {
		c := newTenantClient(t, s)
		anon := &apiClient{t: t, s: s}
		res := problemOf(t, anon.do("POST", "/v1/acquire", map[string]any{"key": "a", "ttl_seconds": 1}), 401, "unauthorized")
		require.Contains(t, res.header.Get("WWW-Authenticate"), "Bearer")
		bad := &apiClient{t: t, s: s, key: "idg_not_a_real_key_at_all_000000"}
		problemOf(t, bad.do("GET", "/v1/keys", nil), 401, "unauthorized")

		require.Equal(t, 201, acquire(c, "before-revoke", nil).status)
		_, err := s.accounts.RevokeAPIKey(context.Background(), services.Installation(), services.APIKeyRef{Key: c.key})
		require.NoError(t, err)
		deadline := time.Now().Add(5 * time.Second)
		for i := 0; ; i++ {
			res := acquire(c, fmt.Sprintf("after-revoke-%d", i), nil)
			if res.status == 401 {
				break
			}
			require.Equal(t, 201, res.status, "until the cache entry lapses the key still works")
			require.True(t, time.Now().Before(deadline), "a revoked key must stop working within the cache bound")
			time.Sleep(100 * time.Millisecond)
		}
	})
}

func TestAPIReleaseAndOutcome(t *testing.T) {
	eachServer(t, func(t *testing.T, s *Server) {
		c := newTenantClient(t, s)
		a := acquire(c, "order-9", nil)
		require.Equal(t, 201, a.status)
		owner, opID := a.body["owner_token"].(string), a.body["operation_id"].(string)

		problemOf(t, c.do("POST", "/v1/release", map[string]any{"key": "order-9", "owner_token": "ot_wrong"}), 409, "not_owner")
		problemOf(t, c.do("POST", "/v1/release", map[string]any{"key": "never", "owner_token": owner}), 404, "key_not_held")
		problemOf(t, c.do("POST", "/v1/release", map[string]any{"key": "order-9"}), 400, "invalid_request")
		problemOf(t, c.do("POST", "/v1/operations/"+opID+"/outcome", map[string]any{"owner_token": "ot_wrong", "status": "bogus"}), 403, "not_owner")
		problemOf(t, c.do("POST", "/v1/operations/"+opID+"/outcome", map[string]any{"owner_token": owner, "status": "bogus"}), 400, "invalid_request")
		problemOf(t, c.do("POST", "/v1/operations/"+opID+"/outcome", map[string]any{"owner_token": owner, "status": "succeeded", "release": true}), 400, "invalid_request")
		big := `{"owner_token":"` + owner + `","status":"succeeded","response":{"x":"` + strings.Repeat("y", 65<<10) + `"}}`
		problemOf(t, c.do("POST", "/v1/operations/"+opID+"/outcome", big), 413, "payload_too_large")
		problemOf(t, c.do("POST", "/v1/operations/00000000-0000-0000-0000-000000000000/outcome", map[string]any{"owner_token": owner, "status": "succeeded"}), 404, "not_found")
		problemOf(t, c.do("POST", "/v1/operations/not-a-uuid/outcome", map[string]any{"owner_token": owner, "status": "succeeded"}), 404, "not_found")
		got := c.do("GET", "/v1/operations/"+opID, nil)
		require.Equal(t, "in_progress", got.body["state"], "refusals changed nothing")
		require.Nil(t, got.body["outcome"])

		ok := c.do("POST", "/v1/operations/"+opID+"/outcome", map[string]any{"owner_token": owner, "status": "succeeded",
			"receipt": "ch_1", "response": map[string]any{"status": 201, "body": map[string]any{"id": "ch_1"}}})
		require.Equal(t, 200, ok.status, ok.raw)
		require.Equal(t, "succeeded", ok.body["state"])
		out := ok.body["outcome"].(map[string]any)
		require.Equal(t, "ch_1", out["receipt"])
		require.Equal(t, map[string]any{"status": float64(201), "body": map[string]any{"id": "ch_1"}}, out["response"])
		again := c.do("POST", "/v1/operations/"+opID+"/outcome", `{"owner_token":"`+owner+`","status":"succeeded","receipt":"ch_1","response":{"body":{"id":"ch_1"},"status":201}}`)
		require.Equal(t, 200, again.status, "the same outcome again is a no-op")
		problemOf(t, c.do("POST", "/v1/operations/"+opID+"/outcome", map[string]any{"owner_token": owner, "status": "failed"}), 409, "invalid_transition")
		problemOf(t, c.do("POST", "/v1/release", map[string]any{"key": "order-9", "owner_token": owner}), 409, "effect_confirmed")

		dup := acquire(c, "order-9", nil)
		require.Equal(t, 200, dup.status)
		require.Equal(t, "ch_1", dup.body["operation"].(map[string]any)["outcome"].(map[string]any)["receipt"], "duplicates see the stored outcome")

		b := acquire(c, "order-10", nil)
		ob := b.body["owner_token"].(string)
		unc := c.do("POST", "/v1/operations/"+b.body["operation_id"].(string)+"/outcome", map[string]any{"owner_token": ob, "status": "uncertain"})
		require.Equal(t, 200, unc.status, unc.raw)
		problemOf(t, c.do("POST", "/v1/release", map[string]any{"key": "order-10", "owner_token": ob}), 409, "outcome_uncertain")

		d := acquire(c, "order-11", nil)
		rel := c.do("POST", "/v1/release", map[string]any{"key": "order-11", "owner_token": d.body["owner_token"], "reason": "declined"})
		require.Equal(t, 200, rel.status, rel.raw)
		require.Equal(t, true, rel.body["released"])
		require.Equal(t, "released", rel.body["operation"].(map[string]any)["state"])
		require.Equal(t, "declined", rel.body["operation"].(map[string]any)["release_reason"])
		again2 := acquire(c, "order-11", nil)
		require.Equal(t, 201, again2.status)
		require.EqualValues(t, 2, again2.body["fencing_token"])
	})
}

func TestAPIKeyRoundTrip(t *testing.T) {
	eachServer(t, func(t *testing.T, s *Server) {
		c := newTenantClient(t, s)
		for _, key := range []string{"a/b", "x%2Fy", "sp ace", "ключ:платёж/№1", "emoji-🔑", "q?x=1#frag", "plus+sign", "../etc/passwd"} {
			require.Equal(t, 201, acquire(c, key, nil).status, key)
			res := c.do("GET", "/v1/keys/"+url.PathEscape(key), nil)
			require.Equal(t, 200, res.status, "%s: %s", key, res.raw)
			require.Equal(t, key, res.body["key"])
			require.Equal(t, true, res.body["held"])
			require.Equal(t, key, res.body["operation"].(map[string]any)["key"])
			at := c.do("GET", "/v1/attempts?key="+url.QueryEscape(key), nil)
			require.Len(t, at.body["items"], 1, key)
		}
		problemOf(t, c.do("GET", "/v1/keys/never-acquired", nil), 404, "not_found")
	})
}

func TestAPIListsPaginate(t *testing.T) {
	eachServer(t, func(t *testing.T, s *Server) {
		c := newTenantClient(t, s)
		want := map[string]bool{}
		for i := 0; i < 7; i++ {
			k := "page-" + string(rune('a'+i))
			want[k] = true
			require.Equal(t, 201, acquire(c, k, map[string]any{"operation": "op"}).status)
		}
		seen := map[string]bool{}
		cursor := ""
		pages := 0
		for {
			path := "/v1/keys?limit=3&operation=op"
			if cursor != "" {
				path += "&cursor=" + url.QueryEscape(cursor)
			}
			res := c.do("GET", path, nil)
			require.Equal(t, 200, res.status, res.raw)
			pages++
			for _, it := range res.body["items"].([]any) {
				k := it.(map[string]any)["key"].(string)
				require.False(t, seen[k], "key %s on two pages", k)
				seen[k] = true
			}
			next, _ := res.body["next_cursor"].(string)
			if next == "" {
				break
			}
			cursor = next
		}
		require.Equal(t, want, seen)
		require.Equal(t, 3, pages)
		problemOf(t, c.do("GET", "/v1/keys?limit=501", nil), 400, "invalid_request")
		problemOf(t, c.do("GET", "/v1/keys?limit=abc", nil), 400, "invalid_request")
		problemOf(t, c.do("GET", "/v1/keys?cursor=garbage!", nil), 400, "invalid_request")
		problemOf(t, c.do("GET", "/v1/keys?state=done", nil), 400, "invalid_request")
		uncertainOnly := c.do("GET", "/v1/keys?state=uncertain", nil)
		require.Empty(t, uncertainOnly.body["items"])

		at := c.do("GET", "/v1/attempts?result=admitted&limit=5", nil)
		require.Len(t, at.body["items"], 5)
		require.NotEmpty(t, at.body["next_cursor"])
		problemOf(t, c.do("GET", "/v1/attempts?since=yesterday", nil), 400, "invalid_request")
		problemOf(t, c.do("GET", "/v1/attempts?result=maybe", nil), 400, "invalid_request")
		future := c.do("GET", "/v1/attempts?since="+url.QueryEscape(time.Now().Add(time.Hour).UTC().Format(time.RFC3339)), nil)
		require.Empty(t, future.body["items"])
	})
}

func TestOperationalEndpoints(t *testing.T) {
	eachServer(t, func(t *testing.T, s *Server) {
		anon := &apiClient{t: t, s: s}
		require.Equal(t, 200, anon.do("GET", "/healthz", nil).status)
		require.Equal(t, 200, anon.do("GET", "/readyz", nil).status)
		c := newTenantClient(t, s)
		acquire(c, "metric-key", nil)
		m := anon.do("GET", "/metrics", nil)
		require.Equal(t, 200, m.status)
		require.Contains(t, m.raw, `idemgate_acquires_total{result="admitted",tenant="`)
		require.Contains(t, m.raw, `idemgate_http_request_duration_seconds_bucket{method="POST",route="/v1/acquire"`)
		problemOf(t, c.do("GET", "/v1/nope", nil), 404, "not_found")
	})
}

// TestAPIStoredJSONReplaysExactly: a stored response and metadata come back with the bytes the
// client sent (up to insignificant whitespace), including <, > and & that encoding/json
// escapes by default, so a replay that hashes or compares bodies matches. (U+2028 and U+2029
// are still sent as \u2028 and \u2029: encoding/json always escapes them.)
func TestAPIStoredJSONReplaysExactly(t *testing.T) {
	eachServer(t, func(t *testing.T, s *Server) {
		c := newTenantClient(t, s)
		const stored = `{"html":"<b>a & b</b>","esc":"\u00e9\n\u2028","n":1.50}`
		const metadata = `{"note":"<x>&"}`
		res := c.do("POST", "/v1/acquire", `{"key":"exact","ttl_seconds":60,"metadata":`+metadata+`}`)
		require.Equal(t, 201, res.status, res.raw)
		opID, owner := res.body["operation_id"].(string), res.body["owner_token"].(string)
		out := c.do("POST", "/v1/operations/"+opID+"/outcome",
			`{"owner_token":"`+owner+`","status":"succeeded","response":`+stored+`}`)
		require.Equal(t, 200, out.status, out.raw)
		for _, r := range []apiResult{out, c.do("GET", "/v1/operations/"+opID, nil), acquire(c, "exact", nil)} {
			require.Contains(t, r.raw, `"response":`+stored, r.raw)
			require.Contains(t, r.raw, `"metadata":`+metadata, r.raw)
		}
	})
}
