//go:build ha

package history

// Issue 31: the history checker against a real high-availability cluster while its primary
// fails over (docs/operations.md "High availability"). `make ha` (and `make test`) runs it:
// .ci/ha.sh starts one etcd member and three Patroni nodes of PostgreSQL with synchronous
// replication on loopback, then this test, tagged ha so that a plain `go test ./...` does not
// need the cluster, is run with IDEMGATE_HA=1.

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/testkit"
	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// haScript is the cluster's control script, from this package's directory.
const haScript = "../../.ci/ha.sh"

// ha runs `.ci/ha.sh args...` (bounded: 2 minutes) and returns its standard output, trimmed.
func ha(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, haScript, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "ha.sh %v: %s", args, stderr.String())
	return strings.TrimSpace(string(out))
}

// failover is one primary change the test caused, and what the clients saw around it.
type failover struct {
	// "kill" (SIGKILL of the leader node's Patroni and PostgreSQL: the machine dies),
	// "switchover" (planned, through Patroni) or "crash" (SIGKILL of the leader's PostgreSQL
	// only: its Patroni restarts it in place, no other node is promoted)
	kind     string
	from, to string
	at       time.Time // the fault
	promoted time.Time // when Patroni named the new leader
	// Of the history: the first call made at or after the fault that got no proper answer,
	// and the first 201 answered after it (recovery = admitted - failed).
	failed, admitted time.Time
	seen             map[string]int // answers from the fault to the first 201 after it
}

// failovers is how many faults a run makes (HA_FAILOVERS, default 7: kill, switchover, crash,
// in turn, so five of them change the primary).
func failovers(t *testing.T) int {
	n := 7
	if s := os.Getenv("HA_FAILOVERS"); s != "" {
		var err error
		n, err = strconv.Atoi(s)
		require.NoError(t, err, "HA_FAILOVERS")
	}
	return n
}

// TestHistoryWithFailovers: two idemgate processes on the cluster (DATABASE_URL with all three
// hosts and target_session_attrs=read-write), 16 clients, while the primary fails
// HA_FAILOVERS times (default 7), in turn: an unplanned failover (SIGKILL of the leader node's
// Patroni and PostgreSQL; a standby is promoted when the leader key's TTL ends; the killed node
// is started again and rejoins as a standby), a planned Patroni switchover, and a crash of the
// primary's PostgreSQL alone (SIGKILL; Patroni restarts it in place, with crash recovery).
// Asserts:
//   - every 5xx answer was 503 store_unavailable with Retry-After, never a 500;
//   - the history is linearizable and the database invariants hold on the last primary
//     (checkRun: every 201 a client saw is a row there with its key and fencing token);
//   - no acknowledged outcome or release was lost: each operation an answered outcome or
//     release ended is in that state on the last primary;
//   - every acquire left without an answer is settled by its attempt_id (resolveLostAcquires),
//     and every outcome or release left without one by reading its operation through the API;
//   - a server started while the first failover has no primary waits for the new one and serves;
//   - every webhook event written during the run reaches the receiver, and after the last
//     failover the first server listens again (the second runs with IDEMGATE_LISTEN=false,
//     its waiters polling) and both reapers have passed;
//   - the uncertain queue is complete: once the reapers have passed, no operation is still
//     in_progress, and GET /v1/operations?state=uncertain lists exactly the
//     uncertain operations of the database.
//
// It logs, per failover, the recovery time (the first call without a proper answer to the
// first 201 after it) and what callers were answered meanwhile.
func TestHistoryWithFailovers(t *testing.T) {
	if os.Getenv("IDEMGATE_HA") == "" {
		t.Fatal("needs the HA cluster: run `make ha` (it starts .ci/ha.sh and sets IDEMGATE_HA=1)")
	}
	n := failovers(t)
	ha(t, "wait-healthy", "90")
	t.Setenv("TEST_DATABASE_URL", ha(t, "url", "postgres"))
	dbURL, drop, err := modeltest.CreatePostgres()
	require.NoError(t, err)
	t.Cleanup(drop)
	require.Contains(t, dbURL, "target_session_attrs=read-write")
	// The second server runs without LISTEN (IDEMGATE_LISTEN=false: waiters poll), as on an
	// engine or pooler without it; both must come through the failovers alike.
	ps := startProcs(t, 2, func(i int) []string {
		return append([]string{"DATABASE_URL=" + dbURL, "IDEMGATE_START_TIMEOUT=90s",
			"IDEMGATE_LISTEN=" + strconv.FormatBool(i == 0)}, groupAdmission(i)...)
	})
	hooks := newHookReceiver(t, dbURL) // after the first start made the tenant

	w := newWorkload([]string{ps[0].URL(), ps[1].URL()}, "ha", 10*time.Minute)
	// As in the outage run (faults_test.go): 8 keys, no batches, no leases, clients honour
	// Retry-After, so each failover adds dozens of unknown outcomes rather than hundreds and
	// the check stays within its bound.
	w.spreadKeys(8)
	w.batches, w.leases = false, false
	ft := newFaultTransport(w)
	ft.retryAfter = true
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w.ctx = ctx

	var fos []*failover
	var faultErr error
	// A third server starts while the first failover has no primary yet.
	var late sync.WaitGroup
	var lateStart error
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer cancel() // the workload ends a few seconds after the last failover
		for i := 0; i < n; i++ {
			ha(t, "wait-healthy", "90")
			if !sleepCtx(ctx, 3*time.Second) { // traffic on the healthy cluster first
				return
			}
			fo := &failover{kind: []string{"kill", "switchover", "crash"}[i%3], from: ha(t, "leader")}
			if fo.from == "" {
				faultErr = fmt.Errorf("failover %d: no leader", i+1)
				return
			}
			fo.at = time.Now()
			switch fo.kind {
			case "kill":
				ha(t, "kill", fo.from)
				if i == 0 {
					late.Add(1)
					go func() { defer late.Done(); lateStart = startMidFailover(t, dbURL) }()
				}
			case "crash":
				ha(t, "crash", fo.from)
			default:
				ha(t, "switchover")
			}
			deadline := time.Now().Add(90 * time.Second)
			if fo.kind == "crash" {
				// Until Patroni has seen its PostgreSQL gone (within a loop_wait, 1 s) it still
				// reports the node as a running leader.
				for ha(t, "leader") == fo.from && time.Since(fo.at) < 10*time.Second {
					sleepCtx(ctx, 50*time.Millisecond)
				}
			}
			// After a crash Patroni restarts PostgreSQL on the same node (it still holds the
			// leader key); Patroni names no other leader, so that recovery ends when the node
			// is a running primary again.
			for fo.to == "" || (fo.to == fo.from) != (fo.kind == "crash") {
				if time.Now().After(deadline) {
					faultErr = fmt.Errorf("failover %d (%s of %s): no new leader after 90 s", i+1, fo.kind, fo.from)
					return
				}
				sleepCtx(ctx, 100*time.Millisecond)
				fo.to = ha(t, "leader")
			}
			fo.promoted = time.Now()
			t.Logf("failover %d: %s of %s, %s leads after %s", i+1, fo.kind, fo.from, fo.to,
				fo.promoted.Sub(fo.at).Round(time.Millisecond))
			fos = append(fos, fo)
			if fo.kind == "kill" {
				ha(t, "revive", fo.from)
			}
		}
		ha(t, "wait-healthy", "90")
		sleepCtx(ctx, 4*time.Second) // and traffic after the last one
	}()
	rec, history := w.run(t)
	cancel()
	<-done
	late.Wait()
	require.NoError(t, faultErr)
	require.NoError(t, lateStart, "a server started during a failover")
	require.Len(t, fos, n, "not every failover happened")
	ft.requireOnlyStoreUnavailable(t)
	require.Zero(t, ft.transportError, "a server stopped answering")
	reportRecovery(t, rec, fos)

	checkRun(t, dbURL, w, rec, history)
	checkAcknowledged(t, dbURL, rec)
	settleUnanswered(t, w, rec)
	checkUncertainQueue(t, dbURL, w)
	last := fos[len(fos)-1].promoted
	for i, p := range ps {
		checkRecovered(t, p.URL(), last, i == 0)
	}
	hooks.checkDelivered(t, dbURL)
}

// startMidFailover starts a server while the cluster has no primary (just after its leader
// node was killed): start-up must wait for the new primary, within IDEMGATE_START_TIMEOUT,
// rather than fail (docs/operations.md "High availability").
func startMidFailover(t *testing.T, dbURL string) error {
	p := newProc(t, "DATABASE_URL="+dbURL, "IDEMGATE_START_TIMEOUT=90s")
	start := time.Now()
	if err := p.Launch(); err != nil {
		return err
	}
	if err := testkit.WaitHealthy(p.URL(), 90*time.Second, p.Exited()); err != nil {
		return fmt.Errorf("%w; log:\n%s", err, p.Log.Tail(4000))
	}
	t.Logf("a server started during the first failover answered after %s", time.Since(start).Round(time.Millisecond))
	return nil
}

// checkRecovered: the server's reaper has completed a pass since the last failover and, when
// it listens, its LISTEN connection is up again (on the new primary), read from its /metrics
// (polled for up to 30 s: the listener reconnects with backoff).
func checkRecovered(t *testing.T, base string, since time.Time, listens bool) {
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		resp, err := http.Get(base + "/metrics")
		if !assert.NoError(c, err) {
			return
		}
		defer resp.Body.Close()
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := parser.TextToMetricFamilies(resp.Body)
		if !assert.NoError(c, err) {
			return
		}
		gauge := func(name string) float64 {
			if f := fams[name]; f != nil && len(f.GetMetric()) == 1 {
				return f.GetMetric()[0].GetGauge().GetValue()
			}
			return math.NaN()
		}
		assert.Equal(c, listens, gauge("idemgate_listen_connected") == 1, "%s listening", base)
		assert.Greater(c, gauge("idemgate_reaper_last_success_timestamp_seconds"), float64(since.Unix()),
			"%s: no reaper pass since the last failover", base)
	}, 30*time.Second, 200*time.Millisecond)
}

// hookReceiver is a webhook endpoint of the run's tenant, subscribed to every event: the
// outbox is written in the transaction of each state change, and the dispatchers of both
// servers deliver it through the failovers.
type hookReceiver struct {
	mu  sync.Mutex
	ids map[string]int // webhook-id -> deliveries received
}

func newHookReceiver(t *testing.T, dbURL string) *hookReceiver {
	h := &hookReceiver{ids: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		h.mu.Lock()
		h.ids[r.Header.Get("webhook-id")]++
		h.mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	cmd := exec.Command(binary, "webhook", "create", "--tenant", "default", "--url", srv.URL+"/hook",
		"--events", "operation.uncertain,operation.reconciled,operation.possible_duplicate_effect")
	cmd.Env = append(testkit.MinimalEnv(), serverEnv("DATABASE_URL="+dbURL)...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	return h
}

// checkDelivered waits (bounded: 90 s; a delivery that failed during a failover is retried 5 s
// and then 30 s later) until every event of the outbox is delivered, then requires that the
// receiver got each one's webhook-id: no event was lost across the failovers.
func (h *hookReceiver) checkDelivered(t *testing.T, dbURL string) {
	ctx, db := openCheckDB(t, dbURL)
	var events []models.WebhookEvent
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		events = events[:0]
		if !assert.NoError(c, db.WithContext(ctx).Find(&events).Error) {
			return
		}
		pending := 0
		for _, e := range events {
			if e.Status != "delivered" {
				pending++
			}
		}
		assert.Zero(c, pending, "%d of %d webhook events not delivered", pending, len(events))
	}, 90*time.Second, 500*time.Millisecond)
	require.NotEmpty(t, events, "the run made no webhook event")
	h.mu.Lock()
	defer h.mu.Unlock()
	again := 0
	for _, e := range events {
		n := h.ids[e.MsgID]
		require.NotZero(t, n, "event %d (%s of %s) is delivered but never reached the receiver", e.ID, e.EventType, e.OperationID)
		again += n - 1
	}
	t.Logf("webhooks: %d events, every one received (%d deliveries repeated, at least once as documented)", len(events), again)
}

// reportRecovery finds, per failover, the first call without a proper answer at or after the
// fault and the first 201 answered after that, logs the recovery time and what callers were
// answered meanwhile, and requires that every failover recovered.
func reportRecovery(t *testing.T, rec *recorder, fos []*failover) {
	rec.mu.Lock()
	ops := append([]recordedCall(nil), recordedCalls(rec)...)
	rec.mu.Unlock()
	sort.Slice(ops, func(i, j int) bool { return ops[i].call.Before(ops[j].call) })
	var worst time.Duration
	for i, fo := range fos {
		fo.seen = map[string]int{}
		for _, c := range ops {
			if c.call.Before(fo.at) {
				continue
			}
			if fo.failed.IsZero() {
				if c.unknown {
					fo.failed = c.call
				}
				continue
			}
			fo.seen[c.answer]++
			if c.kind == kindAcquire && c.status == http.StatusCreated && c.ret.After(fo.failed) {
				fo.admitted = c.ret
				break
			}
		}
		if fo.failed.IsZero() {
			t.Logf("failover %d (%s %s→%s): no call failed", i+1, fo.kind, fo.from, fo.to)
			continue
		}
		require.False(t, fo.admitted.IsZero(), "failover %d: no admission after it", i+1)
		d := fo.admitted.Sub(fo.failed)
		worst = max(worst, d)
		t.Logf("failover %d (%s %s→%s): first failed call %s after the fault, first 201 %s after that (new leader named after %s); answers meanwhile %v",
			i+1, fo.kind, fo.from, fo.to, fo.failed.Sub(fo.at).Round(time.Millisecond), d.Round(time.Millisecond),
			fo.promoted.Sub(fo.at).Round(time.Millisecond), fo.seen)
	}
	t.Logf("longest recovery: %s", worst.Round(time.Millisecond))
}

// recordedCall is one call of the history in wall-clock terms.
type recordedCall struct {
	kind      string
	call, ret time.Time
	status    int
	unknown   bool
	answer    string // "acquire 201", "outcome 503", "release no answer"
}

// recordedCalls lists rec's calls; rec.mu must be held.
func recordedCalls(rec *recorder) []recordedCall {
	out := make([]recordedCall, 0, len(rec.ops))
	for _, op := range rec.ops {
		in, o := op.Input.(callInput), op.Output.(callOutput)
		c := recordedCall{kind: in.Kind, call: rec.start.Add(time.Duration(op.Call)), ret: rec.start.Add(time.Duration(op.Return)),
			status: o.Status, unknown: o.Unknown}
		c.answer = fmt.Sprintf("%s %d", in.Kind, o.Status)
		if o.Status == 0 {
			c.answer = in.Kind + " no answer"
		}
		out = append(out, c)
	}
	return out
}

// checkAcknowledged: every outcome and release a client saw answered 200 is in the database
// of the last primary. Succeeded and failed are final (docs/reference.md §3), so the operation
// must be in the answered state; released likewise. An answered "uncertain" may since have
// been reconciled by its owner (the workload reconciles parked admissions), so it only must
// not be in_progress.
func checkAcknowledged(t *testing.T, dbURL string, rec *recorder) {
	ctx, db := openCheckDB(t, dbURL)
	acked := map[string]string{} // operation id -> the last state a 200 answered
	rec.mu.Lock()
	for _, op := range rec.ops {
		in, o := op.Input.(callInput), op.Output.(callOutput)
		if o.Unknown || o.Status != http.StatusOK || (in.Kind != kindOutcome && in.Kind != kindRelease) || o.State == "" {
			continue
		}
		acked[in.Op] = o.State
	}
	rec.mu.Unlock()
	ids := make([]string, 0, len(acked))
	for id := range acked {
		ids = append(ids, id)
	}
	var ops []models.Operation
	require.NoError(t, db.WithContext(ctx).Where("id IN ?", ids).Find(&ops).Error)
	byID := map[string]models.Operation{}
	for _, o := range ops {
		byID[o.ID] = o
	}
	for id, state := range acked {
		o, ok := byID[id]
		require.True(t, ok, "operation %s: an acknowledged %s is not on the primary", id, state)
		if state == "uncertain" {
			require.NotEqual(t, "in_progress", o.State, "operation %s: acknowledged uncertain, now in_progress", id)
			continue
		}
		require.Equal(t, state, o.State, "operation %s: acknowledged %s", id, state)
	}
	t.Logf("acknowledged outcomes and releases: %d operations, all on the last primary", len(acked))
}

// settleUnanswered reads, through the API, the operation of every outcome and release whose
// answer was lost: a client settles it that way (docs/reference.md §3), and each must answer.
// (Acquires without an answer are settled by attempt_id in checkRun.)
func settleUnanswered(t *testing.T, w *workload, rec *recorder) {
	type lost struct{ kind, op, status string }
	var calls []lost
	rec.mu.Lock()
	for _, op := range rec.ops {
		in, o := op.Input.(callInput), op.Output.(callOutput)
		if o.Unknown && (in.Kind == kindOutcome || in.Kind == kindRelease) {
			calls = append(calls, lost{in.Kind, in.Op, in.Status})
		}
	}
	rec.mu.Unlock()
	applied := 0
	for _, c := range calls {
		status, resp := w.do(http.MethodGet, w.urls[0]+"/v1/operations/"+url.PathEscape(c.op), nil)
		require.Equal(t, http.StatusOK, status, "operation %s: %v", c.op, resp)
		state := str(resp, "state")
		if (c.kind == kindRelease && state == "released") || (c.kind == kindOutcome && state == c.status) {
			applied++
		}
	}
	t.Logf("outcomes and releases without an answer: %d, settled by reading the operation (%d show the lost call's state)",
		len(calls), applied)
}

// checkUncertainQueue waits (bounded: 30 s) until the reapers have made every operation left
// in_progress uncertain, then requires that the API's uncertain list is exactly the database's
// uncertain operations.
func checkUncertainQueue(t *testing.T, dbURL string, w *workload) {
	ctx, db := openCheckDB(t, dbURL)
	deadline := time.Now().Add(30 * time.Second)
	for {
		// Every TTL of the run is at most 3 s and its clients are gone, so every operation
		// still in_progress ends, by the reaper, within seconds; waiting for none at all (not
		// only none past its TTL) keeps the reaper from changing the set between the two reads.
		var open int64
		require.NoError(t, db.WithContext(ctx).Model(&models.Operation{}).
			Where("state = ?", "in_progress").Count(&open).Error)
		if open == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "%d operations still in_progress 30 s after the run", open)
		sleepCtx(ctx, 200*time.Millisecond)
	}
	var want []string
	require.NoError(t, db.WithContext(ctx).Model(&models.Operation{}).Where("state = ?", "uncertain").
		Order("id").Pluck("id", &want).Error)
	var got []string
	cursor := ""
	for {
		u := w.urls[1] + "/v1/operations?state=uncertain&limit=500"
		if cursor != "" {
			u += "&cursor=" + url.QueryEscape(cursor)
		}
		status, resp := w.do(http.MethodGet, u, nil)
		require.Equal(t, http.StatusOK, status, "%v", resp)
		items, _ := resp["items"].([]any)
		for _, it := range items {
			m, _ := it.(map[string]any)
			got = append(got, str(m, "id"))
		}
		if cursor = str(resp, "next_cursor"); cursor == "" {
			break
		}
	}
	sort.Strings(got)
	require.Equal(t, want, got, "the uncertain queue differs from the database")
	t.Logf("uncertain queue: %d operations, the same as the database's", len(got))
}
