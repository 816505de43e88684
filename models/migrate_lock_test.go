package models

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3/lock"
	"github.com/stretchr/testify/require"
)

// TestXactLockerExcludes: the migration lock excludes, and is excluded by, goose's session lock
// on the same key (an instance of an older release migrating on a direct connection); a waiter
// gives up after maxWait with an error, and takes the lock once it is free. Advisory locks are
// per database, so the admin database of the tests is used (no other test locks this key there).
// This is an internal test: modeltest imports models.
func TestXactLockerExcludes(t *testing.T) {
	ctx := context.Background()
	admin := os.Getenv("TEST_DATABASE_URL")
	if admin == "" {
		admin = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	cfg, err := pgx.ParseConfig(admin)
	require.NoError(t, err)
	old, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer func() { _ = old.Close(ctx) }()
	try := func() bool {
		var ok bool
		require.NoError(t, old.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", lock.DefaultLockID).Scan(&ok))
		return ok
	}
	unlock := func() {
		var ok bool
		require.NoError(t, old.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", lock.DefaultLockID).Scan(&ok))
		require.True(t, ok)
	}

	require.True(t, try(), "the key is free at the start")
	l := newXactLocker(cfg)
	l.maxWait = 300 * time.Millisecond
	err = l.Lock(ctx, nil)
	require.ErrorContains(t, err, "another instance is migrating")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	unlock()

	require.NoError(t, l.Lock(ctx, nil))
	require.False(t, try(), "a session lock on the key while the migration lock is held")
	require.NoError(t, l.Unlock(ctx, nil))
	require.True(t, try(), "the key is free after Unlock")
	unlock()
	require.Error(t, l.Unlock(ctx, nil), "Unlock without Lock")
}
