package services

import (
	"context"
	"sync"
	"sync/atomic"
)

// grouper is group admission: it gathers the acquires that one process receives at the same
// time and decides them in one statement, one transaction and one commit (acquireBatch), so
// that under load many acquires share a round trip and a WAL flush. There is no timer. An
// acquire that arrives while fewer than maxInFlight statements are running is sent at once,
// alone, by the caller's own goroutine: a single request is never slowed. Only while
// maxInFlight statements are already running do new acquires wait, and whichever statement
// finishes first takes every waiting acquire (up to maxItems) as its next batch: the busier
// the database, the larger the batches.
//
// Within a batch each acquire is decided by the same function as alone, in arrival order, so
// every guarantee of a single acquire holds, across processes too. A batch runs with a short
// lock timeout: if any of its acquires would wait on a row lock (another transaction is
// releasing, recording an outcome on, or taking over one of its keys), the batch is undone and
// each of its acquires is decided alone, so that no acquire waits on another tenant's key for
// longer than that timeout.
type grouper struct {
	single func(ctx context.Context, a acquireArgs) (decision, error)
	batch  func(ctx context.Context, as []acquireArgs) ([]decision, error)
	// bound gives a batch its own deadline (the store timeout): it serves many callers, so
	// none of their contexts may cancel it.
	bound       func() (context.Context, context.CancelFunc)
	maxInFlight int
	maxItems    int

	mu       sync.Mutex
	queue    []*pendingAcquire
	inFlight int

	// Counts since start: statements of more than one acquire and the acquires in them, and
	// acquires sent alone because a slot was free (for tests and benchmarks).
	nBatches, nItems, nSingles atomic.Int64
}

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
		d, err := g.single(ctx, a)
		g.release()
		return d, err
	}
	p := &pendingAcquire{ctx: ctx, args: a, done: make(chan struct{})}
	g.queue = append(g.queue, p)
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

// drain runs batches of waiting acquires until none wait, then gives its slot back.
func (g *grouper) drain() {
	for {
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
		g.run(batch)
	}
}

// run decides batch and hands each acquire its answer.
func (g *grouper) run(batch []*pendingAcquire) {
	if len(batch) == 1 {
		p := batch[0]
		p.d, p.err = g.single(p.ctx, p.args)
		close(p.done)
		return
	}
	g.nBatches.Add(1)
	g.nItems.Add(int64(len(batch)))
	as := make([]acquireArgs, len(batch))
	for i, p := range batch {
		as[i] = p.args
	}
	ctx, cancel := g.bound()
	ds, err := g.batch(ctx, as)
	cancel()
	if err != nil && isLockTimeout(err) {
		// One of them would wait on a row lock: nothing was decided; decide each alone, in
		// arrival order, each with its caller's own deadline.
		for _, p := range batch {
			p.d, p.err = g.single(p.ctx, p.args)
			close(p.done)
		}
		return
	}
	for i, p := range batch {
		if err != nil {
			p.err = err
		} else {
			p.d = ds[i]
		}
		close(p.done)
	}
}
