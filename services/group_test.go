package services

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/idemgate/idemgate/models"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// fakeStore records how a grouper calls it. single blocks until released, so a test can
// fill every statement slot and watch what queues behind.
type fakeStore struct {
	mu      sync.Mutex
	singles []string
	batches [][]string
	gate    chan struct{}
	failure error // returned once by the next batch
}

func (f *fakeStore) single(ctx context.Context, a acquireArgs) (decision, error) {
	f.mu.Lock()
	f.singles = append(f.singles, a.in.Key)
	f.mu.Unlock()
	if f.gate != nil {
		select {
		case <-f.gate:
		case <-ctx.Done():
			return decision{}, ctx.Err()
		}
	}
	return decision{result: ResultAdmitted, op: Operation{Key: a.in.Key}}, nil
}

func (f *fakeStore) batch(_ context.Context, as []acquireArgs) ([]decision, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var keys []string
	for _, a := range as {
		keys = append(keys, a.in.Key)
	}
	f.batches = append(f.batches, keys)
	if err := f.failure; err != nil {
		f.failure = nil
		return nil, err
	}
	ds := make([]decision, len(as))
	for i, a := range as {
		ds[i] = decision{result: ResultDuplicate, op: Operation{Key: a.in.Key}}
	}
	return ds, nil
}

func newFakeGrouper(f *fakeStore, inFlight int) *grouper {
	return &grouper{single: f.single, batch: f.batch, maxInFlight: inFlight, maxItems: 3,
		bound: func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }}
}

// queued waits until n acquires wait in g's queue.
func queued(g *grouper, n int) {
	for {
		g.mu.Lock()
		l := len(g.queue)
		g.mu.Unlock()
		if l >= n {
			return
		}
	}
}

func TestGrouperIdleAcquireRunsAloneAtOnce(t *testing.T) {
	f := &fakeStore{}
	g := newFakeGrouper(f, 2)
	d, err := g.acquire(bg, acquireArgs{in: AcquireInput{Key: "a"}})
	require.NoError(t, err)
	require.Equal(t, "a", d.op.Key)
	require.Equal(t, []string{"a"}, f.singles)
	require.Empty(t, f.batches)
	require.Zero(t, g.inFlight)
}

func TestGrouperBatchesWhatWaitsInArrivalOrder(t *testing.T) {
	f := &fakeStore{gate: make(chan struct{})}
	g := newFakeGrouper(f, 1)
	results := make(chan string, 10)
	go func() { // fills the only slot and blocks in single
		d, _ := g.acquire(bg, acquireArgs{in: AcquireInput{Key: "first"}})
		results <- d.op.Key
	}()
	for {
		f.mu.Lock()
		n := len(f.singles)
		f.mu.Unlock()
		if n == 1 {
			break
		}
	}
	for i := 0; i < 5; i++ {
		queued(g, i) // keep the arrival order deterministic
		go func(i int) {
			d, err := g.acquire(bg, acquireArgs{in: AcquireInput{Key: fmt.Sprint(i)}})
			if err != nil {
				results <- err.Error()
				return
			}
			results <- d.result + " " + d.op.Key
		}(i)
	}
	queued(g, 5)
	close(f.gate)
	var got []string
	for i := 0; i < 6; i++ {
		got = append(got, <-results)
	}
	require.ElementsMatch(t, []string{"first", "duplicate 0", "duplicate 1", "duplicate 2", "duplicate 3", "duplicate 4"}, got)
	require.Equal(t, [][]string{{"0", "1", "2"}, {"3", "4"}}, f.batches, "in arrival order, at most maxItems each")
	g.mu.Lock()
	defer g.mu.Unlock()
	require.Zero(t, g.inFlight)
	require.Empty(t, g.queue)
}

func TestGrouperSkipsAbandonedAcquires(t *testing.T) {
	f := &fakeStore{gate: make(chan struct{})}
	g := newFakeGrouper(f, 1)
	go g.acquire(bg, acquireArgs{in: AcquireInput{Key: "first"}})
	for {
		f.mu.Lock()
		n := len(f.singles)
		f.mu.Unlock()
		if n == 1 {
			break
		}
	}
	ctx, cancel := context.WithCancel(bg)
	gaveUp := make(chan error)
	go func() {
		_, err := g.acquire(ctx, acquireArgs{in: AcquireInput{Key: "gave-up"}})
		gaveUp <- err
	}()
	queued(g, 1)
	cancel()
	require.ErrorIs(t, <-gaveUp, context.Canceled)
	done := make(chan struct{})
	go func() {
		g.acquire(bg, acquireArgs{in: AcquireInput{Key: "kept"}})
		close(done)
	}()
	queued(g, 2)
	close(f.gate)
	<-done
	require.NotContains(t, append(f.singles, flatten(f.batches)...), "gave-up", "an acquire abandoned while waiting is never decided")
}

func TestGrouperDecidesEachAloneAfterALockTimeout(t *testing.T) {
	f := &fakeStore{failure: &pgconn.PgError{Code: "55P03"}}
	g := newFakeGrouper(f, 1)
	batch := []*pendingAcquire{
		{ctx: bg, args: acquireArgs{in: AcquireInput{Key: "a"}}, done: make(chan struct{})},
		{ctx: bg, args: acquireArgs{in: AcquireInput{Key: "b"}}, done: make(chan struct{})},
	}
	g.run(batch)
	require.Equal(t, [][]string{{"a", "b"}}, f.batches)
	require.Equal(t, []string{"a", "b"}, f.singles)
	for _, p := range batch {
		<-p.done
		require.NoError(t, p.err)
		require.Equal(t, ResultAdmitted, p.d.result)
	}
	f.failure = errors.New("boom")
	batch = []*pendingAcquire{
		{ctx: bg, args: acquireArgs{in: AcquireInput{Key: "c"}}, done: make(chan struct{})},
		{ctx: bg, args: acquireArgs{in: AcquireInput{Key: "d"}}, done: make(chan struct{})},
	}
	g.run(batch)
	for _, p := range batch {
		require.EqualError(t, p.err, "boom", "any other failure is every item's")
	}
}

func flatten(ss [][]string) []string {
	var out []string
	for _, s := range ss {
		out = append(out, s...)
	}
	return out
}

// TestGroupBatchLockTimeoutDecidesNothing runs PostgreSQL's group batch statement while
// another transaction holds the row lock of one of its keys: the statement gives up within
// its lock timeout, and none of its items (not even a free key's) was decided or logged.
func TestGroupBatchLockTimeoutDecidesNothing(t *testing.T) {
	onPostgres(t, func(t *testing.T, b *testBundle) {
		old := mustAcquire(t, b, "group-locked", 600)
		require.NoError(t, b.db.Model(&models.IdemKey{}).Where("tenant_id = ? AND key = ?", b.p.TenantID, "group-locked").
			Update("expires_at", old.ExpiresAt.Add(-700e9)).Error)
		locker := b.db.Begin()
		require.NoError(t, locker.Error)
		defer locker.Rollback()
		require.NoError(t, locker.Exec("SELECT 1 FROM idem_keys WHERE tenant_id = ? AND key = ? FOR UPDATE", b.p.TenantID, "group-locked").Error)

		st := b.adm.st.(*pgStore)
		args := func(key string) acquireArgs {
			return acquireArgs{p: b.p, in: AcquireInput{Key: key, TTLSeconds: 60}, opID: uuid.NewString(), ownerHash: "h"}
		}
		before := countRows(t, b)
		_, err := st.acquireMany(bg, []acquireArgs{args("group-free"), args("group-locked")}, groupLockTimeout)
		require.True(t, isLockTimeout(err), "%v", err)
		require.Equal(t, before, countRows(t, b), "nothing decided, nothing logged")
	})
}

// TestGroupAdmissionUnderLoad sends 64 concurrent callers of new and repeated keys through
// one Admission on PostgreSQL: acquires are grouped into batches, and every guarantee holds
// (each key admitted once, every answer consistent, every attempt logged).
func TestGroupAdmissionUnderLoad(t *testing.T) {
	onPostgres(t, func(t *testing.T, b *testBundle) {
		adm := NewAdmission(b.db, nil, 0).WithGroupAdmission(true)
		const workers, each = 64, 30
		var admitted sync.Map
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for i := 0; i < each; i++ {
					key := fmt.Sprintf("load-%d-%d", w, i)
					if i%3 == 2 {
						key = fmt.Sprintf("load-shared-%d", i) // every worker asks for these
					}
					acq, err := adm.Acquire(bg, b.p, AcquireInput{Key: key, TTLSeconds: 600})
					switch {
					case err != nil:
						errs <- err
						return
					case acq.Admitted:
						if _, dup := admitted.LoadOrStore(key, acq.OperationID); dup {
							errs <- fmt.Errorf("%s admitted twice", key)
							return
						}
					case acq.Operation == nil || acq.Operation.Key != key:
						errs <- fmt.Errorf("%s: duplicate answer %+v", key, acq)
						return
					}
				}
			}(w)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		g := adm.st.(*pgStore).group
		require.Positive(t, g.nBatches.Load(), "64 concurrent callers on 4 statement slots must have queued")
		require.Greater(t, g.nItems.Load(), g.nBatches.Load(), "batches of more than one")
		require.EqualValues(t, workers*each, countRows(t, b).Attempts, "every acquire logged once")
		n := 0
		admitted.Range(func(_, _ any) bool { n++; return true })
		require.Equal(t, workers*(each-each/3)+each/3, n, "every key admitted exactly once")
	})
}
