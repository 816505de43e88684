package services

import (
	"context"
	"fmt"
	"time"

	"github.com/idemgate/idemgate/models"
)

// Database reports on the connection pool every service borrows from, as /readyz and /metrics
// see it, so the HTTP layer needs neither PostgreSQL's pgx pool nor database/sql's handle: which
// of the two is the real pool is the store's business (docs/operations.md, "Metrics").
type Database struct {
	db *models.DB
}

// NewDatabase reports on db's pool.
func NewDatabase(db *models.DB) *Database { return &Database{db: db} }

// Ping asks the database for a round trip within ctx. Any failure, a refused statement
// included, is ErrStoreUnavailable (wrapping the cause): a database that cannot answer a
// ping cannot serve an acquire either, so the instance is not ready (docs/reference.md §4).
func (d *Database) Ping(ctx context.Context) error {
	sqlDB, err := d.db.SQL()
	if err == nil {
		err = sqlDB.PingContext(ctx)
	}
	if err != nil {
		return &Error{Code: CodeStoreUnavailable, Message: ErrStoreUnavailable.Message, err: fmt.Errorf("ping: %w", err)}
	}
	return nil
}

// PoolStats is one reading of the connection pool's counters. On PostgreSQL it is pgxpool's
// (the pool under GORM's database/sql handle, whose own statistics describe a wrapper); on
// SQLite it is database/sql's, mapped onto the same fields: a wait for a connection is an
// empty acquire, and a connection closed for idleness either way (count or time) is an idle
// destroy. Counters only grow over the process's life.
type PoolStats struct {
	// Max is the largest the pool may grow, in connections (IDEMGATE_DB_MAX_CONNS on
	// PostgreSQL; 0 when database/sql is unlimited).
	Max int
	// Acquired, Idle and Constructing are the pool's connections now, by state; Total is their
	// sum. SQLite opens connections inside database/sql, so Constructing is 0 there.
	Acquired, Idle, Constructing, Total int
	// Acquires counts connections taken from the pool, AcquireDuration their total time
	// (PostgreSQL only: database/sql does not count acquires that did not wait).
	Acquires        int64
	AcquireDuration time.Duration
	// EmptyAcquires counts acquires that waited because every connection was busy,
	// EmptyWait the total time they waited.
	EmptyAcquires int64
	EmptyWait     time.Duration
	// CanceledAcquires counts acquires given up because their context ended (PostgreSQL only).
	CanceledAcquires int64
	// NewConns counts connections opened (PostgreSQL only).
	NewConns int64
	// LifetimeDestroyed and IdleDestroyed count connections closed for their age and for
	// idleness.
	LifetimeDestroyed, IdleDestroyed int64
}

// MaxConns is PoolStats().Max without reading the counters; 0 when unlimited.
func (d *Database) MaxConns() int {
	if d.db.Pool != nil {
		return int(d.db.Pool.Config().MaxConns)
	}
	if sqlDB, err := d.db.SQL(); err == nil {
		return sqlDB.Stats().MaxOpenConnections
	}
	return 0
}

// PoolStats reads the pool's counters. It takes the pool's lock for microseconds and never
// touches the database, so a scrape cannot wait on a stalled one.
func (d *Database) PoolStats() PoolStats {
	if p := d.db.Pool; p != nil {
		s := p.Stat()
		return PoolStats{Max: int(s.MaxConns()), Acquired: int(s.AcquiredConns()), Idle: int(s.IdleConns()),
			Constructing: int(s.ConstructingConns()), Total: int(s.TotalConns()),
			Acquires: s.AcquireCount(), AcquireDuration: s.AcquireDuration(),
			EmptyAcquires: s.EmptyAcquireCount(), EmptyWait: s.EmptyAcquireWaitTime(),
			CanceledAcquires: s.CanceledAcquireCount(), NewConns: s.NewConnsCount(),
			LifetimeDestroyed: s.MaxLifetimeDestroyCount(), IdleDestroyed: s.MaxIdleDestroyCount()}
	}
	sqlDB, err := d.db.SQL()
	if err != nil {
		return PoolStats{}
	}
	s := sqlDB.Stats()
	return PoolStats{Max: s.MaxOpenConnections, Acquired: s.InUse, Idle: s.Idle, Total: s.OpenConnections,
		EmptyAcquires: s.WaitCount, EmptyWait: s.WaitDuration,
		LifetimeDestroyed: s.MaxLifetimeClosed, IdleDestroyed: s.MaxIdleClosed + s.MaxIdleTimeClosed}
}
