package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/stretchr/testify/require"
)

// getJSON sends a GET with the test API key and returns the status and decoded body.
func getJSON(t *testing.T, u string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	req.Header.Set("Authorization", "Bearer "+testAPIKey)
	c := &http.Client{Timeout: 90 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return 0, map[string]any{"transport_error": err.Error()}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	return resp.StatusCode, m
}

var csrfField = regexp.MustCompile(`name="_csrf" value="([^"]+)"`)

// reconcileInDashboard signs in to s's dashboard as the bootstrap admin and records status
// as the confirmed outcome of operation id, as an operator would.
func reconcileInDashboard(t *testing.T, s *server, id, status string) {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	csrf := func(path string) string {
		resp, err := c.Get(s.url + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		m := csrfField.FindStringSubmatch(string(body))
		require.NotNil(t, m, "no CSRF token on %s: %s", path, body)
		return m[1]
	}
	resp, err := c.PostForm(s.url+"/login", url.Values{"username": {"admin"}, "password": {"process-test-password"},
		"_csrf": {csrf("/login")}})
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	resp, err = c.PostForm(s.url+"/operations/"+id+"/outcome", url.Values{"status": {status}, "receipt": {"ledger-check"},
		"note": {"checked the destination after the holder crashed"}, "_csrf": {csrf("/operations/" + id)}})
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, "the dashboard records the outcome")
}

// TestTwoProcessesHoldUntilReconciledAfterSIGKILL: a holder process acquires with a short
// lease, a short TTL and hold_until_reconciled, and is killed with SIGKILL mid-operation. The
// other instance, on the same PostgreSQL database, never admits the key again, past the TTL
// too: duplicates get 409 outcome_uncertain with the operation. A waiter on the other instance
// learns that the operation became uncertain. Once an operator reconciles it as failed in the
// dashboard, the key is admitted again with the next fencing token.
func TestTwoProcessesHoldUntilReconciledAfterSIGKILL(t *testing.T) {
	dbURL, drop, err := modeltest.CreatePostgres()
	require.NoError(t, err)
	t.Cleanup(drop)
	holder := startServer(t, "DATABASE_URL="+dbURL, "IDEMGATE_REAP_INTERVAL=1s")
	other := startServer(t, "DATABASE_URL="+dbURL, "IDEMGATE_REAP_INTERVAL=1s")

	const key = "crash/charge-42"
	acquireBody := map[string]any{"key": key, "ttl_seconds": 2, "lease_seconds": 1, "on_expiry": "hold_until_reconciled",
		"operation": "charge"}
	status, adm := post(t, holder.url+"/v1/acquire", acquireBody)
	require.Equal(t, http.StatusCreated, status, adm)
	id := adm["operation_id"].(string)
	expires, err := time.Parse(time.RFC3339Nano, adm["expires_at"].(string))
	require.NoError(t, err)

	waited := make(chan map[string]any, 1)
	go func() {
		_, body := getJSON(t, other.url+"/v1/operations/"+id+"?wait=30s")
		waited <- body
	}()

	holder.Kill() // SIGKILL: no outcome, no release, no heartbeat

	// The other instance answers every acquire without admitting it until well past the TTL
	// and several reaper passes.
	sawUncertain := false
	for time.Now().Before(expires.Add(3 * time.Second)) {
		status, body := post(t, other.url+"/v1/acquire", acquireBody)
		switch status {
		case http.StatusOK: // before the lease lapsed: a duplicate of the in_progress holder
			require.Equal(t, "in_progress", body["operation"].(map[string]any)["state"])
		case http.StatusConflict:
			require.Equal(t, "outcome_uncertain", body["code"], body)
			op := body["operation"].(map[string]any)
			require.Equal(t, id, op["id"])
			require.Equal(t, "uncertain", op["state"])
			sawUncertain = true
		default:
			t.Fatalf("acquire on the other instance: %d %v", status, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.True(t, sawUncertain)
	body := <-waited
	require.Equal(t, "uncertain", body["state"], "the waiter on the other instance learned of the lapse: %v", body)
	require.Equal(t, "lease_expired_without_outcome", body["state_reason"])

	reconcileInDashboard(t, other, id, "failed")
	status, next := post(t, other.url+"/v1/acquire", acquireBody)
	require.Equal(t, http.StatusCreated, status, next)
	require.EqualValues(t, 2, next["fencing_token"])
	require.False(t, strings.Contains(other.Log.String(), `"level":"ERROR"`), other.Log.String())
}

// TestTwoProcessesWaitForOutcome: a duplicate waiting on one instance is answered with the
// outcome another instance records.
func TestTwoProcessesWaitForOutcome(t *testing.T) {
	dbURL, drop, err := modeltest.CreatePostgres()
	require.NoError(t, err)
	t.Cleanup(drop)
	a := startServer(t, "DATABASE_URL="+dbURL)
	b := startServer(t, "DATABASE_URL="+dbURL)
	status, adm := post(t, a.url+"/v1/acquire", map[string]any{"key": "wait/two", "ttl_seconds": 600})
	require.Equal(t, http.StatusCreated, status, adm)
	id := adm["operation_id"].(string)
	waited := make(chan map[string]any, 1)
	go func() {
		_, body := getJSON(t, b.url+"/v1/operations/"+id+"?wait=30")
		waited <- body
	}()
	// The waiter may not be registered yet when the outcome lands: then it reads the outcome
	// at once. Either way its answer is the outcome, not the end of the wait.
	time.Sleep(200 * time.Millisecond)
	status, out := post(t, a.url+"/v1/operations/"+id+"/outcome", map[string]any{"owner_token": adm["owner_token"],
		"status": "succeeded", "receipt": "r-1"})
	require.Equal(t, http.StatusOK, status, out)
	body := <-waited
	require.Equal(t, "succeeded", body["state"], body)
}
