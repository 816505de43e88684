package models_test

import (
	"context"
	"testing"

	"github.com/idemgate/idemgate/models"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// The baseline migration's jit = off: sessions opened on a migrated database run without JIT
// compilation, which stale statistics made idemgate's short statements pay 25-340 ms for
// (make scale).
func TestMigratedDatabaseHasJITOff(t *testing.T) {
	ctx := context.Background()
	dbURL := freshDB(t)
	db := openDB(t, dbURL)
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	var before string
	require.NoError(t, conn.QueryRow(ctx, "SHOW jit").Scan(&before))
	require.NoError(t, conn.Close(ctx))
	require.Equal(t, "on", before, "PostgreSQL's default, before the migration")

	_, err = models.Migrate(ctx, db, nil)
	require.NoError(t, err)
	conn, err = pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var after string
	require.NoError(t, conn.QueryRow(ctx, "SHOW jit").Scan(&after))
	require.Equal(t, "off", after)
}
