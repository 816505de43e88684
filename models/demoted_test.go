package models_test

// docs/operations.md "High availability": a pooled connection whose server has become a
// standby refuses every write (SQLSTATE 25006). The pool must drop such a connection, so that
// the next one goes through DATABASE_URL's host list (target_session_attrs=read-write) to the
// new primary, instead of failing every write it is lent for.

import (
	"context"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/services"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// TestPoolDropsConnectionToDemotedServer stands in for a demotion without a restart: the one
// pooled connection is made read-only for the rest of its session
// (default_transaction_read_only, which refuses writes with the same 25006 a standby gives).
// The first write fails with 25006, which is store_unavailable (a retry may succeed); the
// next write through the same one-connection pool gets a new connection and succeeds. Before
// the pool dropped such connections, every later write failed too.
func TestPoolDropsConnectionToDemotedServer(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, freshDB(t)+"&pool_max_conns=1")
	_, err := db.Pool.Exec(ctx, "CREATE TABLE demoted (n int)")
	require.NoError(t, err)

	c, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	pid := c.Conn().PgConn().PID()
	_, err = c.Exec(ctx, "SET SESSION default_transaction_read_only = on")
	require.NoError(t, err)
	c.Release()

	_, err = db.Pool.Exec(ctx, "INSERT INTO demoted VALUES (1)")
	var pe *pgconn.PgError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "25006", pe.Code)
	require.True(t, services.IsUnavailable(err), "a write refused by a standby must be answered store_unavailable")

	// Through GORM as well as straight on the pool: both borrow from the same pool.
	require.NoError(t, db.WithContext(ctx).Exec("INSERT INTO demoted VALUES (2)").Error)
	c, err = db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer c.Release()
	require.NotEqual(t, pid, c.Conn().PgConn().PID(), "the read-only connection was kept")
	var n int
	require.NoError(t, c.QueryRow(ctx, "SELECT count(*) FROM demoted").Scan(&n))
	require.Equal(t, 1, n)
}

// TestURLConnectTimeoutWins: a connect_timeout in DATABASE_URL bounds each host's connection
// attempt even when the caller passes a ConnectTimeout (serve passes IDEMGATE_STORE_TIMEOUT):
// with several hosts, pgx tries them in turn within it, so an operator's short value keeps a
// host that drops packets from costing the whole store timeout of every new connection.
// Before, the caller's value replaced the URL's.
func TestURLConnectTimeoutWins(t *testing.T) {
	ctx := context.Background()
	dbURL := freshDB(t)
	db, err := models.Open(ctx, models.OpenOptions{DatabaseURL: dbURL + "&connect_timeout=2", ConnectTimeout: 7 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	require.Equal(t, 2*time.Second, db.Pool.Config().ConnConfig.ConnectTimeout)
	db2, err := models.Open(ctx, models.OpenOptions{DatabaseURL: dbURL, ConnectTimeout: 7 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db2.Close() })
	require.Equal(t, 7*time.Second, db2.Pool.Config().ConnConfig.ConnectTimeout, "without one in the URL, the caller's")
}
