package models

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3/lock"
)

// xactLocker is goose's lock.Locker for PostgreSQL that keeps no session state, so it holds
// behind a pooler in transaction mode (PgBouncer's pool_mode=transaction), where a session
// advisory lock does not: the lock and the unlock may run on different server sessions, and a
// second instance may be handed the server session that already holds it. Here the lock is
// pg_try_advisory_xact_lock inside a transaction that stays open until Unlock commits it; a
// pooler keeps a transaction on one server session, and the lock ends with the transaction,
// even when the process dies.
//
// The transaction runs on a connection of its own, opened from the pool's settings, so it never
// competes with goose for the pool (IDEMGATE_DB_MAX_CONNS may be 1). A waiter polls with
// short transactions rather than blocking in one, so waiting instances pin no pooled server
// connection: the holder needs only two (its lock and its migration) however many start at
// once. The key is goose's own (lock.DefaultLockID), so an older release taking goose's session
// lock on a direct connection and this one still exclude each other.
type xactLocker struct {
	cfg     *pgx.ConnConfig
	maxWait time.Duration
	// log, when set, hears once that the lock is busy, so a start that waits says why.
	log  *slog.Logger
	conn *pgx.Conn
	tx   pgx.Tx
}

// migrationLockWait bounds how long a starting instance waits for another's migrations: the
// 5 minutes goose's session locker allowed, so a stuck holder fails starts instead of hanging
// them.
const migrationLockWait = 5 * time.Minute

// newXactLocker returns a locker that connects with cfg (copied; statements go by the simple
// protocol, so no prepared statement is left on a pooled server session).
func newXactLocker(cfg *pgx.ConnConfig) *xactLocker {
	c := cfg.Copy()
	c.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	return &xactLocker{cfg: c, maxWait: migrationLockWait}
}

// Lock waits, until ctx ends or l.maxWait has passed, for the migration lock; db is unused
// (see xactLocker).
func (l *xactLocker) Lock(ctx context.Context, _ *sql.DB) error {
	if l.tx != nil {
		return errors.New("migration lock already held")
	}
	ctx, cancel := context.WithTimeout(ctx, l.maxWait)
	defer cancel() // bounds the wait only: the lock's transaction outlives Lock
	conn, err := pgx.ConnectConfig(ctx, l.cfg)
	if err != nil {
		return fmt.Errorf("connect for the migration lock: %w", err)
	}
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		tx, err := conn.Begin(ctx)
		var held bool
		if err == nil {
			err = tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1)", lock.DefaultLockID).Scan(&held)
		}
		if err != nil {
			_ = conn.Close(context.WithoutCancel(ctx))
			return fmt.Errorf("take the migration lock: %w", err)
		}
		if held {
			l.conn, l.tx = conn, tx
			return nil
		}
		if wait == 50*time.Millisecond && l.log != nil {
			l.log.Info("waiting for the migration lock: another instance is migrating this database",
				"max_wait", l.maxWait.String())
		}
		if err := tx.Rollback(ctx); err != nil {
			_ = conn.Close(context.WithoutCancel(ctx))
			return fmt.Errorf("take the migration lock: %w", err)
		}
		select {
		case <-ctx.Done():
			_ = conn.Close(context.WithoutCancel(ctx))
			return fmt.Errorf("wait for the migration lock (another instance is migrating): %w", ctx.Err())
		case <-time.After(wait):
		}
	}
}

// Unlock commits the lock's transaction, which releases the lock. An error means the lock may
// have been lost before the migrations ended (its connection broke), so the caller must not
// trust that no other instance migrated at the same time.
func (l *xactLocker) Unlock(ctx context.Context, _ *sql.DB) error {
	if l.tx == nil {
		return errors.New("migration lock not held")
	}
	err := l.tx.Commit(ctx)
	_ = l.conn.Close(ctx)
	l.conn, l.tx = nil, nil
	if err != nil {
		return fmt.Errorf("release the migration lock: %w", err)
	}
	return nil
}
