package history

// Issue 4 point 2: the history checker's workload under faults. Each test runs the workload
// of TestHistoryLinearizableTwoProcesses (two real processes, one fresh PostgreSQL database,
// 16 clients) while injecting one kind of fault, then gives the same verdict (checkRun: the
// history checks with porcupine, and the database invariants hold). Calls that get no answer
// (transport error, 5xx) are unknown outcomes, as the model already allows.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/testkit"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// faultDuration is the workload length of each fault test: VERIFY_DURATION if set, else 11 s.
func faultDuration(t *testing.T) time.Duration {
	if os.Getenv("VERIFY_DURATION") != "" {
		return verifyDuration(t)
	}
	return 11 * time.Second
}

// newProc returns a server process of the test at a free address, not started (Start), which
// the test may kill (Kill) and start again on the same address; it is killed when the test ends.
func newProc(t *testing.T, env ...string) *testkit.Proc {
	p := testkit.NewProc(binary, testkit.FreeAddr(t), append(testkit.MinimalEnv(), serverEnv(env...)...)...)
	p.Dir = t.TempDir()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("server %s log (tail):\n%s", p.Addr, p.Log.Tail(4000))
		}
	})
	return p
}

// groupAdmission is server i's environment for group admission: the first server of every run
// groups concurrent acquires into one statement (the default) and always lingers
// (IDEMGATE_GROUP_LINGER=on, not the default, so that lingering is checked too), the second
// decides each alone, so both paths race each other on one database in every history.
func groupAdmission(i int) []string {
	if i == 0 {
		return []string{"IDEMGATE_GROUP_ADMISSION=true", "IDEMGATE_GROUP_LINGER=on"}
	}
	return []string{"IDEMGATE_GROUP_ADMISSION=false"}
}

// startProcs starts n processes with env in parallel.
func startProcs(t *testing.T, n int, env func(i int) []string) []*testkit.Proc {
	ps := make([]*testkit.Proc, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range ps {
		ps[i] = newProc(t, env(i)...)
		wg.Add(1)
		go func(i int) { defer wg.Done(); errs[i] = ps[i].Start() }(i)
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	return ps
}

// faultTransport wraps the workload's transport. It counts 5xx answers by status and problem
// code (and those without Retry-After), and backs off after a transport error or a 5xx, as a
// client honouring Retry-After would: without it, clients spin on fast failures and the
// history fills with thousands of unknown outcomes, which only slows the checker down.
type faultTransport struct {
	base    http.RoundTripper
	backoff time.Duration
	// retryAfter: after a 503, wait as long as its Retry-After header says instead of backoff.
	retryAfter bool

	mu             sync.Mutex
	failures       map[string]int // "503 store_unavailable" -> count
	noRetryAfter   int
	transportError int
}

func newFaultTransport(w *workload) *faultTransport {
	ft := &faultTransport{base: w.http.Transport, backoff: 150 * time.Millisecond, failures: map[string]int{}}
	w.http.Transport = ft
	return ft
}

func (ft *faultTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := ft.base.RoundTrip(req)
	if err != nil {
		ft.mu.Lock()
		ft.transportError++
		ft.mu.Unlock()
		sleepCtx(req.Context(), ft.backoff) // a call the workload cancelled returns at once
		return nil, err
	}
	if resp.StatusCode < 500 {
		return resp, nil
	}
	raw, rerr := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(raw))
	var p struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(raw, &p)
	if rerr != nil {
		p.Code = "(body lost)"
	}
	ft.mu.Lock()
	ft.failures[fmt.Sprintf("%d %s", resp.StatusCode, p.Code)]++
	if resp.Header.Get("Retry-After") == "" {
		ft.noRetryAfter++
	}
	ft.mu.Unlock()
	wait := ft.backoff
	if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && ft.retryAfter && resp.StatusCode == 503 {
		wait = time.Duration(secs) * time.Second
	}
	sleepCtx(req.Context(), wait) // Retry-After is seconds at times
	return resp, nil
}

// requireOnlyStoreUnavailable: every 5xx answer was 503 store_unavailable with Retry-After
// (a fault may make the store unavailable, never produce an internal error).
func (ft *faultTransport) requireOnlyStoreUnavailable(t *testing.T) {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	t.Logf("5xx answers %v, transport errors %d", ft.failures, ft.transportError)
	for k, n := range ft.failures {
		require.Equal(t, "503 store_unavailable", k, "unexpected 5xx answers (%d)", n)
	}
	require.Zero(t, ft.noRetryAfter, "503 answers without Retry-After")
}

func (ft *faultTransport) storeUnavailable() int {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	return ft.failures["503 store_unavailable"]
}

// answeredAfter counts the calls of the clients selected by sel made at or after wall time
// from, and those among them that got no proper answer (transport error or 5xx).
func answeredAfter(rec *recorder, from time.Time, sel func(client int) bool) (calls, failed int) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, op := range rec.ops {
		if !sel(op.ClientId) || rec.start.Add(time.Duration(op.Call)).Before(from) {
			continue
		}
		calls++
		if op.Output.(callOutput).Unknown {
			failed++
		}
	}
	return calls, failed
}

// sleepCtx sleeps d or until ctx is done; it reports whether the full time passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// TestHistoryWithServerKilled: mid-workload one of the two processes is killed with SIGKILL
// and started again on the same address (3 s in, then every 4 s, alternating, while the workload runs).
// Calls in flight to it get no answer (unknown outcomes). Asserts: the history checks, the
// database invariants hold, no 5xx other than 503 store_unavailable, and the restarted
// process answers its clients again.
func TestHistoryWithServerKilled(t *testing.T) {
	dbURL, drop, err := modeltest.CreatePostgres()
	require.NoError(t, err)
	t.Cleanup(drop)
	ps := startProcs(t, 2, func(i int) []string { return append([]string{"DATABASE_URL=" + dbURL}, groupAdmission(i)...) })

	w := newWorkload([]string{ps[0].URL(), ps[1].URL()}, "kill", faultDuration(t))
	w.batches = false
	ft := newFaultTransport(w)
	ctx, cancel := context.WithTimeout(context.Background(), w.duration)
	defer cancel()
	type restart struct {
		server int
		at     time.Time
	}
	var restarts []restart
	var faultErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; sleepCtx(ctx, map[bool]time.Duration{true: 3 * time.Second, false: 4 * time.Second}[i == 0]); i++ {
			if deadline, _ := ctx.Deadline(); time.Until(deadline) < 3*time.Second {
				return
			}
			s := i % 2
			ps[s].Kill()
			time.Sleep(300 * time.Millisecond) // its clients see refused connections meanwhile
			if faultErr = ps[s].Start(); faultErr != nil {
				return
			}
			restarts = append(restarts, restart{server: s, at: time.Now()})
			t.Logf("killed and restarted server %d", s)
		}
	}()
	rec, history := w.run(t)
	cancel()
	<-done
	require.NoError(t, faultErr)
	require.NotEmpty(t, restarts, "no kill happened")
	ft.requireOnlyStoreUnavailable(t)
	require.NotZero(t, ft.transportError, "killing a server cost no call its answer")
	for _, r := range restarts {
		// The workload's client c talks to server c%2.
		calls, failed := answeredAfter(rec, r.at.Add(time.Second), func(c int) bool { return c%2 == r.server })
		t.Logf("server %d after restart: %d calls, %d without answer", r.server, calls, failed)
		require.NotZero(t, calls-failed, "the restarted server %d answered nothing", r.server)
		require.Zero(t, failed, "the restarted server %d left calls unanswered", r.server)
	}
	checkRun(t, dbURL, w, rec, history)
}

// TestHistoryWithBackendsTerminated: every 300 ms during the workload, an admin connection
// terminates every PostgreSQL backend of the test database (pg_terminate_backend), i.e. every
// pooled connection of both servers, in the middle of whatever they run. Asserts: backends
// were terminated, every 5xx is 503 store_unavailable, the history checks and the database
// invariants hold.
func TestHistoryWithBackendsTerminated(t *testing.T) {
	dbURL, drop, err := modeltest.CreatePostgres()
	require.NoError(t, err)
	t.Cleanup(drop)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	dbName := strings.TrimPrefix(u.Path, "/")
	ps := startProcs(t, 2, func(i int) []string { return append([]string{"DATABASE_URL=" + dbURL}, groupAdmission(i)...) })

	actx, acancel := context.WithTimeout(context.Background(), 10*time.Second)
	admin, err := pgx.Connect(actx, modeltest.AdminURL())
	acancel()
	require.NoError(t, err)
	defer admin.Close(context.Background())

	w := newWorkload([]string{ps[0].URL(), ps[1].URL()}, "term", faultDuration(t))
	// Eight keys, as in the outage run below and for the same reason: in a clean-clone make
	// test on a loaded machine, one of four keys reached 554 operations with 492 answers 503
	// among the run's, and porcupine hit its 2-minute bound (Unknown, no violation found).
	w.spreadKeys(8)
	w.batches = false
	// Hundreds of 503s here leave renews' effects unknown too (a lease end, with extend_ttl
	// also the hold's, the model can then only guess), and a race-detector run once outgrew the
	// check's time bound that way; leases are checked in the fault-free runs and the kill run.
	w.leases = false
	ft := newFaultTransport(w)
	ctx, cancel := context.WithTimeout(context.Background(), w.duration)
	defer cancel()
	var terminated, rounds int
	var faultErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		for sleepCtx(ctx, 300*time.Millisecond) {
			qctx, qcancel := context.WithTimeout(context.Background(), 5*time.Second)
			rows, err := admin.Query(qctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE datname = $1 AND pid <> pg_backend_pid()`, dbName)
			if err == nil {
				var n int
				for rows.Next() {
					var ok bool
					if err = rows.Scan(&ok); err != nil {
						break
					}
					if ok {
						n++
					}
				}
				rows.Close()
				if err == nil {
					err = rows.Err()
				}
				terminated += n
				rounds++
			}
			qcancel()
			if err != nil {
				faultErr = err
				return
			}
		}
	}()
	rec, history := w.run(t)
	cancel()
	<-done
	require.NoError(t, faultErr)
	t.Logf("%d rounds terminated %d backends; %d answers 503 store_unavailable", rounds, terminated, ft.storeUnavailable())
	require.NotZero(t, terminated, "no backend was terminated")
	ft.requireOnlyStoreUnavailable(t)
	checkRun(t, dbURL, w, rec, history)
}

// TestHistoryWithDatabaseOutage: each server reaches PostgreSQL through its own TCP proxy;
// 3 s into the workload both proxies are cut for 2.5 s (open connections closed, new ones
// refused), then restored. Asserts: at least one 503 store_unavailable was answered and no
// other 5xx; both processes stayed up and recovered by themselves (every call made from 2 s
// after the restore got a proper answer, and there were such calls); the history checks and
// the database invariants hold.
func TestHistoryWithDatabaseOutage(t *testing.T) {
	dbURL, drop, err := modeltest.CreatePostgres()
	require.NoError(t, err)
	t.Cleanup(drop)
	pxs := []*testkit.Proxy{testkit.NewProxy(t, ""), testkit.NewProxy(t, "")}
	ps := startProcs(t, 2, func(i int) []string {
		return append([]string{"DATABASE_URL=" + pxs[i].Via(t, dbURL)}, groupAdmission(i)...)
	})

	w := newWorkload([]string{ps[0].URL(), ps[1].URL()}, "outage", faultDuration(t))
	// Eight keys instead of four: porcupine checks each key's history apart, and its search
	// grows steeply with one key's length and its unknown outcomes. With four, one key reached
	// 2,232 operations in an 11 s run and the check hit its 2-minute bound (Unknown, no
	// violation found; the torn-duplicate relaxation checked Ok in 0.2 s) in a clean-clone
	// make test. 16 clients over 8 keys still contend on every key.
	w.spreadKeys(8)
	w.batches = false
	// Hundreds of 503s here leave renews' effects unknown too (a lease end, with extend_ttl
	// also the hold's, the model can then only guess), and a race-detector run once outgrew the
	// check's time bound that way; leases are checked in the fault-free runs and the kill run.
	w.leases = false
	ft := newFaultTransport(w)
	// Clients honour Retry-After, so the outage adds a few dozen unknown outcomes, not
	// hundreds (each one multiplies the states porcupine explores).
	ft.retryAfter = true
	ctx, cancel := context.WithTimeout(context.Background(), w.duration)
	defer cancel()
	var restored time.Time
	done := make(chan struct{})
	go func() {
		defer close(done)
		if !sleepCtx(ctx, 3*time.Second) {
			return
		}
		for _, px := range pxs {
			px.SetDown(true)
		}
		t.Logf("database cut")
		// The outage's length, not a wait for anything; it ends even if the run does, so the
		// database always comes back.
		time.Sleep(2500 * time.Millisecond)
		for _, px := range pxs {
			px.SetDown(false)
		}
		restored = time.Now()
		t.Logf("database restored")
	}()
	rec, history := w.run(t)
	cancel()
	<-done
	require.False(t, restored.IsZero(), "the outage did not happen")
	require.NotZero(t, ft.storeUnavailable(), "no call was answered 503 store_unavailable during the outage")
	ft.requireOnlyStoreUnavailable(t)
	require.Zero(t, ft.transportError, "a server stopped answering")
	calls, failed := answeredAfter(rec, restored.Add(2*time.Second), func(int) bool { return true })
	t.Logf("after the restore: %d calls, %d without a proper answer", calls, failed)
	require.NotZero(t, calls, "no calls after the restore")
	require.Zero(t, failed, "the servers did not recover by themselves")
	checkRun(t, dbURL, w, rec, history)
}
