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

// TestOperationsKeyID guards migration 00013 on both dialects. Rows are written at version 12
// the way the previous release wrote them (no key_id), including an operation whose key row
// is missing; after the migration every operation names its own key row (the missing one made,
// holding nothing, with the newest token), a second operation of one key generation is refused,
// and an INSERT that leaves key_id out (the previous release during a rolling upgrade, and
// idemgate_acquire's takeover on PostgreSQL) gets it from the key row. Down gives back the
// previous schema, where the old binary's insert works, and Up again backfills what it wrote.
func TestOperationsKeyID(t *testing.T) {
	ctx := context.Background()
	pgURL, drop, err := modeltest.CreatePostgres()
	require.NoError(t, err)
	t.Cleanup(drop)
	for _, opts := range []models.OpenOptions{{DatabaseURL: pgURL}, {SQLitePath: filepath.Join(t.TempDir(), "k.db")}} {
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
				goose.WithDisableGlobalRegistry(true))
			require.NoError(t, err)
			_, err = p.UpTo(ctx, 12)
			require.NoError(t, err)

			base := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
			keyRow := func(tenant int64, key string, token int64, last string) int64 {
				require.NoError(t, db.Exec(`INSERT INTO idem_keys (tenant_id, key, fencing_token, last_operation_id, acquired_at)
					VALUES (?, ?, ?, ?, ?)`, tenant, key, token, last, base).Error)
				var id int64
				require.NoError(t, db.Raw(`SELECT id FROM idem_keys WHERE tenant_id = ? AND key = ?`, tenant, key).Scan(&id).Error)
				return id
			}
			// The previous release's INSERT: no key_id.
			oldInsert := func(tenant int64, key string, token int64) (string, error) {
				id := uuid.NewString()
				return id, db.Exec(`INSERT INTO operations (id, tenant_id, key, state, fencing_token, owner_token_hash,
					acquired_at, expires_at) VALUES (?, ?, ?, 'succeeded', ?, 'h', ?, ?)`,
					id, tenant, key, token, base, base.Add(time.Minute)).Error
			}
			mustOld := func(tenant int64, key string, token int64) string {
				id, err := oldInsert(tenant, key, token)
				require.NoError(t, err)
				return id
			}
			a1, a2 := mustOld(1, "a", 1), mustOld(1, "a", 2)
			keyA := keyRow(1, "a", 2, a2)
			// The same key name in another tenant is another key.
			b1 := mustOld(2, "a", 1)
			keyB := keyRow(2, "a", 1, b1)
			// No key row: made by the migration.
			o1, o3 := mustOld(1, "orphan", 1), mustOld(1, "orphan", 3)

			_, err = p.UpTo(ctx, 13)
			require.NoError(t, err)
			keyIDOf := func(op string) int64 {
				var k *int64
				require.NoError(t, db.Raw(`SELECT key_id FROM operations WHERE id = ?`, op).Scan(&k).Error)
				require.NotNil(t, k, "operation %s has no key_id", op)
				return *k
			}
			require.Equal(t, keyA, keyIDOf(a1))
			require.Equal(t, keyA, keyIDOf(a2))
			require.Equal(t, keyB, keyIDOf(b1))
			var orphan models.IdemKey
			require.NoError(t, db.Where("tenant_id = 1 AND key = 'orphan'").Take(&orphan).Error)
			require.Equal(t, int64(3), orphan.FencingToken)
			require.Equal(t, o3, orphan.LastOperationID)
			require.Nil(t, orphan.HolderOperationID)
			require.Equal(t, orphan.ID, keyIDOf(o1))
			require.Equal(t, orphan.ID, keyIDOf(o3))

			// A rolling upgrade: the previous release's insert still works and is keyed.
			a3 := mustOld(1, "a", 3)
			require.Equal(t, keyA, keyIDOf(a3))
			// A model written without KeyID leaves it to the database too.
			m := models.Operation{ID: uuid.NewString(), TenantID: 2, Key: "a", State: "succeeded", FencingToken: 2,
				OwnerTokenHash: "h", AcquiredAt: base, ExpiresAt: base.Add(time.Minute)}
			require.NoError(t, db.Create(&m).Error)
			require.Equal(t, keyB, keyIDOf(m.ID))
			// One operation per key generation.
			_, err = oldInsert(1, "a", 3)
			require.Error(t, err, "a second operation with key a's fencing token 3 was stored")
			if db.Dialect == models.Postgres {
				// An operation without a key row is refused rather than stored unkeyed (SQLite's
				// column is nullable; its store always names key_id).
				_, err = oldInsert(1, "no-key-row", 1)
				require.ErrorContains(t, err, "key_id")
			}
			var gens int64
			require.NoError(t, db.Raw(`SELECT count(*) FROM operations WHERE key_id = ?`, keyA).Scan(&gens).Error)
			require.Equal(t, int64(3), gens)

			_, err = p.DownTo(ctx, 12)
			require.NoError(t, err)
			var cols int64
			require.NoError(t, db.Raw(map[models.Dialect]string{
				models.Postgres: `SELECT count(*) FROM information_schema.columns WHERE table_name = 'operations' AND column_name = 'key_id'`,
				models.SQLite:   `SELECT count(*) FROM pragma_table_info('operations') WHERE name = 'key_id'`,
			}[db.Dialect]).Scan(&cols).Error)
			require.Zero(t, cols, "Down left operations.key_id")
			a4 := mustOld(1, "a", 4)
			_, err = oldInsert(1, "a", 4)
			require.Error(t, err, "Down dropped the one-operation-per-generation constraint")
			_, err = p.Up(ctx)
			require.NoError(t, err)
			require.Equal(t, keyA, keyIDOf(a4))
		})
	}
}
