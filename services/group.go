package services

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// grouper is group admission: it gathers the acquires that one process receives at the same
// time and decides them in one statement, one transaction and one commit (acquireBatch), so
// that under load many acquires share a round trip and a WAL flush. There is no timer. An
// acquire that arrives while fewer than maxInFlight statements are running is sent at once,
// alone, by the caller's own goroutine: a single request is never slowed. Only while
// maxInFlight statements are already running do new acquires wait, and whichever statement
// finishes first takes every waiting acquire (up to maxItems) as its next batch: the busier
// the database, the larger the batches. After a statement of several acquires the slot may
// also linger (see LingerMode): wait, at most as long as that statement took and never more
// than groupMaxLinger, until the acquires it just answered have come back, and take them with
// the ones already waiting.
//
// Within a batch each acquire is decided by the same function as alone, in arrival order, so
// every guarantee of a single acquire holds, across processes too. Every statement sent from
// a slot runs with a short lock timeout (bounded): if one of its acquires would wait on a row
// lock (another transaction is releasing, recording an outcome on, or taking over its key),
// the statement is undone (contended reports that error) and its acquires are decided again
// outside the slots, each alone and waiting as long as its own deadline allows. So the slots
// never wait on one key's lock, and no acquire waits on another tenant's key for longer than
// that timeout.
type grouper struct {
	// single decides one acquire; bounded asks for the lock timeout (see above).
	single func(ctx context.Context, a acquireArgs, bounded bool) (decision, error)
	// batch decides as in order in one statement, bounded by the lock timeout.
	batch func(ctx context.Context, as []acquireArgs) ([]decision, error)
	// contended reports the error of a statement that gave up on a row lock (nothing was
	// decided); nil when the store has no row locks (SQLite).
	contended func(error) bool
	// bound gives a batch its own deadline (the store timeout): it serves many callers, so
	// none of their contexts may cancel it.
	bound       func() (context.Context, context.CancelFunc)
	maxInFlight int
	maxItems    int

	// linger decides whether the slot lingers; only the goroutine holding the slot uses it.
	linger lingerControl
	// lingerWait starts the bound of one linger: its channel receives once d has passed, stop
	// releases it early (time.NewTimer; tests control it).
	lingerWait func(d time.Duration) (c <-chan time.Time, stop func())

	mu       sync.Mutex
	queue    []*pendingAcquire
	inFlight int
	// want, while the slot lingers, is how many waiting acquires end the linger (0 otherwise);
	// the acquire that makes the queue that long says so on wake (capacity 1).
	want int
	wake chan struct{}

	// Counts since start: statements of more than one acquire and the acquires in them,
	// acquires decided in a statement of their own, and statements undone on a row lock (for
	// tests, metrics and benchmarks).
	nBatches, nItems, nSingles, nContended atomic.Int64
	// busyNanos is the time statements sent from the slots took, summed (nanoseconds): their
	// occupancy. Acquires decided alone after a contended statement run outside the slots and
	// are not in it.
	busyNanos atomic.Int64
	// lingerNanos is the time the slot spent lingering, summed (nanoseconds); nGathered and
	// nExpired count the lingers that gathered what they waited for and those that ended at
	// their bound.
	lingerNanos, nGathered, nExpired atomic.Int64
}

// newGrouper is a grouper of at most maxInFlight statements of at most maxItems acquires that
// lingers as mode says; the store's functions are set by the caller. Lingering needs the one
// slot groupMaxInFlight gives: with several, a slot lingering for callers that another slot's
// statement is about to take makes no sense, and lingerControl is driven by the one goroutine
// holding the slot; so with maxInFlight other than 1 it never lingers.
func newGrouper(mode LingerMode, maxInFlight, maxItems int) *grouper {
	if maxInFlight != 1 {
		mode = LingerOff
	}
	return &grouper{maxInFlight: maxInFlight, maxItems: maxItems, wake: make(chan struct{}, 1),
		linger: lingerControl{mode: mode}, lingerWait: func(d time.Duration) (<-chan time.Time, func()) {
			t := time.NewTimer(d)
			return t.C, func() { t.Stop() }
		}}
}

// busySince adds the time since start, when a statement from a slot was sent, to busyNanos,
// and returns it.
func (g *grouper) busySince(start time.Time) time.Duration {
	took := time.Since(start)
	g.busyNanos.Add(int64(took))
	return took
}

// groupedStore is a store whose acquires go through a grouper (group admission); everything
// else, batch acquires included, is the store's own.
type groupedStore struct {
	store
	g *grouper
}

func (s groupedStore) acquire(ctx context.Context, a acquireArgs) (decision, error) {
	return s.g.acquire(ctx, a)
}

// groupMaxInFlight is how many acquire statements group admission runs at once per process. One:
// acquires arriving while it runs wait and go together in the next one. Two or four slots were
// slower (measured: docs/operations.md "Figures behind the code"): a second statement overlaps a
// commit's WAL flush, but halves the batches that share one. groupMaxItems bounds a batch.
const (
	groupMaxInFlight = 1
	groupMaxItems    = 128
)

// pendingAcquire is one acquire waiting for a batch. Its fields after done are written by the
// goroutine that ran the batch and read by the waiter after <-done.
type pendingAcquire struct {
	ctx       context.Context
	args      acquireArgs
	done      chan struct{}
	d         decision
	err       error
	taken     bool // under grouper.mu: in a batch already, it will be decided
	abandoned bool // under grouper.mu: its caller gave up before it was taken
}

// acquire decides a, alone or in a batch.
func (g *grouper) acquire(ctx context.Context, a acquireArgs) (decision, error) {
	g.mu.Lock()
	if g.inFlight < g.maxInFlight && len(g.queue) == 0 {
		g.inFlight++
		g.mu.Unlock()
		g.nSingles.Add(1)
		start := time.Now()
		d, err := g.single(ctx, a, true)
		g.busySince(start)
		g.release()
		if g.isContended(err) {
			return g.single(ctx, a, false)
		}
		return d, err
	}
	p := &pendingAcquire{ctx: ctx, args: a, done: make(chan struct{})}
	g.queue = append(g.queue, p)
	if g.want > 0 && len(g.queue) >= g.want {
		g.want = 0
		select {
		case g.wake <- struct{}{}:
		default:
		}
	}
	if g.inFlight < g.maxInFlight {
		g.inFlight++
		go g.drain()
	}
	g.mu.Unlock()
	select {
	case <-p.done:
		return p.d, p.err
	case <-ctx.Done():
	}
	g.mu.Lock()
	if !p.taken {
		p.abandoned = true
	}
	g.mu.Unlock()
	// Taken or not, the caller is told the store did not answer in time; an acquire already
	// sent may still commit, exactly as when a deadline cuts off a single acquire's commit
	// (its attempt_id retry gets the operation back).
	return decision{}, ctx.Err()
}

func (g *grouper) isContended(err error) bool {
	if err == nil || g.contended == nil || !g.contended(err) {
		return false
	}
	g.nContended.Add(1)
	return true
}

// release gives back a statement slot; waiting acquires keep it for a batch.
func (g *grouper) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.queue) > 0 {
		go g.drain()
		return
	}
	g.inFlight--
}

// drain runs batches of waiting acquires until none wait, then gives its slot back. After a
// statement of several acquires it may linger first (lingerFor).
func (g *grouper) drain() {
	answered, took := 0, time.Duration(0) // by the statement this goroutine ran last
	for {
		if answered > 1 {
			g.lingerFor(answered, took)
		}
		g.mu.Lock()
		var batch []*pendingAcquire
		n := 0
		for n < len(g.queue) && len(batch) < g.maxItems {
			p := g.queue[n]
			n++
			if p.abandoned {
				continue
			}
			p.taken = true
			batch = append(batch, p)
		}
		g.queue = g.queue[n:]
		if len(batch) == 0 {
			g.inFlight--
			g.mu.Unlock()
			return
		}
		g.mu.Unlock()
		answered, took = g.run(batch)
	}
}

// lingerFor holds the slot, with no statement running, until as many acquires wait as the last
// statement answered (they are likely to come back: a caller answered sends its next request)
// plus those that waited already, up to groupLingerTarget (and maxItems); or until as long as
// that statement took has passed (waiting longer cannot pay: the acquires waiting could have
// had a statement of their own in that time), and never longer than groupMaxLinger. With
// groupLingerTarget acquires waiting already it does not wait at all, nor when g.linger says
// not to.
func (g *grouper) lingerFor(answered int, took time.Duration) {
	g.mu.Lock()
	want := min(answered+len(g.queue), groupLingerTarget, g.maxItems)
	if len(g.queue) >= want || !g.linger.lingering() {
		g.mu.Unlock()
		return
	}
	g.want = want
	waiting := len(g.queue)
	g.mu.Unlock()
	start := time.Now()
	bound, stop := g.lingerWait(min(took, groupMaxLinger))
	select {
	case <-g.wake:
	case <-bound:
	}
	stop()
	g.mu.Lock()
	g.want = 0
	select { // a wake sent as the bound passed
	case <-g.wake:
	default:
	}
	// Gathered: at least half the acquires it waited for came. In a closed loop of callers
	// (make bench at 16 connections) a fifth of the lingers ended at their bound with most of
	// them there; counted as wasted, they made LingerAuto skip lingers that pay.
	gathered := 2*(len(g.queue)-waiting) >= want-waiting
	g.mu.Unlock()
	g.lingerNanos.Add(int64(time.Since(start)))
	if gathered {
		g.nGathered.Add(1)
	} else {
		g.nExpired.Add(1)
	}
	g.linger.lingered(gathered)
}

// run decides batch and hands each acquire its answer. It returns how many acquires the
// statement answered (none when it was undone on a row lock: those are decided alone, later)
// and how long it took (its share of busyNanos).
func (g *grouper) run(batch []*pendingAcquire) (answered int, took time.Duration) {
	if len(batch) == 1 {
		// A batch of one is a single acquire: counted as one, sent as one.
		g.nSingles.Add(1)
		p := batch[0]
		start := time.Now()
		p.d, p.err = g.single(p.ctx, p.args, true)
		took := g.busySince(start)
		if g.isContended(p.err) {
			go g.decideAlone(batch)
			return 0, took
		}
		close(p.done)
		return 1, took
	}
	g.nBatches.Add(1)
	g.nItems.Add(int64(len(batch)))
	as := make([]acquireArgs, len(batch))
	for i, p := range batch {
		as[i] = p.args
	}
	ctx, cancel := g.bound()
	start := time.Now()
	ds, err := g.batch(ctx, as)
	took = g.busySince(start)
	cancel()
	if g.isContended(err) {
		// One of them would wait on a row lock: nothing was decided. The slot goes on with
		// the next batch while these are decided alone.
		go g.decideAlone(batch)
		return 0, took
	}
	for i, p := range batch {
		if err != nil {
			p.err = err
		} else {
			p.d = ds[i]
		}
		close(p.done)
	}
	return len(batch), took
}

// decideAlone decides each acquire of an undone statement alone, unbounded (each waits on a
// row lock as long as its caller's deadline allows), outside the statement slots. Acquires of
// one key are decided one after another in arrival order, as the batch would have; different
// keys at once, so that a key whose row is locked delays only its own acquires.
func (g *grouper) decideAlone(batch []*pendingAcquire) {
	type tenantKey struct {
		tenant int64
		key    string
	}
	byKey := map[tenantKey][]*pendingAcquire{}
	var order []tenantKey
	for _, p := range batch {
		k := tenantKey{p.args.p.TenantID, p.args.in.Key}
		if _, ok := byKey[k]; !ok {
			order = append(order, k)
		}
		byKey[k] = append(byKey[k], p)
	}
	var wg sync.WaitGroup
	for _, k := range order {
		wg.Add(1)
		go func(ps []*pendingAcquire) {
			defer wg.Done()
			for _, p := range ps {
				p.d, p.err = g.single(p.ctx, p.args, false)
				close(p.done)
			}
		}(byKey[k])
	}
	wg.Wait()
}
