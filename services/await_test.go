package services

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/testkit"
	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/stretchr/testify/require"
)

// openAgain opens a second pool on db's database, of at most maxConns connections: another
// server instance sharing the database.
func openAgain(t *testing.T, db *models.DB, maxConns int) *models.DB {
	t.Helper()
	opts := models.OpenOptions{SQLitePath: dbs.SQLitePath, MaxConns: maxConns}
	if db.Dialect == models.Postgres {
		opts = models.OpenOptions{DatabaseURL: dbs.PostgresURL, MaxConns: maxConns}
	}
	other, err := models.Open(bg, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close() })
	return other
}

// runAwaiter starts an Awaiter over db with cfg until the test ends.
func runAwaiter(t *testing.T, db *models.DB, cfg AwaiterConfig) *Awaiter {
	t.Helper()
	aw := NewAwaiter(db, cfg)
	ctx, cancel := context.WithCancel(bg)
	done := make(chan struct{})
	go func() { defer close(done); aw.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return aw
}

type waitResult struct {
	op  *OperationDetail
	err error
}

// startWait waits in the background for operation id, and returns once the wait is registered.
func startWait(t *testing.T, aw *Awaiter, b *testBundle, id string, d time.Duration) <-chan waitResult {
	t.Helper()
	before := aw.Waiting()
	out := make(chan waitResult, 1)
	go func() {
		op, err := aw.Wait(bg, b.p.TenantID, id, d)
		out <- waitResult{op, err}
	}()
	require.Eventually(t, func() bool { return aw.Waiting() > before }, 5*time.Second, time.Millisecond)
	return out
}

// TestWaitReturnsOnOutcomeFromAnotherInstance: a waiter learns of an outcome recorded through
// another pool on the same database (another instance). On PostgreSQL it is woken by
// LISTEN/NOTIFY alone (polling off), and by polling alone (LISTEN unreachable, or off:
// IDEMGATE_LISTEN=false); on SQLite by
// polling.
func TestWaitReturnsOnOutcomeFromAnotherInstance(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		other := NewAdmission(openAgain(t, b.db, 2), nil, 0)
		type mode struct {
			name string
			cfg  AwaiterConfig
		}
		modes := []mode{{"poll", AwaiterConfig{ListenURL: "postgres://127.0.0.1:1/none?connect_timeout=1"}}}
		if b.db.Dialect == models.Postgres {
			modes = append(modes, mode{"notify", AwaiterConfig{Poll: time.Hour}},
				mode{"poll, LISTEN off", AwaiterConfig{NoListen: true}}) // IDEMGATE_LISTEN=false
		}
		for _, m := range modes {
			t.Run(m.name, func(t *testing.T) {
				aw := runAwaiter(t, b.db, m.cfg)
				if m.name == "notify" {
					require.Eventually(t, aw.Listening, 10*time.Second, 10*time.Millisecond)
				}
				acq := mustAcquire(t, b, "wait/other-"+m.name, 600)
				res := startWait(t, aw, b, acq.OperationID, 30*time.Second)
				_, err := other.RecordOutcome(bg, b.p, acq.OperationID, OutcomeInput{OwnerToken: acq.OwnerToken, Status: StateSucceeded})
				require.NoError(t, err)
				r := <-res
				require.NoError(t, r.err)
				require.Equal(t, StateSucceeded, r.op.State, "answered on the outcome, not at the end of the wait")
				require.Zero(t, aw.Waiting())
				if m.cfg.NoListen {
					require.False(t, aw.Listening(), "IDEMGATE_LISTEN=false opens no LISTEN connection")
				}
			})
		}
	})
}

// TestWaitTimesOutInProgress: without an outcome the wait ends after its duration with the
// operation still in_progress; an operation already out of in_progress is answered at once; a
// lapsed lease made uncertain by the reaper wakes its waiter.
func TestWaitTimesOutInProgress(t *testing.T) {
	// Not parallel: its reaper passes would clear other tests' expired holds, which some
	// of them look at before clearing them themselves.
	eachDB(t, func(t *testing.T, b *testBundle) {
		aw := runAwaiter(t, b.db, AwaiterConfig{})
		acq := mustAcquire(t, b, "wait/timeout", 600)
		start := time.Now()
		op, err := aw.Wait(bg, b.p.TenantID, acq.OperationID, 300*time.Millisecond)
		require.NoError(t, err)
		require.Equal(t, StateInProgress, op.State)
		require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)

		mustRecord(t, b, acq, OutcomeInput{Status: StateFailed})
		op, err = aw.Wait(bg, b.p.TenantID, acq.OperationID, time.Minute)
		require.NoError(t, err)
		require.Equal(t, StateFailed, op.State)

		_, err = aw.Wait(bg, b.p.TenantID+100000, acq.OperationID, time.Second)
		require.ErrorIs(t, err, ErrNotFound, "another tenant's operation does not exist")

		leased := acquireLease(t, b, "wait/lease", 600, 30, OnExpiryReadmit)
		res := startWait(t, aw, b, leased.OperationID, 30*time.Second)
		lapseLease(t, b, leased.OperationID)
		_, err = b.reaper.RunOnce(bg)
		require.NoError(t, err)
		r := <-res
		require.NoError(t, r.err)
		require.Equal(t, StateUncertain, r.op.State)
	})
}

// TestWaitCapAndClose: past MaxWaiters a wait is refused with ErrTooManyWaiters; Close (server
// shutdown) releases every waiter at once with the current state.
func TestWaitCapAndClose(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		aw := runAwaiter(t, b.db, AwaiterConfig{MaxWaiters: 2})
		acq := mustAcquire(t, b, "wait/cap", 600)
		r1 := startWait(t, aw, b, acq.OperationID, time.Minute)
		r2 := startWait(t, aw, b, acq.OperationID, time.Minute)
		_, err := aw.Wait(bg, b.p.TenantID, acq.OperationID, time.Minute)
		require.ErrorIs(t, err, ErrTooManyWaiters)
		aw.Close()
		for _, r := range []<-chan waitResult{r1, r2} {
			got := <-r
			require.NoError(t, got.err)
			require.Equal(t, StateInProgress, got.op.State)
		}
		op, err := aw.Wait(bg, b.p.TenantID, acq.OperationID, time.Minute)
		require.NoError(t, err, "after Close a wait answers at once")
		require.Equal(t, StateInProgress, op.State)
	})
}

// TestWaitHoldsNoPoolConnection: ten waiters on an instance whose pool has two connections
// leave both free: acquires on that pool go through while they wait, and the outcome then
// wakes all ten.
func TestWaitHoldsNoPoolConnection(t *testing.T) {
	t.Parallel()
	onPostgres(t, func(t *testing.T, b *testBundle) {
		small := openAgain(t, b.db, 2)
		aw := runAwaiter(t, small, AwaiterConfig{})
		adm := NewAdmission(small, nil, 0)
		acq := mustAcquire(t, b, "wait/pool", 600)
		var results []<-chan waitResult
		for i := 0; i < 10; i++ {
			results = append(results, startWait(t, aw, b, acq.OperationID, 30*time.Second))
		}
		var wg sync.WaitGroup
		for i := 0; i < 6; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(bg, 5*time.Second)
				defer cancel()
				a, err := adm.Acquire(ctx, b.p, AcquireInput{Key: "wait/pool-other-" + time.Now().Format(time.RFC3339Nano), TTLSeconds: 60})
				if err != nil || !a.Admitted {
					t.Errorf("acquire beside the waiters: %v", err)
				}
			}()
		}
		wg.Wait()
		require.Equal(t, 10, aw.Waiting())
		_, err := adm.RecordOutcome(bg, b.p, acq.OperationID, OutcomeInput{OwnerToken: acq.OwnerToken, Status: StateSucceeded})
		require.NoError(t, err)
		for _, r := range results {
			got := <-r
			require.NoError(t, got.err)
			require.Equal(t, StateSucceeded, got.op.State)
		}
	})
}

// TestWaitAnswersAtLeaseLapse: a waiter on an operation whose lease lapses before the wait ends
// answers at the lease end, with the operation made uncertain (lease_expired_without_outcome)
// by the waiter itself, not after the whole wait with in_progress (no reaper pass runs here);
// a renew during the wait moves the answer to the new lease end and is never overtaken by the
// lapse; the owner's late outcome still lands (docs/reference.md §8).
func TestWaitAnswersAtLeaseLapse(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		aw := runAwaiter(t, b.db, AwaiterConfig{})
		acq := acquireLease(t, b, "wait/lapse", 600, 1, OnExpiryReadmit)
		start := time.Now()
		op, err := aw.Wait(bg, b.p.TenantID, acq.OperationID, 6*time.Second)
		took := time.Since(start)
		require.NoError(t, err)
		require.Equal(t, StateUncertain, op.State)
		require.Equal(t, ReasonLeaseExpired, deref(op.StateReason))
		require.False(t, time.Now().Before(acq.LeaseExpiresAt), "not before the lease end")
		require.Less(t, took, 4*time.Second, "answered about when the lease lapsed, not at the end of the wait")
		var evs []models.Event
		require.NoError(t, b.db.Where("operation_id = ?", acq.OperationID).Order("id").Find(&evs).Error)
		require.Equal(t, "in_progress -> uncertain: "+ReasonLeaseExpired, evs[len(evs)-1].Detail)
		_, err = b.adm.Acquire(bg, b.p, AcquireInput{Key: "wait/lapse", TTLSeconds: 600})
		requireOutcomeUncertain(t, err, acq.OperationID)
		late := mustRecord(t, b, acq, OutcomeInput{Status: StateSucceeded})
		require.Equal(t, StateSucceeded, late.State)

		// Renewed while waited on: the waiter's first lease timer finds the lease live again,
		// changes nothing, and answers at the renewed lease end.
		renewed := acquireLease(t, b, "wait/renewed", 600, 2, OnExpiryReadmit)
		res := startWait(t, aw, b, renewed.OperationID, 8*time.Second)
		rn, err := b.adm.Renew(bg, b.p, renewed.OperationID, RenewInput{OwnerToken: renewed.OwnerToken, LeaseSeconds: 3})
		require.NoError(t, err)
		r := <-res
		require.NoError(t, r.err)
		require.Equal(t, StateUncertain, r.op.State)
		require.Equal(t, ReasonLeaseExpired, deref(r.op.StateReason))
		require.False(t, time.Now().Before(rn.LeaseExpiresAt), "never before the renewed lease end")
		require.Equal(t, rn.LeaseExpiresAt, r.op.LeaseExpiresAt.UTC())
	})
}

// TestListenBehindTransactionPoolerIsLogged: behind PgBouncer in transaction mode a LISTEN
// succeeds and no notification ever arrives. The Awaiter notices (its own test notification
// does not come back), says so once in the log, naming the setting that fixes it, and leaves
// the waiters to polling; on a direct connection it listens and logs nothing (issue 28 item 9).
func TestListenBehindTransactionPoolerIsLogged(t *testing.T) {
	onPostgres(t, func(t *testing.T, b *testBundle) {
		bouncer := modeltest.StartPgBouncer(t, 2)
		for _, tc := range []struct {
			name, url string
			listens   bool
		}{
			{"direct", dbs.PostgresURL, true},
			{"pgbouncer", bouncer.Through(t, dbs.PostgresURL), false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				var logged testkit.Log
				aw := NewAwaiter(b.db, AwaiterConfig{ListenURL: tc.url, Log: slog.New(slog.NewTextHandler(&logged, nil))})
				ctx, cancel := context.WithCancel(bg)
				done := make(chan struct{})
				go func() { defer close(done); aw.Run(ctx) }()
				t.Cleanup(func() { cancel(); <-done })
				if tc.listens {
					require.Eventually(t, aw.Listening, 10*time.Second, 10*time.Millisecond)
					require.Empty(t, logged.String())
					return
				}
				require.Eventually(t, func() bool { return strings.Contains(logged.String(), "IDEMGATE_LISTEN_DATABASE_URL") },
					30*time.Second, 20*time.Millisecond)
				require.False(t, aw.Listening())
				require.Equal(t, 1, strings.Count(logged.String(), "level=WARN"), logged.String())
			})
		}
	})
}

// TestListenBackoffResetsAfterConnection: the LISTEN connection's reconnects back off while it
// keeps failing, and start again from 100 ms once it has been up, logging once per outage.
// Before the reset, a process that had lost its connection a few times waited up to 30 s to
// listen again after the next failover.
func TestListenBackoffResetsAfterConnection(t *testing.T) {
	var b listenBackoff
	type step struct {
		wasUp bool
		delay time.Duration
		warn  bool
	}
	ms := time.Millisecond
	for i, s := range []step{
		{false, 100 * ms, true}, {false, 200 * ms, false}, {false, 400 * ms, false}, // an outage at start
		{true, 100 * ms, true}, {false, 200 * ms, false}, // up, then lost again: a new outage
		{true, 100 * ms, true}, {true, 100 * ms, true}, // lost at once after each connection
	} {
		delay, warn := b.next(s.wasUp)
		require.Equal(t, s.delay, delay, "step %d", i)
		require.Equal(t, s.warn, warn, "step %d", i)
	}
	for range 20 {
		b.next(false)
	}
	delay, _ := b.next(false)
	require.Equal(t, 30*time.Second, delay, "the ceiling")
}
