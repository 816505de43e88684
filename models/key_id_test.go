package models_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/stretchr/testify/require"
)

// TestOperationsKeyID guards the operations_key_id trigger (models/sql/*/operations_key_id.sql)
// on both dialects: an INSERT that leaves key_id out (idemgate_acquire's takeover on
// PostgreSQL, and an instance of the previous release during a rolling upgrade) gets it from
// the key row, a second operation of one key generation is refused, and on PostgreSQL an
// operation without a key row is refused rather than stored unkeyed.
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
			_, err := models.Migrate(ctx, db, nil)
			require.NoError(t, err)

			base := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
			keyRow := func(tenant int64, key string, token int64, last string) int64 {
				require.NoError(t, db.Exec(`INSERT INTO idem_keys (tenant_id, key, fencing_token, last_operation_id, acquired_at)
					VALUES (?, ?, ?, ?, ?)`, tenant, key, token, last, base).Error)
				var id int64
				require.NoError(t, db.Raw(`SELECT id FROM idem_keys WHERE tenant_id = ? AND key = ?`, tenant, key).Scan(&id).Error)
				return id
			}
			// An INSERT that does not name key_id.
			unkeyed := func(tenant int64, key string, token int64) (string, error) {
				id := uuid.NewString()
				return id, db.Exec(`INSERT INTO operations (id, tenant_id, key, state, fencing_token, owner_token_hash,
					acquired_at, expires_at) VALUES (?, ?, ?, 'succeeded', ?, 'h', ?, ?)`,
					id, tenant, key, token, base, base.Add(time.Minute)).Error
			}
			keyIDOf := func(op string) int64 {
				var k *int64
				require.NoError(t, db.Raw(`SELECT key_id FROM operations WHERE id = ?`, op).Scan(&k).Error)
				require.NotNil(t, k, "operation %s has no key_id", op)
				return *k
			}
			keyA := keyRow(1, "a", 2, uuid.NewString())
			// The same key name in another tenant is another key.
			keyB := keyRow(2, "a", 1, uuid.NewString())
			a1, err := unkeyed(1, "a", 1)
			require.NoError(t, err)
			a2, err := unkeyed(1, "a", 2)
			require.NoError(t, err)
			require.Equal(t, keyA, keyIDOf(a1))
			require.Equal(t, keyA, keyIDOf(a2))
			// A model written without KeyID leaves it to the database too.
			m := models.Operation{ID: uuid.NewString(), TenantID: 2, Key: "a", State: "succeeded", FencingToken: 2,
				OwnerTokenHash: "h", AcquiredAt: base, ExpiresAt: base.Add(time.Minute)}
			require.NoError(t, db.Create(&m).Error)
			require.Equal(t, keyB, keyIDOf(m.ID))
			// One operation per key generation.
			_, err = unkeyed(1, "a", 2)
			require.Error(t, err, "a second operation with key a's fencing token 2 was stored")
			if db.Dialect == models.Postgres {
				// SQLite's column is nullable; its store always names key_id.
				_, err = unkeyed(1, "no-key-row", 1)
				require.ErrorContains(t, err, "key_id")
			}
			var gens int64
			require.NoError(t, db.Raw(`SELECT count(*) FROM operations WHERE key_id = ?`, keyA).Scan(&gens).Error)
			require.Equal(t, int64(2), gens)
		})
	}
}
