package models_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"
)

// TestUncertainAtBackfill: migration 00004 gives every operation that is (or was) uncertain an
// uncertain_at, from the first event that made it uncertain, else its outcome time, else the
// end of its hold; operations never uncertain get none. Rows are written at version 2, before
// the column exists, then the migration runs.
func TestUncertainAtBackfill(t *testing.T) {
	ctx := context.Background()
	pgURL, drop, err := modeltest.CreatePostgres()
	require.NoError(t, err)
	t.Cleanup(drop)
	for _, opts := range []models.OpenOptions{{DatabaseURL: pgURL}, {SQLitePath: filepath.Join(t.TempDir(), "b.db")}} {
		db, err := models.Open(ctx, opts)
		require.NoError(t, err)
		t.Run(string(db.Dialect), func(t *testing.T) {
			defer db.Close()
			sqlDB, err := db.SQL()
			require.NoError(t, err)
			gd := goose.DialectSQLite3
			if db.Dialect == models.Postgres {
				gd = goose.DialectPostgres
			}
			p, err := goose.NewProvider(gd, sqlDB, os.DirFS(filepath.Join("migrations", string(db.Dialect))),
				goose.WithDisableGlobalRegistry(true), goose.WithAllowOutofOrder(true))
			require.NoError(t, err)
			_, err = p.UpTo(ctx, 2)
			require.NoError(t, err)

			base := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
			op := func(key, state string, outcomeAt *time.Time) string {
				id := uuid.NewString()
				require.NoError(t, db.Exec(`INSERT INTO operations (id, tenant_id, key, state, fencing_token, owner_token_hash,
					acquired_at, expires_at, outcome_at) VALUES (?, 1, ?, ?, 1, 'h', ?, ?, ?)`,
					id, key, state, base, base.Add(time.Minute), outcomeAt).Error)
				return id
			}
			event := func(id, detail string, at time.Time) {
				require.NoError(t, db.Exec(`INSERT INTO events (operation_id, tenant_id, kind, actor, detail, created_at)
					VALUES (?, 1, 'state_changed', 'system', ?, ?)`, id, detail, at).Error)
			}
			reaped := op("reaped", "uncertain", nil)
			event(reaped, "in_progress -> uncertain: ttl_expired_without_outcome", base.Add(2*time.Minute))
			outcome := base.Add(3 * time.Minute)
			reported := op("reported", "uncertain", &outcome)
			bare := op("bare", "uncertain", nil)
			reconciled := op("reconciled", "succeeded", &outcome)
			event(reconciled, "in_progress -> uncertain: ttl_expired_without_outcome", base.Add(90*time.Second))
			event(reconciled, "uncertain -> succeeded: outcome succeeded", outcome)
			never := op("never", "succeeded", &outcome)

			_, err = p.Up(ctx)
			require.NoError(t, err)
			want := map[string]*time.Time{
				reaped: ptrTime(base.Add(2 * time.Minute)), reported: &outcome, bare: ptrTime(base.Add(time.Minute)),
				reconciled: ptrTime(base.Add(90 * time.Second)), never: nil,
			}
			for id, w := range want {
				var m models.Operation
				require.NoError(t, db.Where("id = ?", id).Take(&m).Error)
				if w == nil {
					require.Nil(t, m.UncertainAt, m.Key)
					continue
				}
				require.NotNil(t, m.UncertainAt, m.Key)
				require.True(t, w.Equal(*m.UncertainAt), "%s: %v, want %v", m.Key, m.UncertainAt, w)
			}
		})
	}
}

func ptrTime(t time.Time) *time.Time { return &t }
