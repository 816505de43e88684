package web

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/services"
	"github.com/stretchr/testify/require"
)

// lapse moves operation id's lease end into the past, as if its holder stalled.
func lapse(t *testing.T, db *models.DB, id string) {
	t.Helper()
	require.NoError(t, db.Model(&models.Operation{}).Where("id = ?", id).
		Update("lease_expires_at", time.Now().UTC().Add(-2*time.Second)).Error)
}

// TestAPILeaseAndRenew: lease_seconds and on_expiry on acquire, the operation's lease in its
// JSON, renew's answers, and a duplicate of a lapsed lease answered 409 outcome_uncertain with
// the operation in the problem (docs/reference.md §8).
func TestAPILeaseAndRenew(t *testing.T) {
	t.Parallel()
	dbs.Each(t, func(t *testing.T, db *models.DB) {
		s := newTestServer(t, db)
		c := newTenantClient(t, s)
		key := "lease-api-" + dashRandom()
		for extra, field := range map[string]string{`"lease_seconds":61`: "lease_seconds", `"lease_seconds":0`: "lease_seconds",
			`"on_expiry":"never"`: "on_expiry"} {
			res := problemOf(t, c.do("POST", "/v1/acquire", `{"key":"`+key+`","ttl_seconds":60,`+extra+`}`), 400, services.CodeInvalidRequest)
			require.Equal(t, []string{field}, fieldNames(res))
		}
		res := acquire(c, key, map[string]any{"lease_seconds": 20, "on_expiry": "hold_until_reconciled"})
		require.Equal(t, http.StatusCreated, res.status, res.raw)
		require.Equal(t, "hold_until_reconciled", res.body["on_expiry"])
		lease, err := time.Parse(time.RFC3339Nano, res.body["lease_expires_at"].(string))
		require.NoError(t, err)
		expires, _ := time.Parse(time.RFC3339Nano, res.body["expires_at"].(string))
		require.Equal(t, 40*time.Second, expires.Sub(lease))
		id, owner := res.body["operation_id"].(string), res.body["owner_token"].(string)

		op := c.do("GET", "/v1/operations/"+id, nil)
		require.Equal(t, res.body["lease_expires_at"], op.body["lease_expires_at"])
		require.Equal(t, "hold_until_reconciled", op.body["on_expiry"])

		renew := "/v1/operations/" + id + "/renew"
		problemOf(t, c.do("POST", renew, map[string]any{"owner_token": "ot_wrong", "lease_seconds": 30}), 403, services.CodeNotOwner)
		// Issue 28 item 7: the token is checked before the other fields, as for outcomes.
		problemOf(t, c.do("POST", renew, map[string]any{"owner_token": "ot_wrong"}), 403, services.CodeNotOwner)
		problemOf(t, c.do("POST", renew, map[string]any{"owner_token": "ot_wrong", "lease_seconds": 0}), 403, services.CodeNotOwner)
		bad := problemOf(t, c.do("POST", renew, map[string]any{"owner_token": owner}), 400, services.CodeInvalidRequest)
		require.Equal(t, []string{"lease_seconds"}, fieldNames(bad))
		problemOf(t, c.do("POST", renew, map[string]any{"owner_token": owner, "lease_seconds": 2592001}), 400, services.CodeInvalidRequest)
		problemOf(t, c.do("POST", "/v1/operations/00000000-0000-0000-0000-000000000000/renew",
			map[string]any{"owner_token": owner, "lease_seconds": 30}), 404, services.CodeNotFound)
		ok := c.do("POST", renew, map[string]any{"owner_token": owner, "lease_seconds": 30, "extend_ttl": false})
		require.Equal(t, http.StatusOK, ok.status, ok.raw)
		require.Equal(t, id, ok.body["operation_id"])
		require.Equal(t, res.body["expires_at"], ok.body["expires_at"])
		require.EqualValues(t, 1, ok.body["fencing_token"])

		lapse(t, db, id)
		dup := problemOf(t, acquire(c, key, nil), http.StatusConflict, services.CodeOutcomeUncertain)
		held := dup.body["operation"].(map[string]any)
		require.Equal(t, id, held["id"])
		require.Equal(t, "uncertain", held["state"])
		require.Equal(t, services.ReasonLeaseExpired, held["state_reason"])
		problemOf(t, c.do("POST", renew, map[string]any{"owner_token": owner, "lease_seconds": 30}), http.StatusConflict, services.CodeLeaseExpired)

		// In a batch the item is answered exactly so.
		batch := c.do("POST", "/v1/acquire:batch", map[string]any{"items": []any{map[string]any{"key": key, "ttl_seconds": 60}}})
		require.Equal(t, http.StatusOK, batch.status, batch.raw)
		item := batch.body["results"].([]any)[0].(map[string]any)
		require.EqualValues(t, http.StatusConflict, item["status"])
		require.Equal(t, services.CodeOutcomeUncertain, item["problem"].(map[string]any)["code"])
	})
}

// TestAPIReleaseAfterLeaseLapsed: POST /v1/release by the owner of an operation whose lease
// lapsed within its TTL is 409 outcome_uncertain whether or not the reaper ran, the operation
// is uncertain (lease_expired_without_outcome) and the key stays protected; the owner's late
// outcome still lands (docs/reference.md §8).
func TestAPIReleaseAfterLeaseLapsed(t *testing.T) {
	t.Parallel()
	dbs.Each(t, func(t *testing.T, db *models.DB) {
		s := newTestServer(t, db)
		c := newTenantClient(t, s)
		key := "lease-release-" + dashRandom()
		res := acquire(c, key, map[string]any{"lease_seconds": 1})
		require.Equal(t, http.StatusCreated, res.status, res.raw)
		id, owner := res.body["operation_id"].(string), res.body["owner_token"].(string)
		lapse(t, db, id)
		problemOf(t, c.do("POST", "/v1/release", map[string]any{"key": key, "owner_token": owner}), http.StatusConflict, services.CodeOutcomeUncertain)
		op := c.do("GET", "/v1/operations/"+id, nil)
		require.Equal(t, "uncertain", op.body["state"], op.raw)
		require.Equal(t, services.ReasonLeaseExpired, op.body["state_reason"])
		problemOf(t, acquire(c, key, nil), http.StatusConflict, services.CodeOutcomeUncertain)
		out := c.do("POST", "/v1/operations/"+id+"/outcome", map[string]any{"owner_token": owner, "status": "succeeded"})
		require.Equal(t, http.StatusOK, out.status, out.raw)
		require.Equal(t, "succeeded", out.body["state"])
	})
}

// TestAPIWait: GET /v1/operations/{id}?wait= validates wait, answers on the outcome (200 with
// the new state), at the end of the wait (200, in_progress), and 503 too_many_waiters with
// Retry-After past the instance's cap.
func TestAPIWait(t *testing.T) {
	t.Parallel()
	dbs.Each(t, func(t *testing.T, db *models.DB) {
		log := slog.New(slog.NewTextHandler(io.Discard, nil))
		cfg := testConfig(t, db, log)
		aw := services.NewAwaiter(db, services.AwaiterConfig{MaxWaiters: 1})
		ctx, stop := context.WithCancel(context.Background())
		go aw.Run(ctx)
		t.Cleanup(stop)
		cfg.Awaiter = aw
		s := New(cfg)
		c := newTenantClient(t, s)
		res := acquire(c, "wait-api-"+dashRandom(), nil)
		require.Equal(t, http.StatusCreated, res.status, res.raw)
		id, owner := res.body["operation_id"].(string), res.body["owner_token"].(string)
		path := "/v1/operations/" + id

		for _, w := range []string{"abc", "61", "61s", "-1s", "2m", "1e3", "+5s", "5x"} {
			bad := problemOf(t, c.do("GET", path+"?wait="+w, nil), 400, services.CodeInvalidRequest)
			require.Equal(t, []string{"wait"}, fieldNames(bad), w)
		}
		start := time.Now()
		timeout := c.do("GET", path+"?wait=0.3", nil)
		require.Equal(t, http.StatusOK, timeout.status, timeout.raw)
		require.Equal(t, "in_progress", timeout.body["state"])
		require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)

		// A second waiter while one waits is past the cap of 1.
		done := make(chan *http.Response, 1)
		go func() {
			resp, err := s.app.Test(authed(httptest.NewRequest("GET", path+"?wait=30s", nil), c.key), -1)
			if err != nil {
				resp = nil
			}
			done <- resp
		}()
		require.Eventually(t, func() bool { return aw.Waiting() == 1 }, 5*time.Second, time.Millisecond)
		over := problemOf(t, c.do("GET", path+"?wait=30", nil), http.StatusServiceUnavailable, services.CodeTooManyWaiters)
		require.NotEmpty(t, over.header.Get("Retry-After"))
		metrics := (&apiClient{t: t, s: s}).do("GET", "/metrics", nil)
		require.Contains(t, metrics.raw, "idemgate_waiting_requests 1")

		out := c.do("POST", path+"/outcome", map[string]any{"owner_token": owner, "status": "succeeded"})
		require.Equal(t, http.StatusOK, out.status, out.raw)
		resp := <-done
		require.NotNil(t, resp)
		body, _ := io.ReadAll(resp.Body)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		require.True(t, strings.Contains(string(body), `"state":"succeeded"`), string(body))
	})
}

func authed(r *http.Request, key string) *http.Request {
	r.Header.Set("Authorization", "Bearer "+key)
	return r
}

// FuzzParseWait: the wait parser accepts exactly durations from 0 to services.MaxWait, and
// refuses everything else as invalid_request on field wait, never panicking.
func FuzzParseWait(f *testing.F) {
	for _, s := range []string{"", "0", "30", "30s", "60", "60s", "61", "1m", "1m1s", "500ms", "2.5", "-1s", "1e3", "abc",
		"+5s", ".", "1.", "9999999999999999999999", "0.000000001", "1h", "60.0000001"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := parseWait(s)
		if err != nil {
			var de *services.Error
			require.ErrorAs(t, err, &de)
			require.Equal(t, services.CodeInvalidRequest, de.Code)
			require.Equal(t, "wait", de.Fields[0].Field)
			return
		}
		require.GreaterOrEqual(t, d, time.Duration(0))
		require.LessOrEqual(t, d, services.MaxWait)
	})
}

// FuzzDecodeRenew: a renew body decodes (strictly, owner_token required) or is refused as
// invalid_request; a decoded one validates exactly when lease_seconds is 1 to 2592000, the
// default maximum TTL (an absent one decodes as 0, refused by Validate after the owner check).
func FuzzDecodeRenew(f *testing.F) {
	for _, s := range []string{`{"owner_token":"ot_x","lease_seconds":30}`, `{"owner_token":"ot_x","lease_seconds":30,"extend_ttl":true}`,
		`{"owner_token":"ot_x"}`, `{"lease_seconds":1}`, `{"owner_token":"ot_x","lease_seconds":0}`, `{"owner_token":"ot_x","lease_seconds":2592001}`,
		`{"owner_token":"ot_x","lease_seconds":1.5}`, `{"owner_token":"ot_x","lease_seconds":30,"x":1}`, `[]`, `null`, ``,
		`{"owner_token":"a","owner_token":"b","lease_seconds":3}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		in, err := decodeRenew(body)
		if err != nil {
			var de *services.Error
			require.ErrorAs(t, err, &de)
			require.Equal(t, services.CodeInvalidRequest, de.Code)
			return
		}
		verr := in.Validate(services.DefaultMaxTTL)
		require.Equal(t, in.LeaseSeconds >= 1 && in.LeaseSeconds <= 2592000, verr == nil, "lease_seconds %d", in.LeaseSeconds)
	})
}

// TestDashboardShowsLease: the operation page shows the lease end next to the TTL and the
// expiry policy; the Keys page shows the lease left beside the TTL and flags a
// hold_until_reconciled key.
func TestDashboardShowsLease(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		op, lease, policy := f.op, int64(100), services.OnExpiryHold
		acq, err := f.s.adm.Acquire(context.Background(), f.pA, services.AcquireInput{Key: "leased-" + dashRandom(), TTLSeconds: 300,
			Operation: &op, LeaseSeconds: &lease, OnExpiry: &policy})
		require.NoError(t, err)
		b := newDashBrowser(t, f.s)
		b.mustLogin(f.restricted)

		page := b.get("/operations/" + acq.OperationID)
		require.Equal(t, http.StatusOK, page.status, page.body)
		require.Contains(t, page.body, "Lease expires at (UTC)")
		require.Contains(t, page.body, acq.LeaseExpiresAt.UTC().Format("2006-01-02 15:04:05"))
		require.Equal(t, "hold until reconciled", strings.TrimSpace(page.testid("op-on-expiry").Text()))

		keys := b.get(f.keysURL(""))
		require.Equal(t, http.StatusOK, keys.status, keys.body)
		require.Regexp(t, `^lease expires 1m 4\ds$`, strings.TrimSpace(keys.testid("key-lease").Text()))
		require.Equal(t, "hold until reconciled", strings.TrimSpace(keys.testid("key-on-expiry").Text()))
	})
}

// TestWaitEndsWhenClientHangsUp: a waiting request whose client closes the connection stops
// waiting (its waiter slot is freed) long before its wait is over; shutdown releases the rest.
func TestWaitEndsWhenClientHangsUp(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := testConfig(t, dbs.SQLite, log)
	aw := services.NewAwaiter(dbs.SQLite, services.AwaiterConfig{})
	ctx, stop := context.WithCancel(context.Background())
	go aw.Run(ctx)
	t.Cleanup(stop)
	cfg.Awaiter = aw
	s := New(cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan struct{})
	go func() { defer close(served); _ = s.Serve(ln) }()
	c := newTenantClient(t, s)
	res := acquire(c, "wait-hangup-"+dashRandom(), nil)
	require.Equal(t, http.StatusCreated, res.status, res.raw)
	req := "GET /v1/operations/" + res.body["operation_id"].(string) + "?wait=60s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
		c.key + "\r\n\r\n"

	conn, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	_, err = conn.Write([]byte(req))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return aw.Waiting() == 1 }, 5*time.Second, time.Millisecond)
	require.NoError(t, conn.Close())
	require.Eventually(t, func() bool { return aw.Waiting() == 0 }, 10*time.Second, 10*time.Millisecond,
		"the waiter is released when its client hangs up")

	// Shutdown releases a waiter at once: it answers with the current state.
	conn, err = net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.Write([]byte(req))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return aw.Waiting() == 1 }, 5*time.Second, time.Millisecond)
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, s.Shutdown(sctx))
	<-served
	reply, _ := io.ReadAll(conn)
	require.Contains(t, string(reply), "200 OK")
	require.Contains(t, string(reply), `"state":"in_progress"`)
}

// TestAPIWaitAnswersAtLeaseLapse: GET /v1/operations/{id}?wait=8 of an operation with
// lease_seconds 2 answers about when the lease lapses, with state uncertain
// (lease_expired_without_outcome), not after 8 s with in_progress; no reaper runs here
// (docs/reference.md §8).
func TestAPIWaitAnswersAtLeaseLapse(t *testing.T) {
	t.Parallel()
	dbs.Each(t, func(t *testing.T, db *models.DB) {
		log := slog.New(slog.NewTextHandler(io.Discard, nil))
		cfg := testConfig(t, db, log)
		aw := services.NewAwaiter(db, services.AwaiterConfig{})
		ctx, stop := context.WithCancel(context.Background())
		go aw.Run(ctx)
		t.Cleanup(stop)
		cfg.Awaiter = aw
		c := newTenantClient(t, New(cfg))
		res := acquire(c, "wait-lapse-"+dashRandom(), map[string]any{"lease_seconds": 2})
		require.Equal(t, http.StatusCreated, res.status, res.raw)
		id := res.body["operation_id"].(string)
		lease, err := time.Parse(time.RFC3339Nano, res.body["lease_expires_at"].(string))
		require.NoError(t, err)
		start := time.Now()
		op := c.do("GET", "/v1/operations/"+id+"?wait=8", nil)
		took := time.Since(start)
		require.Equal(t, http.StatusOK, op.status, op.raw)
		require.Equal(t, "uncertain", op.body["state"], op.raw)
		require.Equal(t, services.ReasonLeaseExpired, op.body["state_reason"])
		require.False(t, time.Now().Before(lease), "not before the lease end")
		require.Less(t, took, 5*time.Second, "answered at the lapse, not at the end of the wait")
	})
}

// TestKeysShowLapsedLease: a key whose operation's lease lapsed shows it in place of a healthy
// TTL countdown, before the lapse is applied (still in_progress) and after (uncertain,
// lease_expired_without_outcome): "lease lapsed", marked for attention, while the TTL left still
// says how long the key stays protected (issue 28 item 14).
func TestKeysShowLapsedLease(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		op, lease := f.op, int64(1)
		key := "lapsing-" + dashRandom()
		acq, err := f.s.adm.Acquire(context.Background(), f.pA, services.AcquireInput{Key: key, TTLSeconds: 300,
			Operation: &op, LeaseSeconds: &lease})
		require.NoError(t, err)
		b := newDashBrowser(t, f.s)
		b.mustLogin(f.restricted)
		elapse(t, f.db, f.pA, time.Second, key) // the lease of 1 s runs out
		check := func(state string) {
			t.Helper()
			keys := b.get(f.keysURL("prefix=" + key))
			require.Equal(t, http.StatusOK, keys.status, keys.body)
			require.Equal(t, 1, keys.testid("key-row").Length())
			require.Equal(t, state, keys.testid("state-badge").AttrOr("data-state", ""))
			lapsed := keys.testid("key-lease")
			require.Equal(t, "lease lapsed", strings.TrimSpace(lapsed.Text()))
			require.True(t, lapsed.HasClass("lease--lapsed"), "marked, not muted")
			require.True(t, keys.testid("key-row").HasClass("row--attention"))
			require.True(t, keys.testid("key-ttl").HasClass("ttl--protected"), "no healthy countdown")
		}
		check(services.StateInProgress)
		_, err = services.NewReaper(f.db, slog.New(slog.DiscardHandler), 0).RunOnce(context.Background())
		require.NoError(t, err)
		require.Equal(t, services.ReasonLeaseExpired, *f.opDetail(t, f.pA, acq.OperationID).StateReason)
		check(services.StateUncertain)
	})
}
