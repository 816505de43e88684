package models_test

import (
	"context"
	"testing"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/stretchr/testify/require"
)

// TestTombstoneBytes measures what a tombstone adds to its key row on PostgreSQL, indexes
// included (docs/reference.md §2 "Lifecycle"; issue 30 asks for at most 128 bytes): 20,000 key
// rows as a purge leaves them, their table and indexes rewritten (VACUUM FULL) before and
// after the tombstone columns are filled with a typical success (a 27-character receipt).
// Sizes of rewritten tables are deterministic for one PostgreSQL version, so this is a size
// check, not a timing.
func TestTombstoneBytes(t *testing.T) {
	dbURL, drop, err := modeltest.CreatePostgres()
	require.NoError(t, err)
	t.Cleanup(drop)
	ctx := context.Background()
	db, err := models.Open(ctx, models.OpenOptions{DatabaseURL: dbURL, MaxConns: 2})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	_, err = models.Migrate(ctx, db, nil)
	require.NoError(t, err)
	const n = 20000
	require.NoError(t, db.Exec("INSERT INTO tenants (name) VALUES ('sizes')").Error)
	require.NoError(t, db.Exec(`INSERT INTO idem_keys (tenant_id, key, fencing_token, last_operation_id, acquired_at)
SELECT (SELECT id FROM tenants WHERE name = 'sizes'), 'order:' || lpad(g::text, 10, '0'), 1, gen_random_uuid(),
       now() - g * interval '1 second' FROM generate_series(1, ?) g`, n).Error)
	size := func() (table, total int64) {
		require.NoError(t, db.Exec("VACUUM FULL idem_keys").Error)
		require.NoError(t, db.Raw("SELECT pg_relation_size('idem_keys'), pg_total_relation_size('idem_keys')").Row().Scan(&table, &total))
		return table, total
	}
	table0, total0 := size()
	require.NoError(t, db.Exec(`UPDATE idem_keys SET protected_until = now() + interval '400 days', protected_by = last_operation_id,
  tomb_fencing_token = fencing_token, tomb_state = 'succeeded',
  tomb_outcome_status = 'succeeded', tomb_outcome_receipt = 'ch_3MqB9x2eZvKYlo2C1a2b3c4d',
  tomb_request_hash = idemgate_request_hash('charge', md5(key))`).Error)
	table1, total1 := size()
	perTomb := float64(total1-total0) / n
	t.Logf("PostgreSQL, %d keys: key rows with their indexes %.0f bytes per key before, %.0f with a tombstone: "+
		"%.1f bytes per tombstone (table %.1f, indexes %.1f)", n, float64(total0)/n, float64(total1)/n, perTomb,
		float64(table1-table0)/n, float64((total1-table1)-(total0-table0))/n)
	require.LessOrEqual(t, perTomb, 128.0, "bytes per tombstone")
}
