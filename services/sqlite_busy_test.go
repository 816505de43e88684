package services

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/stretchr/testify/require"
)

// TestSQLiteLockedAnswersStoreUnavailable: while another process holds SQLite's write lock, an
// acquire waits at most the store timeout (busy_timeout follows it) and is answered
// store_unavailable (503, retry), never internal (500: a client would not retry it), and it
// writes nothing.
func TestSQLiteLockedAnswersStoreUnavailable(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "busy.db")
	db, err := models.Open(ctx, models.OpenOptions{SQLitePath: path, StoreTimeout: 300 * time.Millisecond})
	require.NoError(t, err)
	defer db.Close()
	_, err = models.Migrate(ctx, db, nil)
	require.NoError(t, err)
	p := Principal{TenantID: modeltest.Tenant(t, db), Prefix: "idg_testtest"}
	adm := NewAdmission(db, slog.New(slog.NewTextHandler(io.Discard, nil)), 0)

	other, err := models.Open(ctx, models.OpenOptions{SQLitePath: path})
	require.NoError(t, err)
	defer other.Close()
	sqlDB, err := other.SQL()
	require.NoError(t, err)
	holder, err := sqlDB.Conn(ctx)
	require.NoError(t, err)
	defer holder.Close()
	_, err = holder.ExecContext(ctx, "BEGIN IMMEDIATE")
	require.NoError(t, err)

	key := "busy-key"
	_, err = adm.Acquire(ctx, p, AcquireInput{Key: key, TTLSeconds: 60})
	require.Error(t, err)
	require.True(t, isCode(err, CodeStoreUnavailable), "a locked database must be store_unavailable: %v", err)

	_, err = holder.ExecContext(ctx, "ROLLBACK")
	require.NoError(t, err)
	acq, err := adm.Acquire(ctx, p, AcquireInput{Key: key, TTLSeconds: 60})
	require.NoError(t, err)
	require.True(t, acq.Admitted, "the refused acquire wrote nothing")
	require.EqualValues(t, 1, acq.FencingToken)
}
