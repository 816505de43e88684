package services

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemgate/idemgate/models"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeStore records how a grouper calls it. single blocks until released, so a test can
// fill every statement slot and watch what queues behind.
type fakeStore struct {
	mu      sync.Mutex
	singles []string
	batches [][]string
	gate    chan struct{}
	// batchGate, when set, holds every batch until the test sends on it.
	batchGate chan struct{}
	failure   error // returned once by the next batch
	// locked keys: a bounded single of one fails as contended; an unbounded one waits on
	// gate (when set).
	locked map[string]bool
	// unbounded counts singles sent without the lock timeout.
	unbounded []string
}

func (f *fakeStore) single(ctx context.Context, a acquireArgs, bounded bool) (decision, error) {
	f.mu.Lock()
	f.singles = append(f.singles, a.in.Key)
	locked := f.locked[a.in.Key]
	if !bounded {
		f.unbounded = append(f.unbounded, a.in.Key)
	}
	f.mu.Unlock()
	if locked && bounded {
		return decision{}, &pgconn.PgError{Code: "55P03"}
	}
	if f.gate != nil && (f.locked == nil || locked) {
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
	var keys []string
	for _, a := range as {
		keys = append(keys, a.in.Key)
	}
	f.batches = append(f.batches, keys)
	f.mu.Unlock()
	if f.batchGate != nil {
		<-f.batchGate
	}
	f.mu.Lock()
	defer f.mu.Unlock()
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

// await spins until count(), read under f.mu, reaches n: a goroutine has got that far into f.
func (f *fakeStore) await(count func() int, n int) {
	for {
		f.mu.Lock()
		c := count()
		f.mu.Unlock()
		if c >= n {
			return
		}
	}
}

// newFakeGrouper is a grouper over f that never lingers (see newLingeringGrouper).
func newFakeGrouper(f *fakeStore, inFlight int) *grouper {
	g := newGrouper(LingerOff, inFlight, 3)
	g.single, g.batch, g.contended = f.single, f.batch, isLockTimeout
	g.bound = func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }
	return g
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
	f.await(func() int { return len(f.singles) }, 1)
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
	idle(g) // the last answer is sent before the slot is given back
	g.mu.Lock()
	defer g.mu.Unlock()
	require.Empty(t, g.queue)
}

func TestGrouperSkipsAbandonedAcquires(t *testing.T) {
	f := &fakeStore{gate: make(chan struct{})}
	g := newFakeGrouper(f, 1)
	go g.acquire(bg, acquireArgs{in: AcquireInput{Key: "first"}})
	f.await(func() int { return len(f.singles) }, 1)
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
	for _, p := range batch {
		<-p.done
		require.NoError(t, p.err)
		require.Equal(t, ResultAdmitted, p.d.result)
	}
	require.Equal(t, [][]string{{"a", "b"}}, f.batches)
	require.ElementsMatch(t, []string{"a", "b"}, f.unbounded, "decided again alone, without the lock timeout")
	require.EqualValues(t, 1, g.nContended.Load())
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

// TestGrouperSlotNeverWaitsOnALockedKey: an acquire whose key row is locked gives up its
// statement slot after the lock timeout and waits outside it, alone and unbounded, so the
// acquires of other keys behind it are decided meanwhile; this holds for a lone acquire and
// for a batch that contained one. With the old grouper (a lone acquire and a batch's fallback
// both ran unbounded in the slot), "other" waited until "locked" was let go.
func TestGrouperSlotNeverWaitsOnALockedKey(t *testing.T) {
	for _, alone := range []bool{true, false} {
		t.Run(fmt.Sprintf("alone=%v", alone), func(t *testing.T) {
			f := &fakeStore{gate: make(chan struct{}), locked: map[string]bool{"locked": true}}
			g := newFakeGrouper(f, 1)
			lockedDone := make(chan error, 2)
			if alone {
				go func() {
					_, err := g.acquire(bg, acquireArgs{in: AcquireInput{Key: "locked"}})
					lockedDone <- err
				}()
			} else {
				f.failure = &pgconn.PgError{Code: "55P03"} // the batch holding "locked" gives up
				g.mu.Lock()
				g.inFlight++ // as drain does: the batch runs in the slot
				g.mu.Unlock()
				p := &pendingAcquire{ctx: bg, args: acquireArgs{in: AcquireInput{Key: "locked"}}, done: make(chan struct{})}
				free := &pendingAcquire{ctx: bg, args: acquireArgs{in: AcquireInput{Key: "free"}}, done: make(chan struct{})}
				go func() {
					g.run([]*pendingAcquire{p, free})
					g.release()
					<-p.done
					lockedDone <- p.err
				}()
				<-free.done
				require.NoError(t, free.err)
			}
			for { // wait until "locked" waits outside the slot
				f.mu.Lock()
				n := len(f.unbounded)
				f.mu.Unlock()
				if n > 0 {
					break
				}
			}
			ctx, cancel := context.WithTimeout(bg, 10*time.Second) // a liveness bound, not a timing
			defer cancel()
			d, err := g.acquire(ctx, acquireArgs{in: AcquireInput{Key: "other"}})
			require.NoError(t, err, "decided while the locked key still waits")
			require.Equal(t, "other", d.op.Key)
			select {
			case err := <-lockedDone:
				t.Fatalf("the locked key was answered before its lock was let go: %v", err)
			default:
			}
			close(f.gate)
			require.NoError(t, <-lockedDone)
			require.Positive(t, g.nContended.Load())
		})
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

// TestGroupedAcquireOfALockedKeyDelaysOnlyItself, on PostgreSQL: another transaction holds the
// row lock of an expired key; a grouped acquire of that key gives up the statement slot at the
// lock timeout and waits alone, while acquires of other keys through the same Admission are
// decided meanwhile. When the lock is let go, the waiting acquire takes the key over.
func TestGroupedAcquireOfALockedKeyDelaysOnlyItself(t *testing.T) {
	onPostgres(t, func(t *testing.T, b *testBundle) {
		old := mustAcquire(t, b, "slot-locked", 600)
		require.NoError(t, b.db.Model(&models.IdemKey{}).Where("tenant_id = ? AND key = ?", b.p.TenantID, "slot-locked").
			Update("expires_at", old.ExpiresAt.Add(-700e9)).Error)
		locker := b.db.Begin()
		require.NoError(t, locker.Error)
		defer locker.Rollback()
		require.NoError(t, locker.Exec("SELECT 1 FROM idem_keys WHERE tenant_id = ? AND key = ? FOR UPDATE", b.p.TenantID, "slot-locked").Error)

		adm := NewAdmission(b.db, nil, 0).WithGroupAdmission(true)
		g := adm.st.(groupedStore).g
		type answer struct {
			acq *Acquisition
			err error
		}
		locked := make(chan answer, 1)
		go func() {
			acq, err := adm.Acquire(bg, b.p, AcquireInput{Key: "slot-locked", TTLSeconds: 600})
			locked <- answer{acq, err}
		}()
		for start := time.Now(); g.nContended.Load() == 0; time.Sleep(time.Millisecond) { // it gave up the slot, waits alone
			require.Less(t, time.Since(start), 10*time.Second, "the acquire of the locked key never gave up its slot")
		}
		ctx, cancel := context.WithTimeout(bg, 10*time.Second) // a liveness bound, not a timing
		defer cancel()
		var wg sync.WaitGroup
		for i := 0; i < 16; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				acq, err := adm.Acquire(ctx, b.p, AcquireInput{Key: fmt.Sprintf("slot-free-%d", i), TTLSeconds: 600})
				if assert.NoError(t, err, "other keys are decided while one key's row is locked") {
					assert.True(t, acq.Admitted)
				}
			}(i)
		}
		wg.Wait()
		select {
		case a := <-locked:
			t.Fatalf("answered while its row was still locked: %+v %v", a.acq, a.err)
		default:
		}
		require.NoError(t, locker.Rollback().Error)
		a := <-locked
		require.NoError(t, a.err)
		require.True(t, a.acq.Admitted)
		require.EqualValues(t, 2, a.acq.FencingToken, "took the expired key over")
	})
}

// TestGroupAdmissionUnderLoad sends 64 concurrent callers of new and repeated keys through
// one Admission, on both databases, lingering and not: acquires are grouped into batches, and
// every guarantee holds (each key admitted once, every answer consistent, every attempt
// logged).
func TestGroupAdmissionUnderLoad(t *testing.T) {
	for _, mode := range []LingerMode{LingerOff, LingerOn} {
		// Lingering: fewer acquires (SQLite under -race takes 15 s for the full load).
		workers, each := 64, 30
		if mode == LingerOn {
			workers, each = 32, 12
		}
		t.Run("linger "+mode.String(), func(t *testing.T) { groupAdmissionUnderLoad(t, mode, workers, each) })
	}
}

func groupAdmissionUnderLoad(t *testing.T, mode LingerMode, workers, each int) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		adm := NewAdmission(b.db, nil, 0).WithLinger(mode).WithGroupAdmission(true)
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
		g := adm.st.(groupedStore).g
		require.Positive(t, g.nBatches.Load(), "64 concurrent callers on one statement slot must have queued")
		require.Greater(t, g.nItems.Load(), g.nBatches.Load(), "batches of more than one")
		require.EqualValues(t, workers*each, countRows(t, b).Attempts, "every acquire logged once")
		n := 0
		admitted.Range(func(_, _ any) bool { n++; return true })
		require.Equal(t, workers*(each-each/3)+each/3, n, "every key admitted exactly once")
		if mode == LingerOn {
			require.Positive(t, g.lingerNanos.Load(), "callers answered in a batch came back while the slot lingered")
		} else {
			require.Zero(t, g.lingerNanos.Load())
		}
	})
}

// TestGrouperCountsEveryAcquireOnce: an acquire that waited behind a busy slot and then went
// alone (a batch of one) is counted as a single, so batched + singles is every acquire. The
// counters feed /metrics; CI saw 47 of 48 when one such acquire went uncounted.
func TestGrouperCountsEveryAcquireOnce(t *testing.T) {
	f := &fakeStore{gate: make(chan struct{})}
	g := newFakeGrouper(f, 1)
	done := make(chan struct{}, 2)
	go func() { g.acquire(bg, acquireArgs{in: AcquireInput{Key: "first"}}); done <- struct{}{} }()
	f.await(func() int { return len(f.singles) }, 1)
	go func() { g.acquire(bg, acquireArgs{in: AcquireInput{Key: "waited"}}); done <- struct{}{} }()
	queued(g, 1)
	close(f.gate)
	<-done
	<-done
	require.Equal(t, []string{"first", "waited"}, f.singles, "the waiting acquire went alone")
	require.EqualValues(t, 2, g.nSingles.Load()+g.nItems.Load(), "each acquire counted once")
	require.Zero(t, g.nBatches.Load())
}

// TestGrouperCountsSlotBusyTime: busyNanos (GroupStats.Busy, the busy-seconds metric) sums the
// time statements sent from the slot took: at least as long as a statement the test held
// open, no longer than the test's own span (one slot runs one statement at a time), batches
// and batches of one included; the time an acquire spends decided alone after a lock timeout
// is outside the slot and not counted. Before busyNanos there was no measure of the slot's
// occupancy: whether acquires find it free or wait for the statement in flight
// (docs/operations.md, "What bounds the rate").
func TestGrouperCountsSlotBusyTime(t *testing.T) {
	f := &fakeStore{gate: make(chan struct{})}
	g := newFakeGrouper(f, 1)
	begin := time.Now()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); g.acquire(bg, acquireArgs{in: AcquireInput{Key: "first"}}) }()
	f.await(func() int { return len(f.singles) }, 1)
	held := time.Now() // "first" is in its statement from here on
	for i := range 4 { // three in a batch, then one alone
		queued(g, i)
		wg.Add(1)
		go func() { defer wg.Done(); g.acquire(bg, acquireArgs{in: AcquireInput{Key: fmt.Sprint(i)}}) }()
	}
	queued(g, 4)
	open := time.Since(held)
	close(f.gate)
	wg.Wait()
	span := time.Since(begin)
	require.Equal(t, [][]string{{"0", "1", "2"}}, f.batches)
	require.Equal(t, []string{"first", "3"}, f.singles)
	busy := time.Duration(g.busyNanos.Load())
	require.GreaterOrEqual(t, busy, open, "the statement held open is counted")
	require.LessOrEqual(t, busy, span, "one slot: its statements never overlap")

	// A lock timeout: the bounded statement counts, the unbounded wait outside the slot not.
	lf := &fakeStore{gate: make(chan struct{}), locked: map[string]bool{"locked": true}}
	lg := newFakeGrouper(lf, 1)
	done := make(chan struct{})
	go func() { lg.acquire(bg, acquireArgs{in: AcquireInput{Key: "locked"}}); close(done) }()
	lf.await(func() int { return len(lf.unbounded) }, 1)
	before := lg.busyNanos.Load()
	require.Positive(t, before, "the bounded statement was counted before the slot was given back")
	close(lf.gate)
	<-done
	require.Equal(t, before, lg.busyNanos.Load(), "waiting alone, outside the slot, is not slot time")
	require.EqualValues(t, 1, lg.nContended.Load())
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// fakeLingerBound replaces a grouper's linger timer: each linger's bound is recorded, and it
// ends only when the test fires it.
type fakeLingerBound struct {
	mu     sync.Mutex
	bounds []time.Duration
	fire   chan time.Time
}

// started waits until n lingers have started their bound, and returns the bounds.
func (lb *fakeLingerBound) started(n int) []time.Duration {
	for {
		lb.mu.Lock()
		b := append([]time.Duration(nil), lb.bounds...)
		lb.mu.Unlock()
		if len(b) >= n {
			return b
		}
	}
}

func newLingeringGrouper(f *fakeStore) (*grouper, *fakeLingerBound) {
	g := newFakeGrouper(f, 1)
	g.linger.mode = LingerOn
	lb := &fakeLingerBound{fire: make(chan time.Time, 1)}
	g.lingerWait = func(d time.Duration) (<-chan time.Time, func()) {
		lb.mu.Lock()
		lb.bounds = append(lb.bounds, d)
		lb.mu.Unlock()
		return lb.fire, func() {}
	}
	return g, lb
}

// idle waits until g's slot is free.
func idle(g *grouper) {
	for {
		g.mu.Lock()
		free := g.inFlight == 0
		g.mu.Unlock()
		if free {
			return
		}
	}
}

// lingeringFor waits until g's slot lingers for want acquires.
func lingeringFor(g *grouper, want int) {
	for {
		g.mu.Lock()
		w := g.want
		g.mu.Unlock()
		if w == want {
			return
		}
	}
}

// batchAfterFirst fills g's slot with a single held at f's gate, queues keys behind it, lets
// the single go and waits until the keys' batch is answered. It returns a channel of every
// later answer's key.
func batchAfterFirst(t *testing.T, g *grouper, f *fakeStore, keys ...string) chan string {
	t.Helper()
	answers := make(chan string, 16)
	ask := func(key string) {
		d, err := g.acquire(bg, acquireArgs{in: AcquireInput{Key: key}})
		if err != nil {
			answers <- err.Error()
			return
		}
		answers <- d.op.Key
	}
	go ask("first")
	f.await(func() int { return len(f.singles) }, 1)
	for i, k := range keys {
		queued(g, i)
		go ask(k)
	}
	queued(g, len(keys))
	close(f.gate)
	got := []string{<-answers}
	for range keys {
		got = append(got, <-answers)
	}
	require.ElementsMatch(t, append([]string{"first"}, keys...), got)
	return answers
}

// TestGrouperLingersForTheAcquiresItAnswered: with lingering on, after a statement of three
// acquires the slot waits, with no statement running, until three acquires wait again (the
// callers it answered, coming back), and decides them in one statement; without lingering
// each of them finds the slot free and goes alone, three statements instead of one. Before
// lingering existed the second behaviour was the only one: at 16 connections the batches
// alternated between two halves of the callers, each statement paying a round trip and a
// commit for half of them.
func TestGrouperLingersForTheAcquiresItAnswered(t *testing.T) {
	for _, mode := range []LingerMode{LingerOff, LingerOn} {
		t.Run(mode.String(), func(t *testing.T) {
			f := &fakeStore{gate: make(chan struct{})}
			g, lb := newLingeringGrouper(f)
			g.linger.mode = mode
			answers := batchAfterFirst(t, g, f, "a", "b", "c")
			if mode == LingerOn {
				lingeringFor(g, 3)
			}
			// Sent one at a time, each once the one before is queued (lingering) or decided (not):
			// callers coming back after their answers, in some order.
			for i, key := range []string{"d", "e", "f"} {
				go g.acquire(bg, acquireArgs{in: AcquireInput{Key: key}})
				if mode == LingerOn {
					if i < 2 {
						queued(g, i+1)
					}
				} else {
					f.await(func() int { return len(f.singles) }, i+2)
				}
			}
			f.await(func() int { return len(f.batches) }, 1+btoi(mode == LingerOn))
			close(answers)
			if mode == LingerOn {
				lingeringFor(g, 3) // after d, e and f too, for them to come back
				lb.started(2)
				lb.fire <- time.Now() // they do not: the slot gives itself up
				idle(g)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			lb.mu.Lock()
			defer lb.mu.Unlock()
			if mode == LingerOn {
				require.Equal(t, [][]string{{"a", "b", "c"}, {"d", "e", "f"}}, f.batches, "the three came back and went together")
				require.Equal(t, []string{"first"}, f.singles)
				require.Len(t, lb.bounds, 2, "a linger after each batch")
				require.Positive(t, g.lingerNanos.Load())
				require.EqualValues(t, 1, g.nGathered.Load(), "d, e and f came")
				require.EqualValues(t, 1, g.nExpired.Load(), "nobody after them")
			} else {
				require.Equal(t, [][]string{{"a", "b", "c"}}, f.batches)
				require.Equal(t, []string{"first", "d", "e", "f"}, f.singles, "each found the slot free and went alone")
				require.Empty(t, lb.bounds, "never lingers")
				require.Zero(t, g.lingerNanos.Load())
			}
		})
	}
}

// TestGrouperLingerEndsAtItsBound: a slot lingering for callers that do not come back gives
// itself up when its bound passes (no longer than the statement before it took, and never
// longer than groupMaxLinger), so the next acquire finds it free and goes alone; an acquire
// that came while it lingered goes in the next statement once the bound passes. No linger
// after a statement of one acquire: a lone caller is never kept waiting.
func TestGrouperLingerEndsAtItsBound(t *testing.T) {
	f := &fakeStore{gate: make(chan struct{})}
	g, lb := newLingeringGrouper(f)
	batchAfterFirst(t, g, f, "a", "b", "c")
	lingeringFor(g, 3)
	lb.started(1)
	go g.acquire(bg, acquireArgs{in: AcquireInput{Key: "late"}})
	queued(g, 1)
	lb.fire <- time.Now() // nobody else came: the bound passes
	idle(g)
	lb.mu.Lock()
	bounds := lb.bounds
	lb.mu.Unlock()
	require.Len(t, bounds, 1, "no linger after the statement of one (late, alone) either")
	require.Positive(t, bounds[0])
	require.LessOrEqual(t, bounds[0], groupMaxLinger)
	require.LessOrEqual(t, bounds[0], time.Duration(g.busyNanos.Load()), "no longer than the statement before it took")
	f.mu.Lock()
	require.Equal(t, []string{"first", "late"}, f.singles, "late waited out the linger, then went in a statement of its own")
	f.mu.Unlock()

	d, err := g.acquire(bg, acquireArgs{in: AcquireInput{Key: "next"}})
	require.NoError(t, err)
	require.Equal(t, "next", d.op.Key)
	f.mu.Lock()
	require.Equal(t, []string{"first", "late", "next"}, f.singles, "the slot was free: next went alone at once")
	f.mu.Unlock()
}

// TestGrouperLingersOnlyForSmallBatches: a slot that has groupLingerTarget acquires waiting when
// its statement ends does not linger, however many it answered: by then a statement's fixed
// cost is spread thin, and lingering would only idle the slot (64 connections lost 8-12% to
// it before this bound). With fewer waiting, it lingers, but only until groupLingerTarget wait.
func TestGrouperLingersOnlyForSmallBatches(t *testing.T) {
	f := &fakeStore{gate: make(chan struct{}), batchGate: make(chan struct{})}
	g, lb := newLingeringGrouper(f)
	g.maxItems = 64
	ask := func(key string) { go g.acquire(bg, acquireArgs{in: AcquireInput{Key: key}}) }
	ask("first")
	f.await(func() int { return len(f.singles) }, 1)
	for i := range 20 {
		queued(g, i)
		ask(fmt.Sprint("a", i))
	}
	queued(g, 20)
	close(f.gate) // first is answered; the 20 go in one batch, held at batchGate
	f.await(func() int { return len(f.batches) }, 1)
	for i := range groupLingerTarget { // arrive while the batch of 20 runs
		queued(g, i)
		ask(fmt.Sprint("b", i))
	}
	queued(g, groupLingerTarget)
	f.batchGate <- struct{}{} // the batch of 20 ends with 16 waiting
	for {                     // the slot sends them at once, or lingers
		f.mu.Lock()
		n := len(f.batches)
		f.mu.Unlock()
		lb.mu.Lock()
		l := len(lb.bounds)
		lb.mu.Unlock()
		if n == 2 || l > 0 {
			break
		}
	}
	lb.mu.Lock()
	require.Empty(t, lb.bounds, "no linger after the batch of 20: 16 were waiting")
	lb.mu.Unlock()
	f.batchGate <- struct{}{} // the batch of 16 ends with none waiting: now it lingers, for 16
	lingeringFor(g, groupLingerTarget)
	require.Len(t, lb.started(1), 1)
	lb.fire <- time.Now()
	idle(g)
	f.mu.Lock()
	defer f.mu.Unlock()
	require.Len(t, f.batches, 2)
	require.Len(t, f.batches[0], 20)
	require.Len(t, f.batches[1], groupLingerTarget)
}

// autoLingeringAfter returns a LingerAuto grouper (batches of at most 8) lingering after a
// batch of keys: one acquire went alone, keys queued behind it, were decided in one batch and
// answered, and the slot's first linger has started, waiting for len(keys) acquires. ask sends
// one more acquire without waiting for its answer.
func autoLingeringAfter(keys []string) (*fakeStore, *grouper, *fakeLingerBound, func(key string)) {
	f := &fakeStore{gate: make(chan struct{}), batchGate: make(chan struct{})}
	g, lb := newLingeringGrouper(f)
	g.linger.mode = LingerAuto
	g.maxItems = 8
	ask := func(key string) { go g.acquire(bg, acquireArgs{in: AcquireInput{Key: key}}) }
	ask("first")
	f.await(func() int { return len(f.singles) }, 1)
	for i, k := range keys {
		queued(g, i)
		ask(k)
	}
	queued(g, len(keys))
	close(f.gate)
	f.await(func() int { return len(f.batches) }, 1)
	f.batchGate <- struct{}{}
	lingeringFor(g, len(keys))
	lb.started(1)
	return f, g, lb, ask
}

// TestGrouperAutoSkipsALingerAfterOneExpired: under LingerAuto, a linger that ended at its bound
// with fewer than half of what it waited for (the callers answered did not come back in time)
// makes the slot skip the next one: the batch that the expired linger let through is followed
// by no linger, and the slot is given back.
func TestGrouperAutoSkipsALingerAfterOneExpired(t *testing.T) {
	// The slot lingers for 5; two of them come back, fewer than half.
	f, g, lb, ask := autoLingeringAfter([]string{"a", "b", "c", "d", "e"})
	ask("f")
	queued(g, 1)
	ask("g")
	queued(g, 2)
	lb.fire <- time.Now() // the bound passes: expired
	f.await(func() int { return len(f.batches) }, 2)
	f.batchGate <- struct{}{} // f, g answered: this time no linger
	idle(g)
	require.Len(t, lb.started(1), 1, "the linger after f and g was skipped")
	require.EqualValues(t, 1, g.nExpired.Load())
	require.Zero(t, g.nGathered.Load())
	f.mu.Lock()
	defer f.mu.Unlock()
	require.Equal(t, [][]string{{"a", "b", "c", "d", "e"}, {"f", "g"}}, f.batches)
}

// TestGrouperLingerThatGathersHalfPays: a linger that ends at its bound with at least half of
// what it waited for counts as gathered, and LingerAuto keeps lingering. Counted as wasted,
// such lingers (a fifth of them at 16 connections, most of the callers back) made the slot
// skip lingers that paid: 13.3 acquires per statement instead of 15.7.
func TestGrouperLingerThatGathersHalfPays(t *testing.T) {
	// The slot lingers for 4; two of them come back.
	f, g, lb, ask := autoLingeringAfter([]string{"a", "b", "c", "d"})
	ask("e")
	queued(g, 1)
	ask("f")
	queued(g, 2)
	lb.fire <- time.Now()
	f.await(func() int { return len(f.batches) }, 2)
	f.batchGate <- struct{}{} // e, f answered: lingers again
	lingeringFor(g, 2)
	lb.started(2)
	lb.fire <- time.Now()
	idle(g)
	require.EqualValues(t, 1, g.nGathered.Load())
	require.EqualValues(t, 1, g.nExpired.Load(), "the last: nobody came")
}
