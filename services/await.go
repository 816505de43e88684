package services

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/idemgate/idemgate/models"
	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"
)

// MaxWait is the longest GET /v1/operations/{id}?wait= may wait (docs/reference.md §8).
const MaxWait = 60 * time.Second

// DefaultMaxWaiters is how many requests may wait at once on one instance unless configured
// otherwise (IDEMGATE_MAX_WAITERS).
const DefaultMaxWaiters = 1000

// notifyChannel is the PostgreSQL NOTIFY channel on which the operations_notify trigger (models/sql/postgres/operations_notify.sql) announces
// that an operation left in_progress; the payload is the operation id.
const notifyChannel = "idemgate_operation"

// DefaultAwaitPoll is how often an Awaiter asks the database, in one query for all its waiters,
// which of their operations left in_progress: the fallback for a notification that never
// arrives (SQLite has none; a LISTEN connection may be down or behind a transaction pooler).
const DefaultAwaitPoll = 100 * time.Millisecond

// AwaiterConfig configures an Awaiter. Zero values take the defaults.
type AwaiterConfig struct {
	// MaxWaiters bounds the requests waiting at once (DefaultMaxWaiters); one more is refused
	// with ErrTooManyWaiters.
	MaxWaiters int
	// ListenURL is the PostgreSQL URL of the one LISTEN connection (ignored on SQLite). Empty
	// means the URL the pool was opened with (DATABASE_URL).
	ListenURL string
	// Poll is the polling interval (DefaultAwaitPoll).
	Poll time.Duration
	// NoListen never opens the LISTEN connection, for engines and poolers without
	// LISTEN/NOTIFY (IDEMGATE_LISTEN=false): waiters are woken by the poll alone, which costs
	// them up to Poll of latency and nothing else (issue 31).
	NoListen bool
	// Log receives the listener's connection problems, each kind once until it recovers.
	Log *slog.Logger
}

// Awaiter lets requests wait for an operation to leave in_progress (docs/reference.md §8)
// without holding a database connection while they wait. It wakes waiters from two sources:
// PostgreSQL notifications on one dedicated connection (not from the pool), and a poll of the
// database every AwaiterConfig.Poll with one query for all current waiters, never one per
// waiter. Either is enough; together a lost notification costs at most one poll interval.
// Safe for concurrent use. Run must be running for anything but the first and last read.
type Awaiter struct {
	db    *models.DB
	st    store
	reads *Reads
	cfg   AwaiterConfig
	log   *slog.Logger

	n       atomic.Int64 // waiting requests, for the cap
	mu      sync.Mutex
	waiting map[string]map[chan struct{}]struct{} // by operation id; each channel closed once
	closed  chan struct{}
	once    sync.Once

	// listening is true while the LISTEN connection is up (tests, logs).
	listening atomic.Bool
}

// NewAwaiter returns an Awaiter over db.
func NewAwaiter(db *models.DB, cfg AwaiterConfig) *Awaiter {
	if cfg.MaxWaiters <= 0 {
		cfg.MaxWaiters = DefaultMaxWaiters
	}
	if cfg.Poll <= 0 {
		cfg.Poll = DefaultAwaitPoll
	}
	if cfg.ListenURL == "" && db.Pool != nil {
		cfg.ListenURL = db.Pool.Config().ConnConfig.ConnString()
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Awaiter{db: db, st: newStore(db), reads: NewReads(db), cfg: cfg, log: log,
		waiting: map[string]map[chan struct{}]struct{}{}, closed: make(chan struct{})}
}

// Waiting returns how many requests wait right now (for metrics and tests).
func (a *Awaiter) Waiting() int { return int(a.n.Load()) }

// Listening reports whether the LISTEN connection is up.
func (a *Awaiter) Listening() bool { return a.listening.Load() }

// Close releases every waiter at once (each answers with the operation's current state) and
// makes later waits answer at once: call it when the server shuts down, before waiting for
// in-flight requests.
func (a *Awaiter) Close() {
	a.once.Do(func() { close(a.closed) })
}

// Run polls, and on PostgreSQL with a ListenURL listens, until ctx ends or Close, then
// releases every waiter.
func (a *Awaiter) Run(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-a.closed:
			cancel()
		case <-ctx.Done():
		}
	}()
	if a.st.listens() && a.cfg.ListenURL != "" && !a.cfg.NoListen {
		go a.listen(ctx)
	}
	t := time.NewTicker(a.cfg.Poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			a.Close()
			return
		case <-t.C:
			a.poll(ctx)
		}
	}
}

// Wait returns operation id of tenantID as soon as it is no longer in_progress, or after d
// with its state then (docs/reference.md §8). If the operation's lease lapses before d ends,
// Wait makes it uncertain (lease_expired_without_outcome) at the lease end, as acquire and
// renew would, and returns it then, instead of leaving it in_progress until a reaper pass. d is 0 to MaxWait; 0 reads once. ctx ending (the
// client went away) or Close ends the wait early, with the state then. While it waits it holds
// no database connection: the operation is read before and after, each read bounded by the
// store timeout. Errors: ErrNotFound, ErrTooManyWaiters (the instance's cap), ErrStoreUnavailable.
func (a *Awaiter) Wait(ctx context.Context, tenantID int64, id string, d time.Duration) (*OperationDetail, error) {
	read := func() (*OperationDetail, error) {
		rctx, cancel := a.db.Bounded(context.WithoutCancel(ctx))
		defer cancel()
		return a.reads.GetOperation(rctx, tenantID, id)
	}
	u, err := uuid.Parse(id)
	if d <= 0 || err != nil {
		return read()
	}
	id = u.String()
	if a.n.Add(1) > int64(a.cfg.MaxWaiters) {
		a.n.Add(-1)
		return nil, ErrTooManyWaiters
	}
	defer a.n.Add(-1)
	// Registered before the first read, so an outcome committed between the read and the wait
	// still wakes it.
	ch := a.register(id)
	defer a.unregister(id, ch)
	op, err := read()
	if err != nil || op.State != StateInProgress {
		return op, err
	}
	deadline := time.Now().Add(min(d, MaxWait))
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	// docs/reference.md §8: a lease that lapses before the deadline ends the wait then, with
	// the operation made uncertain, instead of at the next reaper pass. One timer, armed at the
	// lease end this waiter last read; unarmed when the deadline comes first.
	lt := time.NewTimer(0)
	defer lt.Stop()
	<-lt.C
	for {
		var lapse <-chan time.Time
		if lease := op.LeaseExpiresAt; lease.Before(deadline) {
			lt.Reset(time.Until(lease))
			lapse = lt.C
		}
		select {
		case <-ch:
			return read()
		case <-t.C:
			return read()
		case <-ctx.Done():
			return read()
		case <-a.closed:
			return read()
		case <-lapse:
		}
		if err := a.lapse(ctx, tenantID, id); err != nil {
			a.log.Debug("await lease lapse failed", "err", err)
			return read()
		}
		prev := op.LeaseExpiresAt
		if op, err = read(); err != nil || op.State != StateInProgress {
			return op, err
		}
		if !op.LeaseExpiresAt.After(prev) {
			// Not lapsed yet by the database's clock (it runs behind this process's): look
			// again after a poll interval, not at once.
			op.LeaseExpiresAt = time.Now().Add(a.cfg.Poll)
		}
		// Otherwise it was renewed meanwhile: wait for the new lease end.
	}
}

// lapse applies docs/reference.md §8's lapse to operation id of tenantID if it is still
// in_progress and its lease ran out by the database's clock: lapseIfLeaseLapsed, the fenced
// transition acquire, renew, release and the reaper apply (a renew or outcome committed first
// wins), in its own transaction bounded by the store timeout, even if the waiter went away.
func (a *Awaiter) lapse(ctx context.Context, tenantID int64, id string) error {
	ctx = context.WithoutCancel(ctx)
	return a.db.Tx(ctx, func(tx *gorm.DB) error {
		var m models.Operation
		if err := tx.Where("id = ? AND tenant_id = ?", id, tenantID).Take(&m).Error; err != nil {
			return err
		}
		now, err := a.db.Now(ctx, tx)
		if err != nil {
			return err
		}
		_, err = lapseIfLeaseLapsed(tx, &m, now)
		return err
	})
}

func (a *Awaiter) register(id string) chan struct{} {
	ch := make(chan struct{})
	a.mu.Lock()
	defer a.mu.Unlock()
	set := a.waiting[id]
	if set == nil {
		set = map[chan struct{}]struct{}{}
		a.waiting[id] = set
	}
	set[ch] = struct{}{}
	return ch
}

func (a *Awaiter) unregister(id string, ch chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if set := a.waiting[id]; set != nil {
		delete(set, ch)
		if len(set) == 0 {
			delete(a.waiting, id)
		}
	}
}

// wake releases every waiter of operation id: it left in_progress. Each channel is closed
// once: it is removed from the set as it is closed.
func (a *Awaiter) wake(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for ch := range a.waiting[id] {
		close(ch)
	}
	delete(a.waiting, id)
}

// pollChunk bounds the ids of one poll query.
const pollChunk = 500

// poll asks, for all current waiters at once (in chunks of pollChunk ids), which operations
// left in_progress, and wakes their waiters.
func (a *Awaiter) poll(ctx context.Context) {
	a.mu.Lock()
	ids := make([]string, 0, len(a.waiting))
	for id := range a.waiting {
		ids = append(ids, id)
	}
	a.mu.Unlock()
	for len(ids) > 0 {
		chunk := ids[:min(len(ids), pollChunk)]
		ids = ids[len(chunk):]
		qctx, cancel := a.db.Bounded(ctx)
		var done []string
		err := a.db.WithContext(qctx).Model(&models.Operation{}).
			Where("id IN ? AND state <> ?", chunk, StateInProgress).Pluck("id", &done).Error
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				a.log.Debug("await poll failed", "err", err)
			}
			return
		}
		for _, id := range done {
			a.wake(id)
		}
	}
}

// listen holds the one LISTEN connection, reconnecting with backoff (listenBackoff); each
// notification wakes the waiters of the operation it names. A failure is logged once until the
// connection works again; meanwhile polling alone answers.
func (a *Awaiter) listen(ctx context.Context) {
	var b listenBackoff
	for ctx.Err() == nil {
		err := a.listenOnce(ctx)
		wasUp := a.listening.Swap(false)
		if ctx.Err() != nil {
			return
		}
		delay, warn := b.next(wasUp)
		if warn {
			a.log.Warn("cannot LISTEN for operation changes; waiting requests rely on polling",
				"err", err, "poll", a.cfg.Poll.String())
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

// listenBackoff paces the LISTEN connection's reconnects: 100 ms after the first failure,
// doubling up to 30 s while the connection keeps failing, and back to 100 ms once it has been
// up. Without the reset, every lost connection in a process's life added to the next wait, so
// from about the second failover on (docs/operations.md "High availability") the listener
// took up to 30 s to reach the new primary.
type listenBackoff struct {
	delay  time.Duration // the wait before the next attempt; 0 before any failure
	warned bool          // this outage was logged
}

// next is the wait after an attempt that ended (wasUp: after the connection had been up) and
// whether to log it: once per outage.
func (b *listenBackoff) next(wasUp bool) (delay time.Duration, warn bool) {
	if wasUp || b.delay == 0 {
		b.delay, b.warned = 100*time.Millisecond, false
	} else {
		b.delay = min(b.delay*2, 30*time.Second)
	}
	warn, b.warned = !b.warned, true
	return b.delay, warn
}

func (a *Awaiter) listenOnce(ctx context.Context) error {
	cctx, cancel := a.db.Bounded(ctx)
	conn, err := pgx.Connect(cctx, a.cfg.ListenURL)
	cancel()
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		return err
	}
	if err := a.probe(ctx, conn); err != nil {
		return err
	}
	a.listening.Store(true)
	// Whatever changed while no connection listened is caught by the next poll.
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		a.wake(n.Payload)
	}
}

// probe sends a notification on conn's channel from another connection (the pool's, as every
// real notification is) and waits, at most the store timeout (5 s when none), for it to
// arrive. One sent on conn itself would prove nothing: the pooler forwards what arrives during
// the client's own transaction. Behind a transaction pooler (PgBouncer in transaction mode)
// LISTEN succeeds on whichever server connection ran it and then nothing ever arrives: without
// the probe the waiters fell back to polling with nothing logged (issue 28). Other instances
// receive the probe too; its payload names no operation, so it wakes nobody.
func (a *Awaiter) probe(ctx context.Context, conn *pgx.Conn) error {
	payload := "probe:" + strings.ReplaceAll(uuid.NewString(), "-", "")
	bound := a.db.StoreTimeout
	if bound <= 0 {
		bound = 5 * time.Second
	}
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	if err := a.db.WithContext(wctx).Exec("SELECT pg_notify(?, ?)", notifyChannel, payload).Error; err != nil {
		return err
	}
	for {
		n, err := conn.WaitForNotification(wctx)
		if err != nil {
			if ctx.Err() == nil && wctx.Err() != nil {
				return fmt.Errorf("%w (within %s): behind a transaction pooler such as PgBouncer in transaction mode "+
					"notifications never arrive; point IDEMGATE_LISTEN_DATABASE_URL at PostgreSQL directly", errNoNotifications, bound)
			}
			return err
		}
		if n.Payload == payload {
			return nil
		}
		a.wake(n.Payload)
	}
}

// errNoNotifications is probe's error when its own notification never came back.
var errNoNotifications = errors.New("LISTEN connection received no notification, not even its own test notification")
